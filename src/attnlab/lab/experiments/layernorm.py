"""Experiment ``layernorm``: is LayerNorm a learning aid -- faster, steadier training and a lower
loss -- for the character LM (000 "Layer Norm"; 003 "Layer Normalization"; 004 eq. 17)?

    LN(a) = g (a - mu) / sqrt(sigma^2 + eps) + b    (004 eq. 17, with Ba et al.'s g, b)
    pre-norm block   h = h + f(LN(h))  for f = self-attention, then feed-forward

Arms: the lab's pre-norm character LM (:mod:`attnlab.lab.kit.lm_arms`) with its norms
(before each sublayer and after the last block) and without any (``ModelConfig(norm="none")``:
h = h + f(h)), at 2 and 6 layers. Every arm, the norm-free ones (whose failure is the claim)
included, gets the same learning-rate sweep (bracketed) and step doubling; its criterion is the
training's own (it learned the character frequencies), never the outcome the claim predicts.

Checks, at each depth: (1) final loss: validation loss with LayerNorm below without, seed ranges
apart; (2) speed (003: "Speeds up training"): the steps until the running-mean training loss
first reaches the add-one bigram baseline, fewer with LayerNorm, seed ranges apart. Stability
(004: "stabilise neural network training") is shown, not judged: each arm's sweep (how many of
the tried rates train to near its best) and the largest rise of its smoothed training loss above
its running minimum after warm-up (a loss spike), per seed.

Shapes: B batch, T context, D d_model, L layers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnlab.lab.kit import lm_arms as la
from attnlab.lab.kit.lm_arms import UNIT, Check, worse
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import spread_text

DEPTHS = {True: (1, 2), False: (2, 6)}
NORMS = ("LayerNorm", "no norm")
NEAR_BEST = 0.1  # nats/char: a swept rate within this of the arm's best "trains" (stability)


def _layers(depth: int) -> str:
    return f"{depth} layer{'s' if depth > 1 else ''}"


def _name(norm: str, depth: int) -> str:
    return f"{norm}, {_layers(depth)}"


def arms(quick: bool) -> list[la.Arm]:
    return [
        la.Arm(_name(n, d), () if n == "LayerNorm" else (("norm", "none"),), d)
        for d in DEPTHS[quick]
        for n in NORMS
    ]


CLAIM = (
    "One important learning aid in Transformers is layer normalization. The intuition of layer "
    "norm is to reduce uninformative variation in the activations at a layer, providing a more "
    "stable input to the next layer. (000)\n"
    "Layer normalization: Speeds up training. Provides a small regularization. Ensures features "
    "are in a similar magnitude among the elements in the input sequence. (003)\n"
    "Layer normalisation [Ba et al., 2016] is a normalisation technique used to stabilise neural "
    "network training. (004)"
)
SOURCE = "000 'Layer Norm'; 003 'Layer Normalization'; 004 'Layer normalisation' (eq. 17)"
THRESHOLDS = [
    Threshold(
        "LayerNorm is a learning aid (final loss)",
        "validation loss with LayerNorm below without, seed ranges apart, at each depth",
        "000 'Layer Norm' ('one important learning aid'); the notes give no number: ranges "
        "apart is the lab's bar",
    ),
    Threshold(
        "LayerNorm speeds up training",
        "steps until the running-mean training loss reaches the add-one bigram baseline: fewer "
        "with LayerNorm, seed ranges apart, at each depth (never reached counts as infinite)",
        "003 'Layer Normalization' ('Speeds up training'); the bigram target is the lab's",
    ),
]
COST = (
    "Full run: `attnlab experiment layernorm --seed 0 --data ../shared/data`. Estimate for 2 "
    "idle cores from a single-thread probe (27 Nov 2026, kit.lm_arms recipe: CPU time, "
    "time.process_time, of 50 and 250 training steps of each arm on tinyshakespeare, the "
    "difference over 200 steps, the machine shared with other jobs, so +-30 %: the same arm "
    "measured 13-20 ms in different experiments): 20.5 and 19.0 ms per step at 2 layers, 49.3 "
    "and 44.7 at 6 layers (with and without norms; 133.5 ms summed). Each arm trains 7 x 5000 "
    "steps (3 sweep rates, 2 more seeds, a doubling of 10000 steps on the first seed; 8 x "
    "with one grid extension, 9 x with two): 78-100 min of CPU: about 39-50 min on both cores "
    "(the 6-layer doublings, ~8 min each, start first)."
)


def measure(quick: bool, seed: int, data: Path | None = None) -> dict[str, Any]:
    """Every (norm, depth) gated and trained on every seed (plain numbers, no prose)."""
    m = la.measure_arms(arms(quick), quick, seed, data)
    m["depths"] = list(DEPTHS[quick])
    return m


def spike(losses: list[float], after: int) -> float:
    """The largest rise of the smoothed training loss above its running minimum from step
    ``after`` on (0: the loss never went up again; inf: the run diverged)."""
    curve = la.smoothed(losses)
    if not curve or any(not math.isfinite(v) for v in curve):
        return math.inf
    low, worst = math.inf, 0.0
    for i, v in enumerate(curve):
        low = min(low, v)
        if i + la.SMOOTH >= after:
            worst = max(worst, v - low)
    return worst


def _speed(m: dict[str, Any], arm: str) -> list[float]:
    return [la.steps_to(r["losses"], m["bigram"]) for r in m["gated"][arm]["runs"]]


def _spikes(m: dict[str, Any], arm: str) -> list[float]:
    runs = m["gated"][arm]["runs"]
    return [spike(r["losses"], la.size_of(m).warmup) for r in runs]


def _breadth(m: dict[str, Any], arm: str) -> str:
    scores = {float(k): v for k, v in m["gated"][arm]["scores"].items()}
    best = min(scores.values())
    near = [r for r, s in sorted(scores.items()) if s <= best + NEAR_BEST]
    return f"{len(near)} of {len(scores)} ({', '.join(f'{r:g}' for r in near)})"


def _rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            **la.arm_row(m, name),
            "steps to the bigram baseline": spread_text(_speed(m, name)),
            "largest loss spike": spread_text(_spikes(m, name)),
            f"swept rates within {NEAR_BEST:g} of the best (seed 0)": _breadth(m, name),
        }
        for name in m["arms"]
    ]


def _checks(m: dict[str, Any]) -> tuple[list[Check], str]:
    """The claim's checks at each depth, the seed spread deciding, and the verdict's reason."""
    found, parts = [], []
    for d in m["depths"]:
        on, off = _name(NORMS[0], d), _name(NORMS[1], d)
        val = [la.values(m, a, "val") for a in (on, off)]
        speed = [_speed(m, a) for a in (on, off)]
        found += [
            worse(f"{_layers(d)}: validation loss without LayerNorm above with", val[1], val[0]),
            worse(f"{_layers(d)}: steps to the bigram baseline without above with", *speed[::-1]),
        ]
        parts.append(
            f"{_layers(d)}: validation loss {spread_text(val[0])} with LayerNorm vs "
            f"{spread_text(val[1])} without, steps to the bigram baseline "
            f"{spread_text(speed[0])} vs {spread_text(speed[1])}"
        )
    reason = (
        f"mean (min-max) over {len(m['seeds'])} seed(s): " + "; ".join(parts)
        + f" (bigram baseline {m['bigram']:.3f} {UNIT})."
    )  # fmt: skip
    return found, reason


def _figures(m: dict[str, Any], out_dir: Path) -> list[FigureRef]:
    return [
        la.curve_figure(
            m,
            [_name(n, d) for n in NORMS],
            out_dir,
            f"training_{d}_layers.png",
            f"{_layers(d)}: training loss (running mean of {la.SMOOTH} steps) with and without "
            "LayerNorm, each at its chosen rate (mean over seeds, min-max band); dashed: the "
            "bigram baseline the speed check counts steps to.",
            f"LayerNorm on and off, {_layers(d)}",
        )
        for d in m["depths"]
    ]


def write_up(m: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """The report of :func:`measure`'s numbers: tables, figures, the gated verdict."""
    found, reason = _checks(m)
    setup = [
        f"Arms: with LayerNorm (before each sublayer and after the last block) and without any "
        f"norm (ModelConfig(norm='none')), at {' and '.join(map(str, m['depths']))} layers.",
        f"Loss spike: the largest rise of the running-mean training loss ({la.SMOOTH} steps) "
        f"above its running minimum after warm-up ({la.size_of(m).warmup} steps).",
    ]
    table = Table("per arm (mean (min-max) over seeds)", _rows(m))
    return la.arm_report(
        PAPER, m, quick, (found, reason), setup, [table], figures=_figures(m, out_dir),
        per_seed={
            "val": {a: la.values(m, a, "val") for a in m["arms"]},
            "steps_to_bigram": {a: _speed(m, a) for a in m["arms"]},
        },
        metrics={"unigram": m["unigram"], "bigram": m["bigram"],
                 "checks": [c.state for c in found]},
    )  # fmt: skip


PAPER = la.Paper("layernorm", "LayerNorm on and off: speed, stability and final loss of the "
                 "character LM", CLAIM, SOURCE, THRESHOLDS, COST)  # fmt: skip


@experiment("layernorm", notes="000 'Layer Norm'; 003 'Layer Normalization'; 004 eq. 17")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """LayerNorm is a learning aid: with it the character LM trains faster (fewer steps to a
    fixed loss) and ends at a lower validation loss than the same pre-norm model without any
    norm, at 2 and at 6 layers."""
    return write_up(measure(quick, seed, data), out_dir, quick)
