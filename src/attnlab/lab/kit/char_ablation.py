"""A variant of the lab's character LM trained under the gate: the shared harness of the
experiments that take one part of the Transformer away or resize it (``qkv``, ``ffn_width``,
``layernorm``).

Each arm is a :class:`Variant`: a name, the :class:`~attnlab.config.ModelConfig` fields it changes
over the lab's character LM (:func:`attnlab.lab.kit.corpus.char_lm_config`: decoder-only, pre-norm,
d_model 64, 4 heads, learned positions) and its depth. Every arm gets the same recipe (AdamW,
batches of 32 windows of :data:`CONTEXT` + 1 characters, warm-up then cosine to lr/10) and the
same gate (:func:`attnlab.lab.kit.gating.gate_arms`: a learning-rate sweep whose choice is
bracketed, the other seeds at the chosen rate, a step doubling), whatever the claim predicts for
it. Its competence criterion is the residual experiment's: the training learned the character
frequencies (validation loss at most the unigram entropy + :data:`UNIGRAM_MARGIN`) and doubling
the steps does not move the validation loss by more than the sweep's tolerance.

Per run: the validation loss (nats/char), the training-loss curve, the parameter count and the
*self-weight* -- the mean attention weight a query puts on its own position, A_tt, over every
layer, head and query t >= 1 of held-out windows (t = 0 sees only itself) -- with
:func:`uniform_self_weight`, its value under uniform causal attention, for reference.

Shapes: N windows, B batch, T context, H heads.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from matplotlib.ticker import MaxNLocator
from torch import nn

from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.corpus import (
    LEARNED_FREQUENCIES,
    UNIGRAM_MARGIN,
    char_lm_config,
    text_windows,
    unigram_bigram,
)
from attnlab.lab.kit.fit import FitConfig, eval_loss, fit, lm_loss
from attnlab.lab.kit.gating import Gated, Sweep, gate_arms, sweep_rows
from attnlab.lab.kit.report import FigureRef
from attnlab.lab.kit.seeds import start_seeds
from attnlab.lab.kit.verdict import Competence
from attnlab.models import build_model

CONTEXT = 32  # characters a window feeds the model (T)
BATCH = 32
N_VAL = 512  # validation windows scored
N_WEIGHTS = 64  # held-out windows the self-weight is measured on
SMOOTH = 20  # running mean of the training loss (steps) for curves and steps-to-target
# A probe of the 2-layer arm at lr 3e-3 (seed 0, tinyshakespeare): doubling 1500 -> 3000 steps
# moved the validation loss by 0.11 nats/char, 4000 -> 8000 by 0.048 (the tolerance's edge).
STEPS = {True: 30, False: 5000}
SWEEP = Sweep(
    grid=(1e-3, 3e-3, 1e-2),
    tolerance=0.05,
    metric="validation loss (nats/char)",
    metric_key="val",
    factor=3.0,
    max_extensions=2,
    doubling_seeds=1,  # the first seed: three would not fit layernorm's 60 minutes
)
QUICK_SWEEP = SWEEP.quick(grid=(1e-3, 3e-3))


@dataclass(frozen=True)
class Variant:
    """One arm: its name in the report, the ModelConfig fields it changes (``(field, value)``
    pairs over :func:`char_lm_config`'s) and its depth."""

    name: str
    changes: tuple[tuple[str, Any], ...] = ()
    n_layers: int = 2

    def config(self, vocab: int) -> ModelConfig:
        return dataclasses.replace(
            char_lm_config(vocab, CONTEXT, self.n_layers), **dict(self.changes)
        )


def sweep_of(quick: bool) -> Sweep:
    return QUICK_SWEEP if quick else SWEEP


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def self_weight(model: nn.Module, ids: torch.Tensor) -> float:
    """Mean A_tt over layers, heads, windows and queries t >= 1 of ``ids`` (N, T)."""
    model.eval()
    out = model(ids, need_weights=True)
    diag = [a.self_attn.diagonal(dim1=-2, dim2=-1)[..., 1:] for a in out.attentions]  # (N, H, T-1)
    return float(torch.stack(diag).mean())


def uniform_self_weight(context: int = CONTEXT) -> float:
    """Mean A_tt over t = 1..T-1 when query t spreads its weight evenly over its t + 1 keys."""
    return sum(1 / (t + 1) for t in range(1, context)) / (context - 1)


def steps_to(losses: list[float], target: float, window: int = SMOOTH) -> float:
    """The first step whose running-mean training loss is at most ``target`` (inf: never)."""
    total = 0.0
    for i, loss in enumerate(losses):
        total += loss - (losses[i - window] if i >= window else 0.0)
        if i + 1 >= window and total / window <= target:
            return float(i + 1)
    return math.inf


def train_job(job: tuple) -> dict[str, Any]:
    """One variant at a learning rate for ``scale`` x the step budget on one seed (the job of
    :func:`attnlab.lab.kit.gating.gate_arms`)."""
    variant, lr, scale, seed, quick, data = job
    train, val, chars, _ = text_windows(quick, CONTEXT, data)
    torch.manual_seed(seed)
    model = build_model(variant.config(len(chars)))
    n = STEPS[quick] * scale
    cfg = FitConfig(steps=n, batch_size=BATCH, lr=lr, warmup_steps=n // 10, min_lr=lr / 10)
    result = fit(model, (train,), lm_loss, cfg, seed=seed)
    ok = not result.diverged
    return {
        "val": eval_loss(model, (val[:N_VAL],), lm_loss) if ok else math.inf,
        "train": result.final_loss(),
        "losses": result.losses,
        "diverged": result.diverged,
        "params": n_params(model),
        "self_weight": self_weight(model, val[:N_WEIGHTS, :CONTEXT]) if ok else math.nan,
        "train_s": result.seconds,
    }


def measure_arms(
    variants: list[Variant], quick: bool, seed: int, data: Path | None
) -> dict[str, Any]:
    """Every variant gated and trained on every seed; plain numbers (the gate's runs as dicts)."""
    seeds = start_seeds(seed, quick)
    train, val, chars, source = text_windows(quick, CONTEXT, data)
    uni, bi = unigram_bigram(train, val, len(chars))
    cost = lambda j: j[0].n_layers * j[2]  # noqa: E731  (deep, doubled runs start first)
    gated = gate_arms(train_job, variants, sweep_of(quick), seeds, quick, data, cost=cost)
    return {
        "seeds": seeds,
        "steps": STEPS[quick],
        "unigram": uni,
        "bigram": bi,
        "source": source,
        "vocab": len(chars),
        "arms": [v.name for v in variants],
        "gated": {v.name: asdict(gated[v]) for v in variants},
    }


def gated_runs(m: dict[str, Any]) -> dict[str, Gated]:
    """The measured runs of every arm, by name, in the order measured."""
    return {name: Gated(**m["gated"][name]) for name in m["arms"]}


def values(m: dict[str, Any], arm: str, key: str) -> list[Any]:
    """``key`` of every seed's run of ``arm`` at its chosen rate."""
    return [r[key] for r in m["gated"][arm]["runs"]]


def competence(m: dict[str, Any], quick: bool) -> list[Competence]:
    """Every arm: validation loss at most the unigram entropy + margin on every seed, at its
    swept rate, with its step doubling."""
    sweep = sweep_of(quick)
    threshold = m["unigram"] + UNIGRAM_MARGIN
    return [
        g.competence(
            name, LEARNED_FREQUENCIES, threshold, sweep, m["steps"], higher_is_better=False
        )
        for name, g in gated_runs(m).items()
    ]


def sweep_table_rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    return sweep_rows(gated_runs(m), str)


def setup_lines(m: dict[str, Any], quick: bool) -> list[str]:
    """The recipe every arm shares, with the gate's numbers."""
    n = m["steps"]
    return [
        f"Character LM on {m['source']}, windows of {CONTEXT + 1} characters, vocabulary "
        f"{m['vocab']}; validation loss on {N_VAL} held-out windows.",
        "Decoder-only, pre-norm, d_model 64, 4 heads, learned positions, ReLU feed-forward "
        "(d_ff 4 d_model unless an arm changes it), tied embeddings.",
        f"AdamW, {n} steps of {BATCH} windows, warm-up {n // 10} steps then cosine to lr/10, "
        "gradients clipped at 1; the same recipe and seeds for every arm; single-threaded "
        "runs, two at a time.",
        sweep_of(quick).describe(f"{n} steps"),
        f"Competence of every arm: validation loss at most the unigram entropy "
        f"({m['unigram']:.3f} nats/char) + {UNIGRAM_MARGIN:g} on every seed, and the doubling.",
    ]


def curve_figure(
    m: dict[str, Any], arms: list[str], out_dir: Path, file: str, caption: str, title: str
) -> FigureRef:
    """Training loss (running mean of :data:`SMOOTH` steps) against the step for ``arms`` at
    their chosen rates, mean over seeds with a min-max band; dashed: the bigram baseline."""
    curves = {}
    for arm in arms:
        runs = [smoothed(r["losses"]) for r in m["gated"][arm]["runs"]]
        n = min(len(r) for r in runs)  # a diverged run stops early
        curves[arm] = (range(SMOOTH, SMOOTH + n), [r[:n] for r in runs])
    fig = seeds_chart(
        curves,
        xlabel="step",
        ylabel=f"training loss (nats/char, mean of {SMOOTH} steps)",
        title=title,
        hline=m["bigram"],
    )
    fig.axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    return save_chart(fig, out_dir, file, caption)


def smoothed(losses: list[float]) -> list[float]:
    """Running means of :data:`SMOOTH` training losses; entry i ends at step i + SMOOTH."""
    return [sum(losses[i - SMOOTH : i]) / SMOOTH for i in range(SMOOTH, len(losses) + 1)]
