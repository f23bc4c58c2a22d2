"""Experiment ``head_removal``: are sixteen heads better than one? (Michel et al. 2019)

Multi-head attention (000, 001, 004 eq. 13) gives every layer H heads. Michel et al. found
that, at test time, a large share of the heads of a trained Transformer can be removed with
little loss -- some layers even reduced to a single head. Here, on a trained character LM, with
the validation windows split in three parts (heads are *chosen* on one split and *scored* on
another, so a choice cannot fit the windows it is judged on):

- one at a time: the loss on the scoring split with head (l, h) alone removed, for every head
  (``attnlab.inspect.head_ablation_effects``, zero ablation: head_h = 0 before W^O);
- greedy: on the choosing split, repeatedly remove the head whose removal raises the loss least,
  until all are gone; the same order then scored on the scoring split: how many heads can go
  before the loss rises by more than TOLERANCE;
- one head per layer: per layer, the head kept alone (all others of that layer removed) that
  is best on the choosing split, scored on the scoring split.

The LM's competence: validation loss (the third split) below the bigram baseline, at a learning
rate bracketed by its sweep, and converged by step doubling (first seed).

Shapes: N windows, T context, L layers, H heads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from matplotlib.ticker import MaxNLocator
from torch import nn

from attnlab import inspect
from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.corpus import text_windows, unigram_bigram
from attnlab.lab.kit.fit import FitConfig, eval_loss, fit, lm_loss
from attnlab.lab.kit.gating import recorded_competence, train_gated
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Report, Table, Threshold
from attnlab.lab.kit.seeds import bands, spread, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, outcome
from attnlab.models import build_model

TOLERANCE = 0.05  # nats per character: a removal "without significant loss" raises it by less
SHARE = 0.20  # Michel et al.: 20 % of heads prunable on WMT (40 % on BERT)
SHARE_BERT = 0.40
LRS = (1e-3, 3e-3, 1e-2)  # the LM's sweep on the first seed (one extension past an edge)
MAX_EXTENSIONS = 1  # keeps the full run inside its hour
ARM = "character LM"  # the one compared arm
STEPS = 1500
COST = (
    "Full run: `PYTHONPATH=src python -m attnlab experiment head_removal --data ../shared/data` "
    "(3 seeds; the learning-rate sweep of 3 rates on seed 0, seeds 1 and 2 at the chosen rate, "
    "seed 0 again at twice the steps). Estimated ~45 min on 2 idle cores (one job of 1500 steps "
    "with its removal analysis ~11 min; ~55 min if the sweep extends its grid once)."
)
CLAIM = (
    "A large percentage of attention heads can be removed at test time without significantly "
    "impacting performance; some layers can even be reduced to a single head. (Michel et al. "
    "2019, on the multi-head attention of 000/001/004 eq. 13)"
)
SOURCE = "000 'Multi-head Self-Attention'; 001 '3. Multi-head Attention'; Michel et al. 2019"
THRESHOLDS = [
    Threshold(
        "share of the heads greedy pruning removes before the loss rises by more than the "
        "tolerance (heads chosen on one split, scored on another)",
        f">= {SHARE:.0%} on every seed (the paper's WMT figure; its BERT figure, "
        f"{SHARE_BERT:.0%}, is reported alongside)",
        "Michel et al. 2019, Sec. 4.2 / Fig. 3: pruning 'allows us to prune up to 20% and 40% of "
        "heads from WMT and BERT (respectively), without incurring any noticeable negative "
        "impact'",
    ),
    Threshold(
        "heads whose removal alone costs less than the tolerance",
        "more than half of all heads, on every seed",
        "Michel et al. 2019, Sec. 3.2 and Table 1: removing one head at a time, most heads "
        "cause no significant change",
    ),
    Threshold(
        "layers reducible to one head (the best head, chosen on one split, kept alone; the "
        "loss on the other split within the tolerance)",
        "at least one layer, on every seed",
        "Michel et al. 2019, abstract ('some layers can even be reduced to a single head') and "
        "Sec. 3.3 / Table 2 (all heads of a layer but one removed)",
    ),
    Threshold(
        "tolerance: a rise of the loss that counts as no significant loss",
        f"{TOLERANCE} nats per character",
        "lab choice: the paper judges BLEU and accuracy with a significance test, which has no "
        "counterpart for an LM loss; the same tolerance is the LM's step-doubling tolerance",
    ),
]
SETUP = [
    "Removal = zero ablation of the head output A_h V_h before W^O "
    "(attnlab.inspect.ablate_heads / head_ablation_effects), at test time, no re-training.",
    "Validation windows in three splits: choosing (the greedy order and the one head per "
    "layer are picked here), scoring (every number the verdict reads), and held-out validation "
    "(the LM's competence and its learning-rate choice).",
    "Greedy: at each step every remaining head is tried on the choosing split and the cheapest "
    "removed; the resulting order is then scored on the scoring split.",
]


def make_model(vocab: int, context: int, quick: bool) -> nn.Module:
    cfg = ModelConfig(
        kind="decoder_lm",
        vocab_size=vocab,
        d_model=64 if quick else 128,
        n_heads=4 if quick else 8,
        n_layers=2 if quick else 4,
        max_len=context,
    )
    return build_model(cfg)


def fit_config(quick: bool, lr: float, steps: int) -> FitConfig:
    return FitConfig(
        steps=steps,
        batch_size=32 if quick else 64,
        lr=lr,
        warmup_steps=10 if quick else 100,
        min_lr=lr / 30,
    )


def val_loss(model: nn.Module, windows: torch.Tensor, removed: list[tuple[int, int]]) -> float:
    """The LM loss on ``windows`` with the heads ``removed`` (layer, head) zero-ablated."""
    if not removed:
        return eval_loss(model, (windows,), lm_loss)
    with inspect.ablate_heads(model, removed):
        return eval_loss(model, (windows,), lm_loss)


def greedy_removal(
    model: nn.Module, windows: torch.Tensor, n_layers: int, n_heads: int
) -> tuple[list[float], list[tuple[int, int]]]:
    """Losses after removing 0, 1, ..., L H heads, each step the head that hurts least."""
    left = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    removed: list[tuple[int, int]] = []
    losses = [val_loss(model, windows, removed)]
    while left:
        trial = {head: val_loss(model, windows, removed + [head]) for head in left}
        best = min(trial, key=lambda head: trial[head])
        removed.append(best)
        left.remove(best)
        losses.append(trial[best])
    return losses, removed


def one_head_layers(
    model: nn.Module, choose: torch.Tensor, score: torch.Tensor, n_layers: int, n_heads: int
) -> list[dict[str, Any]]:
    """Per layer: the head that, kept alone in its layer, gives the lowest loss on ``choose``;
    and the loss on ``score`` with only that head left in the layer."""
    out = []
    for layer in range(n_layers):

        def others(keep: int, layer: int = layer) -> list[tuple[int, int]]:
            return [(layer, h) for h in range(n_heads) if h != keep]

        chosen = min(range(n_heads), key=lambda h: val_loss(model, choose, others(h)))
        out.append({"head": chosen, "loss": val_loss(model, score, others(chosen))})
    return out


def splits(val: torch.Tensor, quick: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(choosing, scoring, held-out validation) windows."""
    n = 32 if quick else 128
    return val[:n], val[n : 2 * n], val[2 * n :]


