"""Experiment ``lm_extrapolation``: a char LM trained on length T, scored at 1x-8x T (Press et al.
2022, Fig. 1; 004 "Position representations").

Press et al. 2022 (Fig. 1): "as the (validation-set's) input sequence gets longer (x-axis),
current position methods (sinusoidal, rotary, and T5) show degraded perplexity (y-axis, lower is
better), but our method (ALiBi) does not." 004 (eq. 15-16): learned position vectors suit a known
maximum index; "in the case where unseen index can occur in test time, a pre-defined function
might be preferred" -- the sinusoids.

Five arms of one decoder-only character LM (:mod:`attnlab.lab.kit.lm_arms`: its recipe, gate and
nats/char score), differing only in the position scheme (``ModelConfig.positional``): learned,
sinusoidal, rotary, ALiBi and none
(NoPE: a causal model can still count the keys it sees). Every arm trains on windows of T
characters and is scored, as Press et al. do, by *non-overlapping* evaluation: the same stretch
of validation text cut into windows of T, 2T, 4T and 8T characters, every position of every
window scored. A longer window gives its later characters more context, so a model that
extrapolates gets *better* with length (what Press et al. call the "early token curse" of short
windows); one that does not gets worse.

Every model is built with max_len = 8T. The learned arm's table therefore has rows for positions
T+1 .. 8T, but they only ever hold their random initialisation: no gradient reaches a row that is
never looked up, and embeddings get no weight decay. Its long-window scores measure what a table
of untrained rows does, which is the note's point ("unseen index").

Shapes: N windows, B batch, T training length, L evaluation length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.lab.kit import lm_arms as la
from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.gating import Gated
from attnlab.lab.kit.lm_arms import UNIT, Arm, Check, not_worse, worse
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import bands, spread_text

KINDS = ("learned", "sinusoidal", "rotary", "alibi", "none")
MULTIPLES = (1, 2, 4, 8)  # evaluation lengths, in units of the training length T
STYLES = (
    ("o", "-", 9),
    ("s", "--", 7),
    ("D", "-.", 6),
    ("^", ":", 8),
    ("v", "-", 5),
)  # the kinds' markers and dashes
ARMS = [Arm(kind, (("positional", kind),), multiples=MULTIPLES) for kind in KINDS]
COST = (
    "Full run: `attnlab experiment lm_extrapolation --seed 0 --data ../shared/data`. Estimate "
    "for 2 idle cores from a single-thread probe (27 Nov 2026, kit.lm_arms recipe: CPU time, "
    "time.process_time, of 50 and 250 training steps of each arm on tinyshakespeare, the "
    "difference over 200 steps, the machine shared with other jobs, so +-30 %: the same arm "
    "measured 13-20 ms in different experiments): 12.9, 16.5, 20.5, 18.9 and 19.7 ms per step "
    "for learned, sinusoidal, rotary, ALiBi and none (88.5 ms summed), ~3 s per run to score "
    "the four lengths. Each arm trains 7 x 5000 steps (3 sweep rates, 2 more seeds, a "
    "doubling of 10000 steps on the first seed; 8 x with one grid extension, 9 x with two): "
    "52-66 min of CPU plus ~2 min of scoring: about 27-35 min on both cores."
)
CLAIM = (
    "As the (validation-set's) input sequence gets longer, current position methods "
    "(sinusoidal, rotary, and T5) show degraded perplexity, but our method [ALiBi] does not. "
    "(004:) Learned embedding is well suited if the maximum value of the index is known. "
    "Otherwise, in the case where unseen index can occur in test time, a pre-defined function "
    "might be preferred."
)
SOURCE = (
    "Press et al. 2022, 'Train Short, Test Long', Fig. 1 caption; 004 'Position "
    "representations' (eq. 15-16)"
)
FINDINGS = [
    "The learned table's rows past T are untrained (random initialisation): its long-window "
    "numbers say what unseen indices cost a learned table, not what a trained longer table "
    "would do.",
    "Non-overlapping evaluation scores every position of each window: at 1x the average "
    "prediction sees T/2 characters of context, at 8x about 4T, so a scheme that extrapolates "
    "improves with length.",
]


def measure(quick: bool, seed: int, data: Path | None) -> dict[str, Any]:
    """Every position kind gated (rate swept on the first seed, 3 seeds, doubling) and scored
    at every evaluation length; plain numbers, no prose."""
    m = la.measure_arms(ARMS, quick, seed, data)
    m["lengths"] = ARMS[0].lengths(la.SIZE[quick].context)
    return m


def _loss(g: Gated, i: int) -> list[float]:
    """nats/char of every seed at the i-th evaluation length."""
    return [r["by_length"][i] for r in g.runs]


def checks(gated: dict[str, Gated]) -> list[Check]:
    """The claim's checks at every longer length (2x .. 8x), each against the seed spread:
    ALiBi not worse than at 1x; sinusoidal and rotary worse than at 1x (Press et al.);
    sinusoidal better than learned (004)."""
    out = []
    for i, m in enumerate(MULTIPLES[1:], start=1):
        base = {k: _loss(gated[k], 0) for k in KINDS}
        at = {k: _loss(gated[k], i) for k in KINDS}
        out += [
            not_worse(f"ALiBi at {m}x no worse than at 1x", at["alibi"], base["alibi"]),
            worse(f"sinusoidal at {m}x worse than at 1x", at["sinusoidal"], base["sinusoidal"]),
            worse(f"rotary at {m}x worse than at 1x", at["rotary"], base["rotary"]),
            worse(f"learned worse than sinusoidal at {m}x (004)", at["learned"], at["sinusoidal"]),
        ]
    return out


def write_up(measured: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """The report of :func:`measure`'s numbers: tables, figure, gate and verdict."""
    m = measured
    gated = la.gated_runs(m)
    found = checks(gated)
    reason = _reason(gated, m, found)
    rows = Table(f"{UNIT} by evaluation length (mean (min-max) over seeds)", _rows(gated, m))
    return la.arm_report(
        PAPER,
        m,
        quick,
        (found, reason),
        _setup(m),
        [rows],
        figures=[_figure(gated, m, out_dir)],  # fmt: skip
        per_seed={
            k: {str(n): _loss(g, i) for i, n in enumerate(m["lengths"])} for k, g in gated.items()
        },  # fmt: skip
        metrics={
            "loss": {k: bands([r["by_length"] for r in g.runs])[0] for k, g in gated.items()},
            "lengths": m["lengths"],
            "unigram": m["unigram"],
            "bigram": m["bigram"],
        },
        findings=FINDINGS,
    )


