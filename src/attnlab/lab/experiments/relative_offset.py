"""Experiment ``relative_offset``: sinusoidal positions permit attending by relative offset (004).

004 eq. 16 defines PE(n, 2i) = sin(n w_i), PE(n, 2i+1) = cos(n w_i) with w_i = 1 / 10000^(2i/d),
and quotes Vaswani et al. 2017: "we hypothesized it would allow the model to easily learn to
attend by relative positions". The reason Vaswani et al. give (sec. 3.5): for any fixed offset k,
PE(n + k) is a linear function of PE(n). Per frequency pair it is a rotation by the angle k w_i:

    [sin((n+k) w)]   [ cos(k w)  sin(k w)] [sin(n w)]
    [cos((n+k) w)] = [-sin(k w)  cos(k w)] [cos(n w)],      PE(n + k) = M_k PE(n)   (all n)

with M_k block-diagonal and independent of n. Two parts:

(a) exact: M_k built from the frequencies, applied to the library's table
    (:func:`attnlab.nn.positional.sinusoidal_table`, float64) on two windows of n far apart (the
    same M_k for every n), checked to be orthogonal and to compose (M_k = M_1^k).
(b) learned: a one-layer, one-head decoder (causal attention, frozen sinusoids added to the token
    embeddings) is trained on sequences of ``LENGTH`` random symbols to output, at position t,
    the symbol x_{t-k}. A head that attends by relative offset does the same at absolute
    positions it never saw: the test feeds the same kind of sequence at positions o .. o+T-1 for
    window starts o beyond the training length (the model gets the positions explicitly, so the
    window holds as many keys as in training). The contrast arm has learned absolute positions,
    whose rows past the training length are never trained.

Every (positions, k) arm is gated (:func:`attnlab.lab.kit.gating.train_gated`): a learning-rate
sweep on the first seed scored by validation loss at the training positions, extended past an
edge, the other seeds at the chosen rate, and the first seed again at twice the steps (its
validation accuracy at the training positions may move by at most ``TOLERANCE``).

Shapes: N sequences, B batch, T length, V symbols, D d_model.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import dodged, integer_xticks, line_chart, save_chart
from attnlab.lab.kit.fit import FitConfig, fit
from attnlab.lab.kit.loss_gate import first_doubling, gated_by_loss, sweep_rows
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import bands, resolved, spread, spread_text
from attnlab.lab.kit.verdict import Competence, Doubling, outcome
from attnlab.models import build_model
from attnlab.nn.positional import sinusoidal_table

KINDS = ("sinusoidal", "learned")
OFFSETS_K = {True: (2,), False: (1, 2, 4)}  # k: the output at t is x_{t-k}
LENGTH = 32  # training sequence length T (positions 0 .. T-1)
STARTS = (0, 1, 2, 4, 7)  # evaluation windows start at o = s * T (0: the training positions)
SYMBOLS = 16  # V; chance = 1 / V
D_MODEL = 64
STEPS = {True: 60, False: 1500}
SIZES = {True: (1000, 200), False: (20000, 500)}  # training and validation/test sequences
LRS = {True: (1e-3, 3e-3, 1e-2), False: (1e-3, 3e-3, 1e-2)}  # extended past an edge (x3)
TOLERANCE = 0.01  # step doubling: validation accuracy at the training positions
COMPETENT = 0.99  # validation accuracy at the training positions, every seed
GENERALISES = 0.9  # accuracy at unseen positions that counts as "attends by relative offset"
EXACT = 1e-10  # float64 bound on |M_k PE(n) - PE(n + k)|
EXACT_D = (64, 512)  # widths of the exact check (512: Vaswani's d_model)
EXACT_N = 2000  # positions n = 0 .. N-1 of the exact check
EXACT_K = (1, 2, 5, 17, 100, -3)
FAR = 10_000  # the second window of n starts here
COST = (
    "Full run: 2 position kinds x 3 offsets k = 6 arms, each a 3-rate sweep on seed 0 (+ up to "
    "2 rates past an edge), 2 more seeds and one 2x-steps doubling: 7 run-equivalents of 1500 "
    "steps (batch 64, one layer, d_model 64) per arm, 42 in all. Probe: 10 ms of CPU time per "
    "step on one thread (300 steps of each kind, data and evaluation included; "
    "time.process_time, because the machine was shared: wall time was 3x that), so 42 x 15 s "
    "= ~11 min of CPU, ~6 min on 2 idle cores (~9 min with every grid extended). "
    "Command: attnlab experiment relative_offset --seed 0"
)
SETUP = [
    f"Task: sequences of {LENGTH} symbols drawn uniformly from {SYMBOLS}; the target at "
    "position t >= k is x_{t-k} (positions t < k carry no target). Each seed draws its own "
    "data and initialisation.",
    f"Model: decoder (causal), 1 layer, 1 head, d_model {D_MODEL}, d_ff {D_MODEL}, pre-norm, "
    "untied read-out; positions 'sinusoidal' (004 eq. 16, fixed, added to the token "
    f"embeddings) or 'learned' (a trained table of {LENGTH * (STARTS[-1] + 1)} rows, of which "
    f"only the first {LENGTH} are ever used in training). AdamW, batches of 64, warm-up + "
    "cosine.",
    "Test: fresh sequences fed at positions o .. o+T-1 for window starts o = "
    + ", ".join(f"{s * LENGTH}" for s in STARTS)
    + " (o = 0: the training positions; every other window is made of positions never seen).",
    "Exact part: M_k from the frequencies; PE from attnlab.nn.positional.sinusoidal_table in "
    f"float64 on n = 0 .. {EXACT_N - 1} and n = {FAR} .. {FAR + EXACT_N - 1}, d in {EXACT_D}; "
    "M_k against M_1^k (offsets compose) and M_k^T M_k against I.",
    "One torch thread per run.",
]
THRESHOLDS = [
    Threshold(
        "exact: max |M_k PE(n) - PE(n + k)| over both windows of n, |M_1^k - M_k|, |M_k^T M_k - I|",
        f"< {EXACT:g} (float64)",
        "Vaswani et al. 2017 sec. 3.5: 'for any fixed offset k, PE_{pos+k} can be represented "
        "as a linear function of PE_{pos}' (the reason behind the hypothesis 004 quotes)",
    ),
    Threshold(
        "sinusoidal arms' accuracy at unseen absolute positions (every window past the "
        "training length, every seed, every k)",
        f">= {GENERALISES:g} (chance 1/{SYMBOLS})",
        "004 sec. 'Position encoding': 'it would allow the model to easily learn to attend by "
        "relative positions' (no number in the note; the lab's bar)",
    ),
    Threshold(
        "contrast: sinusoidal above learned absolute positions at unseen positions",
        "seed ranges apart, for every k",
        "004: learned tables suit a known maximum index; 'in the case where unseen index can "
        "occur in test time, a pre-defined function might be preferred'",
    ),
    Threshold(
        "competence: validation accuracy at the training positions",
        f">= {COMPETENT:g} on every seed, step doubling within {TOLERANCE:g}",
        "the lab's gate (docs/experiments/README.md)",
    ),
]
CLAIM = (
    "A popular choice of such pre-defined functions is the sinusoid embedding [...] The "
    "authors of Vaswani et al. [2017] did not give a formal justification of this approach and "
    "instead stated that \u201cwe hypothesized it would allow the model to easily learn to "
    "attend by relative positions\u201d."
)


# (a) exact ---------------------------------------------------------------------------------------
def frequencies(d: int, base: float = 10000.0) -> Tensor:
    """w_i = 1 / base^(2i/d), i = 0 .. d/2 - 1 (004 eq. 16): (d/2,) float64."""
    return torch.exp(-math.log(base) * torch.arange(0, d, 2, dtype=torch.float64) / d)


def rotation(k: int, d: int, base: float = 10000.0) -> Tensor:
    """M_k (d, d) float64: block i maps (sin n w_i, cos n w_i) to (sin (n+k) w_i, cos (n+k) w_i)."""
    if d % 2:
        raise ValueError(f"d={d} must be even: the sinusoids come in (sin, cos) pairs")
    angle = k * frequencies(d, base)  # (d/2,)
    c, s = torch.cos(angle), torch.sin(angle)
    m = torch.zeros(d, d, dtype=torch.float64)
    idx = torch.arange(0, d, 2)
    m[idx, idx], m[idx, idx + 1] = c, s
    m[idx + 1, idx], m[idx + 1, idx + 1] = -s, c
    return m


def shift_error(k: int, d: int, start: int) -> float:
    """max |M_k PE(n) - PE(n + k)| over n = start .. start + EXACT_N - 1 (float64)."""
    n = torch.arange(start, start + EXACT_N)
    pe = sinusoidal_table(n, d, dtype=torch.float64)  # (N, d)
    shifted = sinusoidal_table(n + k, d, dtype=torch.float64)  # (N, d)
    return float((pe @ rotation(k, d).T - shifted).abs().max())


def exact_check(d: int, k: int) -> dict[str, float]:
    """The identity on two windows of n (the same M_k for every n), M_k = M_1^k (offsets
    compose), and |M_k^T M_k - I| (a rotation)."""
    m, one = rotation(k, d), rotation(1, d)
    power = torch.linalg.matrix_power(one, abs(k))
    power = power if k >= 0 else power.T  # M_{-k} = M_k^{-1} = M_k^T
    eye = torch.eye(d, dtype=torch.float64)
    return {
        "d": d,
        "k": k,
        f"max error, n < {EXACT_N}": shift_error(k, d, 0),
        f"max error, n >= {FAR}": shift_error(k, d, FAR),
        "max |M_1^k - M_k|": float((power - m).abs().max()),
        "max |M_k^T M_k - I|": float((m.T @ m - eye).abs().max()),
    }


# (b) learned -------------------------------------------------------------------------------------
def offset_task(n: int, k: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """ids (N, T) uniform symbols and targets (N, T): x_{t-k} at t >= k, -100 before."""
    ids = torch.randint(0, SYMBOLS, (n, LENGTH), generator=gen)
    targets = torch.full_like(ids, -100)
    targets[:, k:] = ids[:, :-k]
    return ids, targets


def model_of(kind: str) -> nn.Module:
    cfg = ModelConfig(kind="decoder_lm", vocab_size=SYMBOLS, d_model=D_MODEL, n_heads=1,
                      n_layers=1, d_ff=D_MODEL, max_len=LENGTH * (STARTS[-1] + 1),
                      positional=kind, tie_embeddings=False)  # fmt: skip
    return build_model(cfg)


def offset_loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    """Cross-entropy of the symbol k back, at the training positions 0 .. T-1."""
    ids, targets = batch
    logits = model(ids).logits  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


@torch.no_grad()
def window_accuracy(model: nn.Module, ids: Tensor, targets: Tensor, start: int) -> float:
    """Accuracy of the symbol k back with the sequence placed at positions start .. start+T-1."""
    model.eval()
    positions = torch.arange(start, start + LENGTH)  # (T,)
    pred = model(ids, positions=positions).logits.argmax(-1)  # (N, T)
    keep = targets != -100
    return float((pred[keep] == targets[keep]).float().mean())


def train_job(job: tuple[str, float, int, int], quick: bool) -> dict[str, Any]:
    """One arm ("KIND k=K") at one rate for ``steps`` steps on one seed: validation loss and
    accuracy at the training positions, test accuracy per window start."""
    arm, lr, steps, seed = job
    kind, k = arm.split(" k=")[0], int(arm.split(" k=")[1])
    n_train, n_test = SIZES[quick]
    gen = torch.Generator().manual_seed(seed * 1000 + int(k))
    train, val, test = (offset_task(n, int(k), gen) for n in (n_train, n_test, n_test))
    torch.manual_seed(seed)
    model = model_of(kind)
    cfg = FitConfig(steps=steps, batch_size=64, lr=lr, warmup_steps=max(5, steps // 20))
    result = fit(model, train, offset_loss, cfg, seed=seed)
    with torch.no_grad():
        model.eval()
        val_loss = float(offset_loss(model, val))
    return {
        "val_loss": val_loss if not result.diverged and math.isfinite(val_loss) else math.inf,
        "val_acc": window_accuracy(model, *val, 0),
        "by_start": [window_accuracy(model, *test, s * LENGTH) for s in STARTS],
        "seconds": result.seconds,
    }


def arm_names(quick: bool) -> list[str]:
    return [f"{kind} k={k}" for kind in KINDS for k in OFFSETS_K[quick]]


def measure(quick: bool, seed: int, data: Path | None = None) -> dict[str, Any]:
    """The exact check for every (d, k); every arm gated and trained on every seed. ``data`` is
    unused (the task is generated)."""
    runs = gated_by_loss(partial(train_job, quick=quick), arm_names(quick), quick, seed,
                         grid=LRS[quick], steps=STEPS[quick],
                         chosen_on="validation loss at the training positions, seed 0")  # fmt: skip
    return {"exact": [exact_check(d, k) for d in EXACT_D for k in EXACT_K], **runs}


# Write-up ----------------------------------------------------------------------------------------
def unseen(result: dict[str, Any]) -> float:
    """The lowest accuracy over the windows past the training length."""
    return min(result["by_start"][1:])


def exact_error(m: dict[str, Any]) -> float:
    return max(v for row in m["exact"] for key, v in row.items() if key not in ("d", "k"))


def competence(m: dict[str, Any]) -> list[Competence]:
    """Every arm: validation accuracy at the training positions on every seed, its swept rate
    and its step doubling on the first seed."""
    out = []
    for arm in m["arms"]:
        vals = [r["val_acc"] for r in m["per"][arm]]
        doubling = _doubling(m, arm)
        out.append(Competence(arm, "validation accuracy at the training positions",
                              COMPETENT, vals, lr=m["lr"][arm], doubling=doubling))  # fmt: skip
    return out


def _doubling(m: dict[str, Any], arm: str) -> Doubling:
    what = "validation accuracy at the training positions"
    return first_doubling(m, arm, "val_acc", TOLERANCE, what)


def verdict(m: dict[str, Any]) -> tuple[list[bool], str]:
    """The claim's three checks: the exact identity, sinusoids generalising to unseen
    positions, and the contrast with learned positions (resolved)."""
    ks = sorted({int(a.split("k=")[1]) for a in m["arms"]})
    low = {a: [unseen(r) for r in m["per"][a]] for a in m["arms"]}
    error = exact_error(m)
    sin_ok = all(min(low[f"sinusoidal k={k}"]) >= GENERALISES for k in ks)
    apart = all(
        resolved(low[f"sinusoidal k={k}"], low[f"learned k={k}"])
        and min(low[f"sinusoidal k={k}"]) > max(low[f"learned k={k}"])
        for k in ks
    )
    reason = (
        f"PE(n+k) = M_k PE(n) holds to {error:.1e} in float64 for every tested k, with one M_k "
        f"(a rotation per frequency pair) on n < {EXACT_N} and on n >= {FAR}; trained "
        "to output x_(t-k), the one-head decoder with sinusoids reaches at unseen absolute "
        "positions (worst window) "
        + "; ".join(f"k={k}: {spread_text(low[f'sinusoidal k={k}'])}" for k in ks)
        + ", against learned positions "
        + "; ".join(f"k={k}: {spread_text(low[f'learned k={k}'])}" for k in ks)
        + f" (chance {1 / SYMBOLS:.3f}; bar {GENERALISES:g})."
    )
    return [error < EXACT, sin_ok, apart], reason


def _result_rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for arm in m["arms"]:
        runs = m["per"][arm]
        row: dict[str, Any] = {"arm": arm, "lr": m["lr"][arm].chosen}
        for i, s in enumerate(STARTS):
            row[f"accuracy, positions from {s * LENGTH}"] = spread_text(
                [r["by_start"][i] for r in runs]
            )
        row["train s"] = spread(  # mean over seeds
            [r["seconds"] for r in runs]
        )["mean"]
        rows.append(row)
    return rows


def _figure(m: dict[str, Any], out_dir: Path) -> FigureRef:
    xs = [s * LENGTH for s in STARTS]
    series, spreads = {}, {}
    n = len(m["arms"])
    for i, arm in enumerate(m["arms"]):
        mean, lo, hi = bands([r["by_start"] for r in m["per"][arm]])
        shifted = dodged(xs, i, n)
        series[arm] = (shifted, mean)
        if len(m["per"][arm]) > 1:
            spreads[arm] = (lo, hi)
    title = f"attend k back at unseen positions ({len(m['seeds'])} seed(s))"
    fig = line_chart(series, bands=spreads, xlabel="first absolute position of the window",
                     ylabel="accuracy of x_(t-k)", hline=1 / SYMBOLS, vline=LENGTH - 0.5,
                     title=title)  # fmt: skip
    integer_xticks(fig, xs)
    caption = (
        "Accuracy of outputting x_(t-k) on fresh sequences placed at positions o .. o+"
        f"{LENGTH - 1}, against the window start o (mean over seeds, min-max band; the series "
        "are shifted sideways a little so that overlapping ones stay visible). The dashed "
        f"vertical line ends the training positions (0 .. {LENGTH - 1}); the dashed "
        "horizontal line is chance (1/V)."
    )
    return save_chart(fig, out_dir, "accuracy_by_position.png", caption)


def write_up(m: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """The report of :func:`measure`'s numbers: tables, the figure, the gated verdict."""
    checks, reason = verdict(m)
    n_train, n_test = SIZES[quick]
    low = {a: [unseen(r) for r in m["per"][a]] for a in m["arms"]}
    return Report(
        name="relative_offset",
        title="Relative offset: PE(n+k) is a rotation of PE(n); does a head use it?",
        claim=CLAIM,
        source="004 'Position encoding', eq. 16; Vaswani et al. 2017 sec. 3.5",
        setup=[
            *SETUP,
            f"{n_train} training sequences, {n_test} validation and {n_test} test "
            f"sequences per seed; {m['steps']} steps per run.",
            *([] if quick else [COST]),
        ],  # fmt: skip
        thresholds=THRESHOLDS,
        tables=[
            Table("exact: PE(n + k) = M_k PE(n) in float64", m["exact"]),
            Table("accuracy by window start (mean (min-max) over seeds)", _result_rows(m)),
            Table("learning-rate sweep (seed 0)", sweep_rows(m, m["arms"])),
        ],
        figures=[_figure(m, out_dir)],
        **outcome(checks, reason, competence(m), m["seeds"], quick, arms=list(m["arms"])),
        per_seed={"unseen accuracy": low},
        metrics={
            "exact_error": exact_error(m),
            "unseen": {a: spread(v)["mean"] for a, v in low.items()},
        },  # fmt: skip
        findings=[
            f"The identity is exact: the one M_k maps PE(n) to PE(n + k) on n < {EXACT_N} and on "
            f"n >= {FAR} alike, is orthogonal and equals M_1^k: relative offset is *available* "
            "to a linear map of the sinusoids.",
            "Whether a trained head *uses* it is a separate question: a head that scores keys "
            "by their offset alone would keep its accuracy in every window; a head that learned "
            "the training positions' absolute pattern (q_t . k_s through PE(t) and PE(s) "
            "separately) loses it where those positions were never seen.",
        ],
    )


@experiment("relative_offset", notes="004 eq. 16 'Position encoding'")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Sinusoidal positions permit attending by relative offset: PE(n + k) is a fixed linear map
    (a rotation per frequency pair) of PE(n), for every n; a one-head model with sinusoids,
    trained to attend k back, does so at absolute positions it never saw, unlike learned
    positions."""
    return write_up(measure(quick, seed, data), out_dir, quick)
