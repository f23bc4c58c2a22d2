"""Experiment ``head_removal``: are sixteen heads better than one? (Michel et al. 2019)

Multi-head attention (000, 001, 004 eq. 13) gives every layer H heads. Michel et al. found
that, at test time, most heads of a trained Transformer can be removed with little loss -- many
layers can be reduced to a single head -- while a few heads matter a lot. Here, on a trained
character LM:

- one at a time: the validation loss with head (l, h) alone removed, for every head
  (``attnlab.inspect.head_ablation_effects``, zero ablation: head_h = 0 before W^O);
- greedy: repeatedly remove the head whose removal raises the validation loss least, until all
  are gone; the curve of loss against heads removed, and how many heads can go before the loss
  rises by more than 0.05 nats per character (about 3% of the clean loss here) or 0.1.

Shapes: N windows, T context, L layers, H heads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnlab import inspect
from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.corpus import text_windows, unigram_bigram
from attnlab.lab.kit.fit import FitConfig, eval_loss, fit, lm_loss
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import Competence, Report, Table, outcome, spread, spread_text
from attnlab.lab.kit.seeds import bands, run_jobs, start_seeds
from attnlab.models import build_model

TOLERANCES = (0.05, 0.1)  # nats per character


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
        best = min(trial, key=trial.get)
        removed.append(best)
        left.remove(best)
        losses.append(trial[best])
    return losses, removed


def train_job(job: tuple) -> dict:
    seed, quick = job
    context = 32 if quick else 64
    train, val, chars, _ = text_windows(quick, context)
    torch.manual_seed(seed)
    model = make_model(len(chars), context, quick)
    cfg = FitConfig.sized(quick, 1500, warmup_steps=100, lr=3e-3, min_lr=1e-4)
    fit(model, (train,), lm_loss, cfg, seed=seed)
    probe = val[: 32 if quick else 128]
    n_layers, n_heads = len(model.blocks), model.blocks[0].self_attn.n_heads
    one = inspect.head_ablation_effects(
        model, probe[:, :-1], metric="loss", targets=probe[:, 1:]
    ).effects  # (L, H)
    curve, order = greedy_removal(model, probe, n_layers, n_heads)
    return {
        "val": val_loss(model, val[:256], []),
        "one": one.tolist(),
        "curve": curve,
        "order": order,
        "L": n_layers,
        "H": n_heads,
    }


def removable(curve: list[float], tol: float) -> int:
    """How many heads the greedy order removes before the loss exceeds clean + tol."""
    over = [k for k, v in enumerate(curve) if v > curve[0] + tol]
    return (over[0] if over else len(curve)) - 1


@experiment("head_removal", notes="000/001 'Multi-head attention'; Michel et al. 2019")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Most heads of a trained multi-head Transformer can be removed at test time with little
    loss; a few heads matter a lot."""
    seeds = start_seeds(seed, quick)
    train, val, chars, source = text_windows(quick, 32 if quick else 64)
    _, bi = unigram_bigram(train, val, len(chars))
    res = run_jobs(train_job, [(s, quick) for s in seeds], 1 if quick else 2)
    runs = [res[(s, quick)] for s in seeds]
    n_total = runs[0]["L"] * runs[0]["H"]
    keep = {tol: [removable(r["curve"], tol) for r in runs] for tol in TOLERANCES}
    one = [np.array(r["one"]) for r in runs]
    harmless = [int((o < TOLERANCES[0]).sum()) for o in one]
    worst = [float(o.max()) for o in one]
    what = "validation loss (nats/char) below the bigram baseline"
    competence = [
        Competence("character LM", what, bi, [r["val"] for r in runs], higher_is_better=False)
    ]
    most = min(keep[TOLERANCES[0]]) >= n_total // 2
    few_matter = all(w > 10 * TOLERANCES[0] for w in worst)
    checks = [most, few_matter]
    reason = (
        f"of {n_total} heads ({runs[0]['L']} layers x {runs[0]['H']}), greedy removal takes "
        f"{spread_text(keep[TOLERANCES[0]])} before the validation loss rises by more than "
        f"{TOLERANCES[0]} nats/char and {spread_text(keep[TOLERANCES[1]])} before "
        f"{TOLERANCES[1]}; removed alone, {spread_text(harmless)} heads cost less than "
        f"{TOLERANCES[0]}, and the most important one costs {spread_text(worst)} nats/char "
        f"(mean (min-max) over {len(seeds)} seeds; clean loss "
        f"{spread_text([r['curve'][0] for r in runs])})."
    )
    fig = seeds_chart(
        {"greedy removal": (range(n_total + 1), [r["curve"] for r in runs])},
        xlabel="heads removed",
        ylabel="validation loss (nats/char)",
        title=f"removing heads from a trained {runs[0]['L']}x{runs[0]['H']}-head LM",
        markers=False,
        hline=bi,
    )
    caption = (
        "Validation loss against the number of heads removed, greedily (mean over seeds, "
        "min-max band); dashed: the bigram baseline."
    )
    figures = [save_chart(fig, out_dir, "greedy.png", caption)]
    rows = [
        {
            "seed": s,
            "clean loss": r["curve"][0],
            **{f"removable at +{t}": removable(r["curve"], t) for t in TOLERANCES},
            "heads costing < 0.05 alone": h,
            "largest single-head cost": w,
            "last 3 heads kept (layer, head)": str([(a + 1, b + 1) for a, b in r["order"][-3:]]),
        }
        for s, r, h, w in zip(seeds, runs, harmless, worst)
    ]
    effect_rows = [
        {
            "seed": s,
            "layer": layer + 1,
            **{f"head {h + 1}": r["one"][layer][h] for h in range(r["H"])},
        }
        for s, r in zip(seeds, runs)
        for layer in range(r["L"])
    ]
    return Report(
        name="head_removal",
        title="Removing heads: how many does a trained model need?",
        claim="A large percentage of attention heads can be removed at test time without "
        "significantly impacting performance; some layers can even be reduced to a single "
        "head. (Michel et al. 2019, on the multi-head attention of 000/001/004 eq. 13)",
        source="000 'Multi-head Self-Attention'; 001 '3. Multi-head Attention'; Michel et al. 2019",
        setup=[
            f"Character LM on {source}; decoder-only, {runs[0]['L']} pre-norm layers x "
            f"{runs[0]['H']} heads, d_model {64 if quick else 128}, learned positions; AdamW "
            f"lr 3e-3, {40 if quick else 1500} steps, warm-up + cosine.",
            "Removal = zero ablation of the head output A_h V_h before W^O "
            "(attnlab.inspect.ablate_heads / head_ablation_effects), at test time, no "
            f"re-training; validation loss on {32 if quick else 128} windows.",
            "Greedy: at each step every remaining head is tried and the cheapest removed.",
        ],
        tables=[
            Table("per seed", rows),
            Table("loss change when one head alone is removed (nats/char)", effect_rows),
        ],
        figures=figures,
        **outcome(checks, reason, competence, seeds, quick),
        per_seed={
            "removable": {str(t): v for t, v in keep.items()},
            "worst": worst,
            "harmless": harmless,
        },
        metrics={
            "curve_mean": bands([r["curve"] for r in runs])[0],
            "bigram": bi,
            "clean": spread([r["curve"][0] for r in runs]),
        },
    )