def train_job(job: tuple) -> dict[str, Any]:
    """One (seed, lr, steps) run: its held-out validation loss and, when ``analyse``, the
    removal analysis (a doubling run needs only the loss)."""
    seed, lr, steps, analyse, quick, data = job
    context = 32 if quick else 64
    train, val, chars, _ = text_windows(quick, context, data)
    choose, score, held = splits(val, quick)
    torch.manual_seed(seed)
    model = make_model(len(chars), context, quick)
    fit(model, (train,), lm_loss, fit_config(quick, lr, steps), seed=seed)
    out: dict[str, Any] = {"val": val_loss(model, held, [])}
    if not analyse:
        return out
    blocks = cast(nn.ModuleList, model.blocks)
    n_layers, n_heads = len(blocks), int(cast(Any, blocks[0]).self_attn.n_heads)
    one = inspect.head_ablation_effects(
        model, score[:, :-1], metric="loss", targets=score[:, 1:]
    ).effects  # (L, H)
    curve, order = greedy_removal(model, choose, n_layers, n_heads)
    scored = [val_loss(model, score, order[:k]) for k in range(len(order) + 1)]
    return out | {
        "one": one.tolist(),
        "curve choose": curve,
        "curve score": scored,
        "order": [list(head) for head in order],
        "one head": one_head_layers(model, choose, score, n_layers, n_heads),
        "L": n_layers,
        "H": n_heads,
    }


