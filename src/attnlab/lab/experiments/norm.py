"""Experiment ``norm``: pre-norm vs post-norm (000 "Add & Norm"; Xiong et al. 2020).

    pre-norm   h = f(LN(h)) + h        post-norm   h = LN(f(h) + h)

000: "the gradients of pre-normalization are much better at initialization, leading to much
faster training [Xiong et al., 2020]". Xiong et al. (On Layer Normalization in the Transformer
Architecture, 2020) show that at initialisation (Xavier) the post-norm gradients near the output
are large and grow with the layer index while pre-norm's stay about the same, which is why
post-norm needs a learning-rate warm-up. Two measurements on decoder-only character LMs built
with ``ModelConfig(norm_placement=...)`` (post-norm without the extra final norm, as in Vaswani):

(a) gradient norms per layer at initialisation of a 12-layer model on one batch, for three
    initialisations: Xavier-uniform linear layers with N(0, 1/D) embeddings (Xiong et al.'s
    setting, the one the verdict reads), the library's GPT-2 style init (N(0, 0.02), residual
    projections scaled by 1/sqrt(2L)), and the library init with N(0, 1) embeddings (a control:
    the first LayerNorm then no longer rescales tiny embeddings). The feed-forward W1's gradient
    (the quantity Xiong et al. plot in Fig. 3) and the whole block's, per seed;
(b) training the 12-layer model (Xavier init), without gradient clipping (clipping would hide
    the instability), in four arms: pre/post-norm x warm-up 0 / a linear warm-up. Every arm is
    gated alike (:mod:`attnlab.lab.kit.gating`): a learning-rate sweep whose choice is bracketed
    and a step doubling of the validation loss; post-norm without warm-up (the arm whose failure
    Xiong et al. predict) gets the same. "Steps to target" = the first step whose running-mean
    training loss is below :data:`TARGET`.

Shapes: B batch, T length, D d_model, L layers.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import curves_chart, save_chart, seeds_chart
from attnlab.lab.kit.corpus import (
    LEARNED_FREQUENCIES,
    UNIGRAM_MARGIN,
    char_lm_config,
    text_windows,
    unigram_bigram,
)
from attnlab.lab.kit.fit import FitConfig, block_grad_norms, eval_loss, fit, lm_loss
from attnlab.lab.kit.gating import Gated, Sweep, gate_arms, sweep_rows
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import resolved, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, outcome
from attnlab.models import build_model

PLACEMENTS = ("pre", "post")
INITS = ("xavier", "library", "library, N(0, 1) embeddings")
PRIMARY = "xavier"  # Xiong et al.'s initialisation: the one the verdict reads
TARGET = 2.5  # nats per character: the time-to-target loss (a bigram model sits near 2.5)
SWEEP = Sweep(
    grid=(1e-3, 3e-3, 1e-2),
    tolerance=0.05,
    metric="validation loss (nats/char)",
    metric_key="val",
    factor=3.0,
    max_extensions=1,
)
QUICK_SWEEP = SWEEP.quick(grid=(1e-3, 3e-3))
COST = (
    "Full run: `attnlab experiment norm --seed 0 --data ../shared/data`. Estimate for 2 idle "
    "cores, from a single-thread probe of the training step (27 Nov 2026: 224 ms per step, 12 "
    "layers, context 64): each of the 4 arms trains 3 sweep rates and 2 more seeds at 800 "
    "steps and a doubling of 1600 steps on the first seed (5600 steps), ~84 min of CPU: about "
    "42 min on both cores, up to ~48 min when sweeps extend their grids (one rate per arm)."
)
CLAIM = (
    "It turns out that the gradients of pre-normalization are much better at initialization, "
    "leading to much faster training [Xiong et al., 2020]."
)
XIONG = "Xiong et al. 2020, 'On Layer Normalization in the Transformer Architecture'"
THRESHOLDS = [
    Threshold(
        "post-norm |grad W1| at initialisation grows with the layer index",
        "top layer above the bottom layer on every seed ('for the Post-LN Transformer, the "
        "scale of the gradient norm ... increases as the layer index increases')",
        f"{XIONG}, Sec. 3.3 and Fig. 3",
    ),
    Threshold(
        "the top layer's |grad W1| at initialisation, post-norm over pre-norm",
        "> 1 on every seed (Theorem 1: O(d sqrt(ln d)) for Post-LN against O(d sqrt(ln d / L)) "
        "for Pre-LN at the last layer, a ratio of order sqrt(L))",
        f"{XIONG}, Theorem 1",
    ),
    Threshold(
        "pre-norm trains without warm-up",
        f"every seed reaches {TARGET} nats/char ('the learning rate warm-up stage can be "
        "safely removed' for Pre-LN; the target is the lab's, near the bigram baseline)",
        f"{XIONG}, abstract and Sec. 4",
    ),
    Threshold(
        "much faster training",
        "pre-norm's steps to the target (its better warm-up arm) below post-norm's (its better "
        "arm), seed ranges apart",
        "000 'Add & Norm'",
    ),
]


def lm_config(placement: str, n_layers: int, vocab: int, context: int) -> ModelConfig:
    return char_lm_config(
        vocab, context, n_layers, norm_placement=placement, final_norm=placement == "pre"
    )


def initialise(model: Any, init: str) -> None:
    """Re-draw the weights: ``xavier`` = Xavier-uniform linear weights, zero biases, N(0, 1/D)
    token and position tables (Xiong et al.); ``library`` keeps the build's init; ``library,
    N(0, 1) embeddings`` re-draws only the two tables from N(0, 1)."""
    if init == "library":
        return
    d = model.embed.tok_emb.weight.size(1)
    std = 1.0 if init.startswith("library") else d**-0.5
    with torch.no_grad():
        model.embed.tok_emb.weight.normal_(0.0, std)
        model.embed.pos_enc.table.weight.normal_(0.0, std)
        if init == "xavier":
            for module in model.modules():
                if (
                    isinstance(module, nn.Linear)
                    and module.weight is not model.embed.tok_emb.weight
                ):
                    nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        module.bias.zero_()


def layer_gradient_norms(
    placement: str, init: str, n_layers: int, batch: torch.Tensor, vocab: int, seed: int
) -> tuple[list[float], list[float]]:
    """Per block: ||grad|| of all its parameters, and of its feed-forward W1, at init."""
    torch.manual_seed(seed)
    model: Any = build_model(lm_config(placement, n_layers, vocab, batch.size(1)))
    initialise(model, init)
    blocks = block_grad_norms(model, batch)
    return blocks, [float(block.ffn.up.weight.grad.norm()) for block in model.blocks]


def steps_to(losses: list[float], target: float, window: int = 10) -> float:
    """The first step whose running mean of ``window`` losses is <= target (inf if never)."""
    for i in range(len(losses)):
        part = losses[max(0, i - window + 1) : i + 1]
        if sum(part) / len(part) <= target:
            return float(i + 1)
    return math.inf


def depth(quick: bool) -> int:
    return 4 if quick else 12


def context(quick: bool) -> int:
    return 32 if quick else 64


def train_steps(quick: bool) -> int:
    return 20 if quick else 800


def warmups(quick: bool) -> tuple[int, int]:
    """Warm-up 0 and a linear warm-up of 1/8 of the steps (stretched with them when doubled)."""
    return 0, train_steps(quick) // 8


def train_job(job: tuple) -> dict[str, Any]:
    """One (placement, warm-up) arm at a learning rate, ``scale`` x the steps (gating's job)."""
    (placement, warmup), lr, scale, seed, quick, data = job
    train, val, chars, _ = text_windows(quick, context(quick), data)
    torch.manual_seed(seed)
    model = build_model(lm_config(placement, depth(quick), len(chars), context(quick)))
    initialise(model, "xavier")
    cfg = FitConfig(
        steps=train_steps(quick) * scale,
        batch_size=32,
        lr=lr,
        warmup_steps=warmup * scale,
        grad_clip=0.0,
    )
    result = fit(model, (train,), lm_loss, cfg, seed=seed)
    return {
        "losses": result.losses,
        "final": result.final_loss(),
        "val": math.inf if result.diverged else eval_loss(model, (val[:256],), lm_loss),
        "diverged": result.diverged,
        "steps to target": steps_to(result.losses, TARGET),
        "max |grad|": max(result.grad_norms, default=math.nan),
    }


def measure_gradients(
    train: torch.Tensor, vocab: int, seeds: list[int], quick: bool
) -> dict[str, Any]:
    """(a): per (init, placement), per seed, per layer: |grad block| and |grad W1| at init."""
    out: dict[str, Any] = {"block": {}, "w1": {}}
    for init in INITS:
        for p in PLACEMENTS:
            key = f"{init}, {p}"
            out["block"][key], out["w1"][key] = [], []
            for s in seeds:
                pick = torch.randperm(len(train), generator=torch.Generator().manual_seed(s))
                blocks, w1 = layer_gradient_norms(p, init, depth(quick), train[pick[:32]], vocab, s)
                out["block"][key].append(blocks)
                out["w1"][key].append(w1)
    return out


def measure(quick: bool, seed: int, data: Path | None) -> dict[str, Any]:
    """Every measurement as plain numbers: gradients at init, the gated training arms."""
    seeds = start_seeds(seed, quick)
    train, val, chars, source = text_windows(quick, context(quick), data)
    uni, bi = unigram_bigram(train, val, len(chars))
    arms = [(p, w) for p in PLACEMENTS for w in warmups(quick)]
    sweep = QUICK_SWEEP if quick else SWEEP
    gated = gate_arms(train_job, arms, sweep, seeds, quick, data)
    return {
        "seeds": seeds,
        "source": source,
        "vocab": len(chars),
        "windows": len(train),
        "unigram": uni,
        "bigram": bi,
        "steps": train_steps(quick),
        "warmups": list(warmups(quick)),
        "gradients": measure_gradients(train, len(chars), seeds, quick),
        "gated": {arm_label(arm): asdict(g) for arm, g in gated.items()},
    }


def arm_label(arm: Any) -> str:
    return f"{arm[0]}-norm, warm-up {arm[1]}"


def write_up(measured: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """Tables, figures, gate and verdict from :func:`measure`'s numbers."""
    m = measured
    sweep = QUICK_SWEEP if quick else SWEEP
    gated = {k: Gated(**v) for k, v in m["gated"].items()}
    checks, reason = _verdict(m, gated)
    competence = [_competence(k, g, sweep, m) for k, g in gated.items()]
    return Report(
        name="norm",
        title="Pre-norm vs post-norm: gradients at initialisation and warm-up",
        claim=CLAIM,
        source="000, 'Add & Norm'",
        setup=_setup(m, sweep, quick),
        thresholds=THRESHOLDS,
        tables=_tables(m, gated),
        figures=_figures(m, gated, out_dir),
        **outcome(checks, reason, competence, m["seeds"], quick, arms=list(gated)),
        per_seed={
            "w1_top": {k: [s[-1] for s in v] for k, v in m["gradients"]["w1"].items()},
            "w1_bottom": {k: [s[0] for s in v] for k, v in m["gradients"]["w1"].items()},
            "steps_to_target": {k: g.values("steps to target") for k, g in gated.items()},
        },
        metrics=_metrics(m, gated),
        findings=_findings(m),
    )


def _competence(label: str, g: Gated, sweep: Sweep, m: dict[str, Any]) -> Competence:
    threshold = m["unigram"] + UNIGRAM_MARGIN
    return g.competence(label, LEARNED_FREQUENCIES, threshold, sweep, m["steps"], "val", False)


def _w1(m: dict[str, Any], p: str, layer: int, init: str = PRIMARY) -> list[float]:
    """|grad W1| of one layer (0 = bottom, -1 = top) at init, per seed."""
    return [s[layer] for s in m["gradients"]["w1"][f"{init}, {p}"]]


def _fastest(m: dict[str, Any], gated: dict[str, Gated], p: str) -> list[float]:
    """Steps to the target per seed of the placement's warm-up arm with the lower mean."""
    runs = [gated[arm_label((p, w))].values("steps to target") for w in m["warmups"]]
    return min(runs, key=lambda r: float(np.mean(r)))


def _verdict(m: dict[str, Any], gated: dict[str, Gated]) -> tuple[list[bool], str]:
    post_top, post_bottom = _w1(m, "post", -1), _w1(m, "post", 0)
    pre_top = _w1(m, "pre", -1)
    grows = all(t > b for t, b in zip(post_top, post_bottom))
    top_larger = all(a > b for a, b in zip(post_top, pre_top))
    pre_cold = gated[arm_label(("pre", 0))].values("steps to target")
    no_warmup = all(math.isfinite(s) for s in pre_cold)
    fast = {p: _fastest(m, gated, p) for p in PLACEMENTS}
    faster = max(fast["pre"]) < min(fast["post"]) and resolved(fast["pre"], fast["post"])
    post_cold = gated[arm_label(("post", 0))].values("steps to target")
    reason = (
        f"at initialisation (Xavier, {len(m['gradients']['w1'][f'{PRIMARY}, pre'][0])} layers) "
        f"post-norm's |grad W1| is {spread_text(post_bottom)} at layer 1 and "
        f"{spread_text(post_top)} at the top layer; pre-norm's top layer "
        f"{spread_text(pre_top)} (mean (min-max) over {len(m['seeds'])} seed(s)); steps to "
        f"{TARGET} nats/char without warm-up: pre {spread_text(pre_cold)}, post "
        f"{spread_text(post_cold)} (inf: never); fastest arm per placement: pre "
        f"{spread_text(fast['pre'])}, post {spread_text(fast['post'])}."
    )
    return [grows, top_larger, no_warmup, faster], reason


def _tables(m: dict[str, Any], gated: dict[str, Gated]) -> list[Table]:
    n = len(m["gradients"]["w1"][f"{PRIMARY}, pre"][0])
    grad_rows = [
        {
            "init": init,
            "norm": p,
            "layer 1 |grad W1|": spread_text(_w1(m, p, 0, init)),
            f"layer {n} |grad W1|": spread_text(_w1(m, p, -1, init)),
            "layer 1 |grad block|": spread_text([s[0] for s in grads]),
            f"layer {n} |grad block|": spread_text([s[-1] for s in grads]),
        }
        for init in INITS
        for p in PLACEMENTS
        for grads in [m["gradients"]["block"][f"{init}, {p}"]]
    ]
    rows = [
        {
            "arm": k,
            "lr": g.chosen,
            "val loss": spread_text(g.values("val")),
            "final train loss": spread_text(g.values("final")),
            "steps to target": spread_text(g.values("steps to target")),
            "reached (seeds)": sum(math.isfinite(s) for s in g.values("steps to target")),
            "diverged (seeds)": sum(g.values("diverged")),
        }
        for k, g in gated.items()
    ]
    return [
        Table("(a) gradients at initialisation (mean (min-max) over seeds)", grad_rows),
        Table("(b) training with and without warm-up, each arm at its chosen rate", rows),
        Table("learning-rate sweep (first seed)", sweep_rows(gated, str)),
    ]


def _figures(m: dict[str, Any], gated: dict[str, Gated], out_dir: Path) -> list[FigureRef]:
    n = len(m["gradients"]["w1"][f"{PRIMARY}, pre"][0])
    layers = list(range(1, n + 1))
    grad_fig = seeds_chart(
        {
            f"{p}-norm, {i}": (layers, m["gradients"]["w1"][f"{i}, {p}"])
            for i in ("xavier", "library")
            for p in PLACEMENTS
        },
        xlabel="layer (1 = bottom)",
        ylabel="|grad W1| of the feed-forward",
        title=f"gradients at initialisation, {n} layers ({len(m['seeds'])} seed(s))",
        logy=True,
    )
    grad_fig.axes[0].set_xticks(layers)
    return [
        save_chart(
            grad_fig,
            out_dir,
            "gradients.png",
            "Gradient norm of each layer's feed-forward W1 at initialisation (one batch per "
            "seed, log scale; Xiong et al.'s Fig. 3 quantity), Xavier and library init: mean "
            "over seeds with the min-max band.",
        ),
        save_chart(
            curves_chart(
                {f"{k}, lr {g.chosen:g}": g.values("losses") for k, g in gated.items()},
                title="training loss, every arm at its chosen rate",
                logy=True,
            ),
            out_dir,
            "training.png",
            "Training loss of the four arms (pre/post-norm, with and without warm-up), each at "
            "the learning rate its sweep chose, post-norm's best setting among them (mean over "
            "seeds, min-max band).",
        ),
    ]


def _setup(m: dict[str, Any], sweep: Sweep, quick: bool) -> list[str]:
    n, n_layers = m["steps"], depth(quick)
    lines = [
        f"Character LM on {m['source']} ({m['windows']} training windows of "
        f"{context(quick) + 1} characters, vocabulary {m['vocab']}); {n_layers} layers, d_model "
        "64, 4 heads, d_ff 256, learned positions. Post-norm has no final norm (Vaswani), "
        "pre-norm has one.",
        "(a) one batch of 32 windows per seed; inits: 'xavier' = Xavier-uniform linear layers, "
        "zero biases, N(0, 1/D) tables (Xiong et al., the verdict's); 'library' = N(0, 0.02) "
        "with residual projections scaled by 1/sqrt(2L); 'library, N(0, 1) embeddings' = the "
        "control.",
        f"(b) Xavier init; AdamW (0.9, 0.98), {n} steps of 32, linear warm-up of "
        f"{m['warmups']} steps then cosine to 0, no gradient clipping; target {TARGET} "
        "nats/char (running mean of 10 training steps); two single-threaded runs at a time.",
        sweep.describe(f"{n} steps"),
    ]
    return lines if quick else [*lines, COST]


def _metrics(m: dict[str, Any], gated: dict[str, Gated]) -> dict[str, Any]:
    return {
        "w1_top": {p: float(np.mean(_w1(m, p, -1))) for p in PLACEMENTS},
        "w1_bottom": {p: float(np.mean(_w1(m, p, 0))) for p in PLACEMENTS},
        "block_ratio_library": {
            p: float(np.mean([max(s) / min(s) for s in m["gradients"]["block"][f"library, {p}"]]))
            for p in PLACEMENTS
        },
        "chosen_lr": {k: g.chosen for k, g in gated.items()},
        "unigram": m["unigram"],
        "bigram": m["bigram"],
    }


def _findings(m: dict[str, Any]) -> list[str]:
    block = m["gradients"]["block"]
    ratio = {k: spread_text([max(s) / min(s) for s in v]) for k, v in block.items()}
    return [
        "Largest/smallest block-gradient norm over layers at init (a spread, not what Xiong "
        "et al. state; reported for comparison with earlier runs): "
        + "; ".join(f"{k} {v}" for k, v in ratio.items())
        + ".",
        "Under the library init the post-norm imbalance sits at layer 1 (the first LayerNorm "
        "rescales the 0.02-std embeddings); the N(0, 1)-embedding control removes it.",
    ]


@experiment("norm", notes="000 'Add & Norm'; Xiong et al. 2020")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Pre-norm (h = f(LN(h)) + h) has much better gradients at initialisation than post-norm
    (h = LN(f(h) + h)), so it trains faster and without a learning-rate warm-up."""
    return write_up(measure(quick, seed, data), out_dir, quick)
