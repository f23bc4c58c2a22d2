"""Experiment ``norm``: pre-norm vs post-norm (000 "Add & Norm"; Xiong et al. 2020).

    pre-norm   h = f(LN(h)) + h        post-norm   h = LN(f(h) + h)

000: "the gradients of pre-normalization are much better at initialization, leading to much
faster training [Xiong et al., 2020]". Xiong et al. show that at initialisation (Xavier) the
post-norm gradients of the top layers are large, which is why post-norm needs a learning-rate
warm-up. Two measurements on decoder-only character LMs built with
``ModelConfig(norm_placement=...)`` (post-norm without the extra final norm, as in Vaswani):

(a) gradient norms per layer at initialisation of a 12-layer model on one batch, for three
    initialisations: Xavier-uniform linear layers with N(0, 1/D) embeddings (Xiong et al.'s
    setting, the primary one), the library's GPT-2 style init (N(0, 0.02), residual projections
    scaled by 1/sqrt(2L)), and the library init with N(0, 1) embeddings (a control: the first
    LayerNorm then no longer rescales tiny embeddings). The whole block's gradient, and that of
    the feed-forward W1 (the quantity Xiong et al. plot), per seed;
(b) training the 12-layer model (Xavier init) with warm-up 0 and a sweep of warm-ups over a
    sweep of peak learning rates, without gradient clipping (clipping would hide the
    instability); "time to target" = the first step whose running-mean training loss is below
    the target.

Shapes: B batch, T length, D d_model, L layers.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import curves_chart, save_chart, seeds_chart
from attnlab.lab.kit.corpus import char_ids, char_lm_config, corpus_text, windows
from attnlab.lab.kit.fit import FitConfig, block_grad_norms, fit, lm_loss
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Competence, Report, Table, outcome, spread, spread_text
from attnlab.lab.kit.seeds import bands, run_arms, start_seeds
from attnlab.models import build_model

PLACEMENTS = ("pre", "post")
INITS = ("xavier", "library", "library, N(0, 1) embeddings")
TARGET = 2.5  # nats per character: the time-to-target loss (a bigram model sits near 2.5)


def lm_config(placement: str, n_layers: int, vocab: int, context: int) -> ModelConfig:
    return char_lm_config(
        vocab, context, n_layers, norm_placement=placement, final_norm=placement == "pre"
    )


def initialise(model: nn.Module, init: str) -> None:
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


def char_data(quick: bool, seed: int, context: int) -> tuple[torch.Tensor, int, str]:
    """(windows (N, context + 1) of character ids from the first 400 000 characters, vocabulary
    size, where the text came from)."""
    text, source = corpus_text(quick, 300, seed)
    chars = sorted(set(text))
    return windows(char_ids(text[:400_000], chars), context), len(chars), source


def layer_gradient_norms(
    placement: str, init: str, n_layers: int, batch: torch.Tensor, vocab: int, seed: int
) -> tuple[list[float], list[float]]:
    """Per block: ||grad|| of all its parameters, and of its feed-forward W1, at init."""
    torch.manual_seed(seed)
    model = build_model(lm_config(placement, n_layers, vocab, batch.size(1)))
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


def train_job(job: tuple) -> dict:
    """One (placement, lr, warm-up, seed, quick) training run on one thread."""
    placement, lr, warmup, seed, quick = job
    context = 32 if quick else 64
    data, vocab, _ = char_data(quick, 0, context)
    torch.manual_seed(seed)
    model = build_model(lm_config(placement, depth(quick), vocab, context))
    initialise(model, "xavier")
    cfg = FitConfig(
        steps=train_steps(quick), batch_size=32, lr=lr, warmup_steps=warmup, grad_clip=0.0
    )
    result = fit(model, (data,), lm_loss, cfg, seed=seed)
    per_step = result.seconds / max(1, len(result.losses))
    reached = steps_to(result.losses, TARGET)
    return {
        "losses": result.losses,
        "final": result.final_loss(),
        "diverged": result.diverged,
        "steps to target": reached,
        "s to target": reached * per_step,
        "max |grad|": max(result.grad_norms, default=math.nan),
    }


def depth(quick: bool) -> int:
    return 4 if quick else 12


def train_steps(quick: bool) -> int:
    return 30 if quick else 400


@experiment("norm", notes="000 'Add & Norm'; Xiong et al. 2020")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Pre-norm (h = f(LN(h)) + h) has much better gradients at initialisation than post-norm
    (h = LN(f(h) + h)), so it trains faster and without a learning-rate warm-up."""
    seeds = start_seeds(seed, quick)
    context, n_layers = (32 if quick else 64), depth(quick)
    data, vocab, source = char_data(quick, 0, context)
    # (a) gradients at initialisation, per init and seed
    ratio: dict[tuple[str, str], list[float]] = {}
    ratio_w1: dict[tuple[str, str], list[float]] = {}
    grads: dict[tuple[str, str], list[list[float]]] = {}  # [seed][layer]
    for init in INITS:
        for p in PLACEMENTS:
            for s in seeds:
                batch = data[
                    torch.randperm(len(data), generator=torch.Generator().manual_seed(s))[:32]
                ]
                blocks, w1 = layer_gradient_norms(p, init, n_layers, batch, vocab, s)
                ratio.setdefault((init, p), []).append(max(blocks) / min(blocks))
                ratio_w1.setdefault((init, p), []).append(max(w1) / min(w1))
                grads.setdefault((init, p), []).append(list(blocks))
    ends = {  # (init, placement) -> mean over seeds of the bottom and top block's gradient
        key: (float(np.mean([g[0] for g in gs])), float(np.mean([g[-1] for g in gs])))
        for key, gs in grads.items()
    }
    grad_rows = [
        {
            "init": i,
            "norm": p,
            "max/min |grad block| over layers": spread_text(ratio[(i, p)]),
            "max/min |grad W1|": spread_text(ratio_w1[(i, p)]),
            "layer 1 |grad block|": ends[(i, p)][0],
            f"layer {n_layers} |grad block|": ends[(i, p)][1],
        }
        for i in INITS
        for p in PLACEMENTS
    ]
    # (b) training: a warm-up sweep over a learning-rate sweep, every seed
    lrs = (3e-3,) if quick else (1e-3, 3e-3)
    warmups = (0, 5) if quick else (0, 100)
    settings = [(p, lr, w) for p in PLACEMENTS for lr in lrs for w in warmups]
    per = run_arms(train_job, settings, seeds, quick)  # (p, lr, w) -> one result per seed
    rows = []
    for p in PLACEMENTS:
        for lr in lrs:
            for w in warmups:
                rs = per[(p, lr, w)]
                rows.append(
                    {
                        "norm": p,
                        "peak lr": lr,
                        "warm-up": w,
                        "final loss": spread_text([r["final"] for r in rs]),
                        "steps to target": spread_text([r["steps to target"] for r in rs]),
                        "s to target": spread_text([r["s to target"] for r in rs]),
                        "reached (seeds)": sum(math.isfinite(r["steps to target"]) for r in rs),
                        "diverged (seeds)": sum(r["diverged"] for r in rs),
                    }
                )
    best = {}  # placement -> (lr, warm-up) with the lowest mean final loss
    for p in PLACEMENTS:
        mean_final = {
            (lr, w): np.mean([r["final"] for r in per[(p, lr, w)]]) for lr in lrs for w in warmups
        }
        best[p] = min(mean_final, key=mean_final.get)
    competence = [
        Competence(
            f"{p}-norm (best: lr {best[p][0]:g}, warm-up {best[p][1]})",
            "final training loss (nats/char) of its best setting",
            TARGET,
            [r["final"] for r in per[(p, *best[p])]],
            higher_is_better=False,
        )
        for p in PLACEMENTS
    ]

    def reached(p: str, w: int) -> list[float]:
        """Peak rates at which every seed of (p, warm-up w) reaches the target."""
        return [
            lr for lr in lrs if all(math.isfinite(r["steps to target"]) for r in per[(p, lr, w)])
        ]

    prim = "xavier"
    pre_better = max(ratio[(prim, "pre")]) < min(ratio[(prim, "post")])
    no_warm = {p: reached(p, 0) for p in PLACEMENTS}
    pre_no_warmup = len(no_warm["pre"]) >= len(no_warm["post"]) and no_warm["pre"]
    fastest = {
        p: min(
            np.mean([r["steps to target"] for r in per[(p, lr, w)]]) for lr in lrs for w in warmups
        )
        for p in PLACEMENTS
    }
    pre_faster = fastest["pre"] < fastest["post"]
    checks = [pre_better, bool(pre_no_warmup), pre_faster]
    reason = (
        f"at initialisation (Xavier, {n_layers} layers) the largest/smallest block-gradient ratio "
        f"over layers is {spread_text(ratio[(prim, 'pre')])} for pre-norm and "
        f"{spread_text(ratio[(prim, 'post')])} for post-norm (mean (min-max) over seeds; "
        f"library init: {spread_text(ratio[('library', 'pre')])} vs "
        f"{spread_text(ratio[('library', 'post')])}); without warm-up every seed reaches "
        f"{TARGET} nats/char at peak lr {_lrs(no_warm['pre'])} (pre) and "
        f"{_lrs(no_warm['post'])} (post); fastest mean steps to target: pre {fastest['pre']:.0f}, "
        f"post {fastest['post']:.0f}."
    )
    layers = list(range(1, n_layers + 1))
    figures = [
        save_chart(
            seeds_chart(
                {
                    f"{p}-norm, {i}": (layers, grads[(i, p)])
                    for i in ("xavier", "library")
                    for p in PLACEMENTS
                },
                xlabel="layer (1 = bottom)",
                ylabel="gradient norm of the block",
                title=f"gradients at initialisation, {n_layers} layers ({len(seeds)} seed(s))",
                logy=True,
            ),
            out_dir,
            "gradients.png",
            "Gradient norm of each block's parameters at "
            "initialisation (one batch per seed, log scale), Xavier and library init: mean "
            "over seeds with the min-max band.",
        ),
        save_chart(
            curves_chart(
                {
                    f"{p}-norm, lr {lr:g}, warm-up {w}": [r["losses"] for r in per[(p, lr, w)]]
                    for p in PLACEMENTS
                    for w in (warmups[0], warmups[-1])
                    for lr in lrs[-1:]
                },
                title=f"training loss at peak lr {lrs[-1]:g}",
                logy=True,
            ),
            out_dir,
            "training.png",
            f"Training loss at peak lr {lrs[-1]:g}, without and "
            f"with {warmups[-1]} warm-up steps (mean over seeds, min-max band).",
        ),
    ]
    return Report(
        name="norm",
        title="Pre-norm vs post-norm: gradients at initialisation and warm-up",
        claim="It turns out that the gradients of pre-normalization are much better at "
        "initialization, leading to much faster training [Xiong et al., 2020].",
        source="000, 'Add & Norm'",
        setup=[
            f"Character LM on {source} ({len(data)} windows of {context + 1} characters, "
            f"vocabulary {vocab}); {n_layers} layers, d_model 64, 4 heads, d_ff 256, learned "
            "positions. Post-norm has no final norm (Vaswani), pre-norm has one.",
            "(a) one batch of 32 windows per seed; inits: 'xavier' = Xavier-uniform linear "
            "layers, zero biases, N(0, 1/D) tables (Xiong et al., primary); 'library' = "
            "N(0, 0.02) with residual projections scaled by 1/sqrt(2L); 'library, N(0, 1) "
            "embeddings' = the control.",
            f"(b) Xavier init; AdamW (0.9, 0.98), {train_steps(quick)} steps of 32, linear "
            f"warm-up of {list(warmups)} steps then cosine to 0, no gradient clipping; peak lr "
            f"{', '.join(f'{x:g}' for x in lrs)}; target {TARGET} nats/char (running mean of 10 "
            "steps); two single-threaded runs at a time.",
        ],
        tables=[
            Table(
                "(a) gradient spread over layers at initialisation (mean (min-max) over seeds)",
                grad_rows,
            ),
            Table("(b) training with and without warm-up", rows),
        ],
        figures=figures,
        **outcome(checks, reason, competence, seeds, quick),
        per_seed={
            "ratio": {f"{i}, {p}": v for (i, p), v in ratio.items()},
            "ratio_w1": {f"{i}, {p}": v for (i, p), v in ratio_w1.items()},
        },
        metrics={
            "spread": {p: spread(ratio[(prim, p)])["mean"] for p in PLACEMENTS},
            "spread_library": {p: spread(ratio[("library", p)])["mean"] for p in PLACEMENTS},
            "spread_w1": {p: spread(ratio_w1[(prim, p)])["mean"] for p in PLACEMENTS},
            "best": {p: list(best[p]) for p in PLACEMENTS},
            "steps_to_target": {
                f"{p}, lr {lr:g}, warm-up {w}": [r["steps to target"] for r in per[(p, lr, w)]]
                for p, lr, w in settings
            },
            "mean_curves": {
                p: bands([r["losses"] for r in per[(p, *best[p])]])[0][-1] for p in PLACEMENTS
            },
        },
        findings=[
            "Per-layer gradients at init (mean over seeds): "
            + "; ".join(
                f"{p}-norm, {i}: layer 1 {ends[(i, p)][0]:.3g}, "
                f"layer {n_layers} {ends[(i, p)][1]:.3g}"
                for i in INITS
                for p in PLACEMENTS
            )
            + ".",
            "Under the library init the post-norm imbalance sits at layer 1 (the first "
            "LayerNorm rescales the 0.02-std embeddings); the N(0, 1)-embedding control gives "
            f"a post-norm ratio of {spread_text(ratio[('library, N(0, 1) embeddings', 'post')])}.",
        ],
    )


def _lrs(values: list[float]) -> str:
    return ", ".join(f"{v:g}" for v in values) if values else "none of the rates"