def removable(curve: list[float], tol: float) -> int:
    """How many heads the greedy order removes before the loss exceeds clean + tol."""
    over = [k for k, v in enumerate(curve) if v > curve[0] + tol]
    return (over[0] if over else len(curve)) - 1


def measure(quick: bool, seed: int, data: Path | None) -> dict[str, Any]:
    """Train the LM (sweep on the first seed, the other seeds at the chosen rate, the first
    seed again at twice the steps) and measure the removals: plain numbers."""
    seeds = start_seeds(seed, quick)
    steps = 40 if quick else STEPS
    workers = 1 if quick else 2
    train, val, chars, source = text_windows(quick, 32 if quick else 64, data)
    _, bigram = unigram_bigram(train, val, len(chars))
    runs = train_gated(
        train_job,
        [ARM],
        lambda _, lr, n, s: (s, lr, n, n == steps, quick, data),  # the doubling: no analysis
        _val,
        grid=LRS,
        steps=steps,
        seeds=seeds,
        higher_is_better=False,
        workers=workers,
        chosen_on=f"held-out validation loss, seed {seeds[0]}",
        step=LRS[1] / LRS[0],
        max_extra=MAX_EXTENSIONS,
    )
    return {
        "seeds": seeds,
        "steps": steps,
        "source": source,
        "bigram": bigram,
        **runs.record(ARM, _val),
    }


def _val(run: dict[str, Any]) -> float:
    return run["val"]


def _competence(m: dict[str, Any]) -> Competence:
    return recorded_competence(
        m,
        ARM,
        "held-out validation loss (nats/char) below the bigram baseline",
        m["bigram"],
        [_val(r) for r in m["runs"]],
        value=_val,
        tolerance=TOLERANCE,
        metric="held-out validation loss (nats/char)",
    )


def _checks(m: dict[str, Any]) -> tuple[list[bool], dict[str, list]]:
    runs = m["runs"]
    n_total = runs[0]["L"] * runs[0]["H"]
    keep = [removable(r["curve score"], TOLERANCE) for r in runs]
    harmless = [int((np.array(r["one"]) < TOLERANCE).sum()) for r in runs]
    single = [
        sum(h["loss"] <= r["curve score"][0] + TOLERANCE for h in r["one head"]) for r in runs
    ]
    numbers = {
        "removable": keep,
        "share": [k / n_total for k in keep],
        "harmless": harmless,
        "one-head layers": single,
        "worst": [float(np.max(r["one"])) for r in runs],
    }
    checks = [
        min(numbers["share"]) >= SHARE,
        min(harmless) > n_total / 2,
        min(single) >= 1,
    ]
    return checks, numbers