THRESHOLDS = [
    Threshold(
        "ALiBi extrapolates",
        "loss at 2x, 4x and 8x T not above its 1x value (seed ranges deciding)",
        "Press et al. 2022, Fig. 1: ALiBi's perplexity does not degrade as the input gets longer",
    ),
    Threshold(
        "sinusoidal and rotary do not",
        "loss at 2x, 4x and 8x T above their 1x value, seed ranges apart",
        "Press et al. 2022, Fig. 1: 'sinusoidal, rotary, and T5 show degraded perplexity'",
    ),
    Threshold(
        "a pre-defined function is preferred for unseen indices",
        "sinusoidal below learned at 2x, 4x and 8x T, seed ranges apart",
        "004 'Position representations': 'in the case where unseen index can occur in test "
        "time, a pre-defined function might be preferred'",
    ),
]


def _reason(gated: dict[str, Gated], m: dict[str, Any], found: list[Check]) -> str:
    last = len(MULTIPLES) - 1
    text = "; ".join(
        f"{k} {spread_text(_loss(g, 0))} -> {spread_text(_loss(g, last))}" for k, g in gated.items()
    )
    held = sum(c.state == "held" for c in found)
    unresolved = sum(c.state == "unresolved" for c in found)
    return (
        f"validation {UNIT} at 1x -> {MULTIPLES[-1]}x the training length "
        f"(T = {m['lengths'][0]}, mean (min-max) over {len(m['seeds'])} seed(s)): {text}. "
        f"{held} of {len(found)} checks held, {unresolved} unresolved (inside the seed spread)."
    )


def _rows(gated: dict[str, Gated], m: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for kind, g in gated.items():
        row: dict[str, Any] = {"positions": kind, "lr": g.chosen}
        row |= {f"{n} ({k}x)": spread_text(_loss(g, i))
                for i, (n, k) in enumerate(zip(m["lengths"], MULTIPLES))}  # fmt: skip
        row[f"train {UNIT}"] = spread_text(g.values("train"))
        rows.append(row)
    return rows


def _setup(m: dict[str, Any]) -> list[str]:
    return [
        f"max_len {m['lengths'][-1]} for every arm (8T), so a learned table has rows it never "
        "trains.",
        "Evaluation (Press et al.'s non-overlapping evaluation): the same stretch of validation "
        f"text ({m['lengths'][-1]}-character multiples) cut into windows of "
        f"{', '.join(str(n) for n in m['lengths'])} characters; every position of every window "
        "is scored.",
        "'none' (NoPE) is gated and drawn like the others; no check of the claim rests on it.",
    ]


def _figure(gated: dict[str, Gated], m: dict[str, Any], out_dir: Path) -> FigureRef:
    n = len(m["seeds"])
    fig = seeds_chart(
        {k: (m["lengths"], [r["by_length"] for r in g.runs]) for k, g in gated.items()},
        xlabel="evaluation length (characters; log scale)",
        ylabel=f"validation loss ({UNIT})",
        title=f"train on T = {m['lengths'][0]}, test longer ({n} seed{'s' if n > 1 else ''})",
        logx=True,
        vline=m["lengths"][0],
    )
    ax = fig.axes[0]
    ax.set_xticks(m["lengths"], [str(x) for x in m["lengths"]])
    ax.minorticks_off()
    for line, (marker, dash, size) in zip(ax.get_lines(), STYLES):  # the kinds' lines, in order
        line.set(marker=marker, linestyle=dash, markersize=size, fillstyle="none")
    ax.legend(fontsize=8)
    return save_chart(
        fig,
        out_dir,
        "extrapolation.png",
        f"Validation loss ({UNIT}) against the evaluation window (log x; the dashed line is the "
        "training length T), one line per position scheme at its chosen learning rate: mean "
        "over seeds with a min-max band; each line has its own marker and dash, so lines that "
        "coincide stay visible.",
    )


PAPER = la.Paper("lm_extrapolation", "Train short, test long: char-LM loss at 1x-8x the "
                 "training length", CLAIM, SOURCE, THRESHOLDS, COST)  # fmt: skip


@experiment("lm_extrapolation", notes="004 'Position representations'; Press et al. 2022")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """A char LM trained on windows of T characters and scored on windows of 2T-8T: ALiBi does
    not degrade, sinusoidal and rotary positions do (Press et al. 2022, Fig. 1), and a
    pre-defined function (sinusoids) beats a learned table when unseen indices occur (004)."""
    return write_up(measure(quick, seed, data), out_dir, quick)