def write_up(m: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """Tables, figure, verdict and prose from :func:`measure`'s numbers."""
    runs, seeds = m["runs"], m["seeds"]
    n_layers, n_heads = runs[0]["L"], runs[0]["H"]
    n_total = n_layers * n_heads
    checks, n = _checks(m)
    clean = [r["curve score"][0] for r in runs]
    reason = (
        f"of {n_total} heads ({n_layers} layers x {n_heads}), greedy removal (order chosen on "
        f"the choosing split) takes {spread_text(n['removable'])} heads, i.e. "
        f"{spread_text([100 * s for s in n['share']])} %, before the loss on the scoring split "
        f"rises by more than {TOLERANCE} nats/char (needed: >= {SHARE:.0%} on every seed; "
        f"the paper's BERT figure {SHARE_BERT:.0%}); removed alone, {spread_text(n['harmless'])} "
        f"heads cost less than {TOLERANCE} (needed: more than {n_total / 2:g}); "
        f"{spread_text(n['one-head layers'])} of {n_layers} layers keep their loss within "
        f"{TOLERANCE} with one head left (needed: at least 1); the most important single head "
        f"costs {spread_text(n['worst'])} nats/char (mean (min-max) over {len(seeds)} seed(s); "
        f"clean loss {spread_text(clean)}, so the tolerance is "
        f"{100 * TOLERANCE / spread(clean)['mean']:.1f} % of it)."
    )
    xs = list(range(n_total + 1))
    fig = seeds_chart(
        {
            "order chosen here (choosing split)": (xs, [r["curve choose"] for r in runs]),
            "same order, scoring split": (xs, [r["curve score"] for r in runs]),
        },
        xlabel="heads removed (greedy order)",
        ylabel="loss (nats/char)",
        title=f"removing heads from a trained {n_layers}x{n_heads}-head LM",
        markers=True,
        hline=m["bigram"],
    )
    fig.axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    figures = [
        save_chart(
            fig,
            out_dir,
            "greedy.png",
            "Loss against the number of heads removed in the greedy order, on the split the "
            "order was chosen on and on the held-out scoring split (mean over seeds, min-max "
            "band); dashed: the bigram baseline.",
        )
    ]
    rows = [
        {
            "seed": s,
            "clean loss (scoring split)": r["curve score"][0],
            f"removable at +{TOLERANCE}": k,
            "share removable": share,
            "heads costing < tolerance alone": h,
            "layers reducible to one head": one,
            "kept head per layer (scoring-split loss)": ", ".join(
                f"L{i + 1}: H{x['head'] + 1} ({x['loss']:.3f})" for i, x in enumerate(r["one head"])
            ),
            "last 3 heads kept (layer, head)": str([(a + 1, b + 1) for a, b in r["order"][-3:]]),
        }
        for s, r, k, share, h, one in zip(
            seeds, runs, n["removable"], n["share"], n["harmless"], n["one-head layers"]
        )
    ]
    effect_rows = [
        {
            "seed": s,
            "layer": layer + 1,
            **{f"head {h + 1}": r["one"][layer][h] for h in range(n_heads)},
        }
        for s, r in zip(seeds, runs)
        for layer in range(n_layers)
    ]
    sweep_rows = [{"lr": float(k), "held-out validation loss": v} for k, v in m["sweep"].items()]
    competence = [_competence(m)]
    lr = competence[0].lr
    assert lr is not None
    return Report(
        name="head_removal",
        title="Removing heads: how many does a trained model need?",
        claim=CLAIM,
        source=SOURCE,
        setup=[
            f"Character LM on {m['source']}; decoder-only, {n_layers} pre-norm layers x "
            f"{n_heads} heads, d_model {64 if quick else 128}, learned positions; AdamW, "
            f"{m['steps']} steps, warm-up + cosine to lr/30; {lr.describe()} (the sweep on seed "
            f"{seeds[0]}); seed {seeds[0]} also trained for {2 * m['steps']} steps (the step "
            "doubling).",
            *SETUP,
            f"Splits: {32 if quick else 128} choosing windows, as many scoring windows, the "
            "rest of the validation text held out.",
        ],
        thresholds=THRESHOLDS,
        tables=[
            Table("per seed (scoring split)", rows),
            Table(
                "loss change when one head alone is removed (scoring split, nats/char)", effect_rows
            ),
            Table(f"learning-rate sweep (seed {seeds[0]})", sweep_rows),
        ],
        figures=figures,
        **outcome(checks, reason, competence, seeds, quick, arms=[ARM]),
        per_seed=n,
        metrics={
            "curve_mean": bands([r["curve score"] for r in runs])[0],
            "bigram": m["bigram"],
            "clean": spread(clean),
            "lr": lr.chosen,
        },
    )


@experiment("head_removal", notes="000/001 'Multi-head attention'; Michel et al. 2019")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """A large share of the heads of a trained multi-head Transformer can be removed at test
    time with little loss; some layers can be reduced to one head."""
    return write_up(measure(quick, seed, data), out_dir, quick)
