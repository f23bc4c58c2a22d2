"""Experiment ``qkv``: does self-attention need learned query, key and value projections, or does
001's parameter-free form do (001 "Basic Self-Attention", "1. Queries, Keys and Values"; 000
"The key-query-value self-attention mechanism")?

    parameter-free (001)   w'_ij = x_i^T x_j / sqrt(d),  y_i = sum_j softmax_j(w'_ij) x_j
    learned (001, 000)     w'_ij = (W_q x_i)^T (W_k x_j) / sqrt(d),  y_i = sum_j w_ij W_v x_j

001's argument: "each input vector must play all three roles" -- query, key and value -- and the
projections let it "modify the incoming vectors to suit the three roles they must play". One
consequence is exact: without projections the scores are a Gram matrix, symmetric and positive
semi-definite, and x_i^T x_j <= (|x_i|^2 + |x_j|^2) / 2, so a query can prefer another key over
itself only by pointing at a longer vector, and two tokens can never both prefer each other: a
causal query's weight drifts to its own position.

Arms: the lab's character LM (:mod:`attnlab.lab.kit.lm_arms`) with attention that has
``ModelConfig(qkv_proj=False)`` (q = k = v = x) or the usual fused [W_q | W_k | W_v], at 1 head
(001's setting) and 4 heads (head h reads the slice h of x as its query, key and value); no W^O
in any arm (``out_proj=False``), so the two arms of a head count differ by W_q, W_k, W_v alone.
Pre-norm: the attention reads LN(x), whose gain g is shared by query, key and value (a diagonal,
symmetric map: the Gram structure stays). Every arm, the parameter-free ones (whose failure is
the claim) included, gets the same learning-rate sweep (bracketed) and step doubling.

Checks: (1) at each head count, validation loss with learned projections below the
parameter-free arm, seed ranges apart; (2) the mechanism, at 1 head: the self-weight (mean A_tt
of a query on its own position, t >= 1, held-out windows) of the parameter-free arm above the
learned arm's, seed ranges apart; (3) the copy task (:mod:`attnlab.lab.kit.copy_task`), where
the copy of x_k must attend to x_{k+1} -- a token unlike the query, found by the key *after* the
earlier x_k (an induction head, which needs W_q != W_k): per-token accuracy with learned
projections above the parameter-free arm, seed ranges apart. Both copy arms are gated alike
(criterion: twice a uniform guess, a swept rate, the doubling).

Shapes: B batch, T context, D d_model, H heads.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.config import ModelConfig
from attnlab.lab.kit import lm_arms as la
from attnlab.lab.kit.charts import bar_chart, save_chart
from attnlab.lab.kit.copy_task import FIRST_SYMBOL, copy_accuracy, copy_examples, copy_loss
from attnlab.lab.kit.fit import FitConfig, fit
from attnlab.lab.kit.gating import Gated, Sweep, gate_arms, sweep_rows
from attnlab.lab.kit.lm_arms import UNIT, Check, worse
from attnlab.lab.kit.registry import experiment
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import spread, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence
from attnlab.models import build_model

HEADS = {True: (1,), False: (1, 4)}
FORMS = ("learned Q, K, V", "q = k = v = x")
# The copy task (kit.copy_task): "<bos> x_1 .. x_n | x_1 .. x_n <eos>", n <= COPY_N_MAX distinct
# symbols; at the copy of x_k the model must attend to x_{k+1}, a token unlike the query.
COPY_N_MAX, COPY_SYMBOLS = 8, 16
# A probe (seed 0, lr 3e-3, 1500 steps): per-token copy accuracy 1.0 learned, 0.94 parameter-free.
COPY_STEPS = {True: 30, False: 4000}
COPY_FLOOR = 2 / COPY_SYMBOLS  # competence: twice a uniform guess over the symbols
COPY_SWEEP = Sweep(
    grid=(1e-3, 3e-3, 1e-2),
    tolerance=0.02,
    metric="validation copy error (1 - per-token accuracy)",
    metric_key="error",
    doubling_seeds=1,
)
QUICK_COPY_SWEEP = COPY_SWEEP.quick(grid=(1e-3, 3e-3))


def _name(form: str, heads: int) -> str:
    return f"{form}, {heads} head{'s' if heads > 1 else ''}"


def arms(quick: bool) -> list[la.Arm]:
    return [
        la.Arm(
            _name(form, h),
            (("n_heads", h), ("out_proj", False))
            + ((("qkv_proj", False),) if form == FORMS[1] else ()),
        )
        for h in HEADS[quick]
        for form in FORMS
    ]


CLAIM = (
    "Every input vector x_i is used in three different ways in the self attention operation [...] "
    "These roles are often called the query, the key and the value. In the basic self-attention "
    "we've seen so far, each input vector must play all three roles. We make its life a little "
    "easier by deriving new vectors for each role, by applying a linear transformation to the "
    "original input vector. [...] This gives the self-attention layer some controllable "
    "parameters, and allows it to modify the incoming vectors to suit the three roles they must "
    "play. (001)\n"
    "The use of matrices K, Q, V intuitively allow us to use different views of the x_i for the "
    "different roles of key, query, and value. (000)"
)
SOURCE = (
    "001 'Basic Self-Attention' and 'Self-Attention in Transformers: 1. Queries, Keys and "
    "Values'; 000 'The key-query-value self-attention mechanism'"
)
THRESHOLDS = [
    Threshold(
        "learned projections help ('makes its life a little easier')",
        "validation loss with W_q, W_k, W_v below q = k = v = x, seed ranges apart, at 1 and 4 "
        "heads",
        "001 '1. Queries, Keys and Values' (no number given: ranges apart is the lab's bar)",
    ),
    Threshold(
        "without projections a query leans on itself ('each input vector must play all three "
        "roles')",
        "self-weight (mean A_tt, t >= 1) of q = k = v = x above learned, seed ranges apart, 1 head",
        "001 'Basic Self-Attention' (w'_ij = x_i^T x_j; x_i^T x_j <= (|x_i|^2 + |x_j|^2) / 2 "
        "by Cauchy-Schwarz)",
    ),
    Threshold(
        "a query must find a token unlike itself (the copy task's x_{k+1})",
        "copy accuracy with W_q, W_k, W_v above q = k = v = x, seed ranges apart",
        "001 '1. Queries, Keys and Values' (a vector is compared as a query and as a key in "
        "different roles); no number given: ranges apart is the lab's bar",
    ),
]
COST = (
    "Full run: `attnlab experiment qkv --seed 0 --data ../shared/data`. Estimate for 2 idle "
    "cores from a single-thread probe (27 Nov 2026, kit.lm_arms recipe: CPU time, "
    "time.process_time, of 50 and 250 training steps of each arm on tinyshakespeare, the "
    "difference over 200 steps, the machine shared with other jobs, so +-30 %: the same arm "
    "measured 13-20 ms in different experiments): 16.7 and 13.5 ms per step at 1 head, 15.3 "
    "and 12.2 at 4 heads (learned, parameter-free); the copy task arms (unchanged: 18.9 and "
    "15.5 ms per step, an earlier probe) train 7 x 4000 steps. Each character-LM arm trains "
    "7 x 5000 steps (3 sweep rates, 2 more seeds, a doubling of 10000 steps on the first "
    "seed; 8 x with one grid extension, 9 x with two): 34-43 min of CPU for the character "
    "LM and 16-21 for the copy task: about 25-32 min on both cores."
)


def _copy_split(seed: int, quick: bool) -> tuple[tuple[torch.Tensor, ...], ...]:
    """(train, validation) copy examples of one seed: (ids (N, T), targets (N, T - 1)) each."""
    rng = np.random.default_rng([seed, 7])

    def make(n: int) -> tuple[torch.Tensor, ...]:
        return copy_examples(n, rng.integers(1, COPY_N_MAX + 1, n), COPY_SYMBOLS, rng)

    return make(2000 if quick else 20000), make(400)


def copy_job(job: tuple) -> dict[str, Any]:
    """One form on the copy task at a rate for ``scale`` x the steps (a gate_arms job): a
    2-layer decoder, d_model 64, 4 heads, no W^O; its validation per-token copy accuracy."""
    form, lr, scale, seed, quick, _ = job
    train, val = _copy_split(seed, quick)
    torch.manual_seed(seed)
    cfg = ModelConfig(kind="decoder_lm", vocab_size=FIRST_SYMBOL + COPY_SYMBOLS, d_model=64,
                      n_heads=4, n_layers=2, max_len=2 * COPY_N_MAX + 3, out_proj=False,
                      qkv_proj=form == FORMS[0])  # fmt: skip
    model = build_model(cfg)
    n = COPY_STEPS[quick] * scale
    fit_cfg = FitConfig(steps=n, batch_size=64, lr=lr, warmup_steps=n // 10, min_lr=lr / 10)
    result = fit(model, train, copy_loss, fit_cfg, seed=seed)
    accuracy = 0.0 if result.diverged else copy_accuracy(model, *val)[0]
    return {"error": 1.0 - accuracy, "accuracy": accuracy, "self_weight": la.self_weight(
        model, val[0][:, :-1])}  # fmt: skip


def measure(quick: bool, seed: int, data: Path | None = None) -> dict[str, Any]:
    """Every (form, head count) on the character LM and both forms on the copy task, gated and
    trained on every seed (plain numbers, no prose)."""
    m = la.measure_arms(arms(quick), quick, seed, data)
    m["heads"] = list(HEADS[quick])
    sweep = QUICK_COPY_SWEEP if quick else COPY_SWEEP
    copy = gate_arms(copy_job, FORMS, sweep, start_seeds(seed, quick), quick, None)
    m["copy"] = {f"copy task: {f}": asdict(g) for f, g in copy.items()}
    m["copy_steps"] = COPY_STEPS[quick]
    return m


def _copy_competence(m: dict[str, Any], quick: bool) -> list[Competence]:
    """Both forms on the copy task: above twice a uniform guess on every seed (it learned
    something of the task), at a swept rate, with the doubling of the copy error."""
    sweep = QUICK_COPY_SWEEP if quick else COPY_SWEEP
    criterion = (
        f"validation per-token copy accuracy at least twice a uniform guess over the "
        f"{COPY_SYMBOLS} symbols"
    )
    return [
        g.competence(name, criterion, COPY_FLOOR, sweep, m["copy_steps"], key="accuracy")
        for name, g in _copy_runs(m).items()
    ]


def _copy_runs(m: dict[str, Any]) -> dict[str, Gated]:
    return {name: Gated(**g) for name, g in m["copy"].items()}


def _copy_values(m: dict[str, Any], form: str, key: str) -> list[float]:
    return [r[key] for r in m["copy"][f"copy task: {form}"]["runs"]]


def _rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            **la.arm_row(m, name),
            "training loss": spread_text(la.values(m, name, "train")),
            "self-weight A_tt": spread_text(la.values(m, name, "self_weight")),
        }
        for name in m["arms"]
    ]


def _checks(m: dict[str, Any]) -> tuple[list[Check], str]:
    """The claim's checks, the seed spread deciding, and the verdict's reason."""
    found, parts = [], []
    for h in m["heads"]:
        learned, free = (la.values(m, _name(f, h), "val") for f in FORMS)
        found.append(worse(f"{h} head(s): parameter-free loss above learned", free, learned))
        parts.append(
            f"{h} head(s): validation loss {spread_text(learned)} learned vs "
            f"{spread_text(free)} parameter-free"
        )
    h = m["heads"][0]
    learned, free = (la.values(m, _name(f, h), "self_weight") for f in FORMS)
    found.append(worse(f"{h} head(s): parameter-free self-weight above learned", free, learned))
    copied, unprojected = (_copy_values(m, f, "accuracy") for f in FORMS)
    found.append(worse("copy task: learned accuracy above parameter-free", copied, unprojected))
    reason = (
        f"mean (min-max) over {len(m['seeds'])} seed(s): " + "; ".join(parts)
        + f" ({UNIT}); at {h} head(s) a query puts {spread_text(free)} of its weight on its "
        f"own position without projections and {spread_text(learned)} with them (uniform "
        f"causal attention: {_uniform(m):.3f}); the copy task's per-token accuracy "
        f"is {spread_text(copied)} learned vs {spread_text(unprojected)} parameter-free."
    )  # fmt: skip
    return found, reason


def _uniform(m: dict[str, Any]) -> float:
    return la.uniform_self_weight(la.size_of(m).context)


def _figures(m: dict[str, Any], out_dir: Path) -> list[FigureRef]:
    n = len(m["seeds"])

    def bars(key: str) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
        per = {a: la.values(m, a, key) for a in m["arms"]}
        return {a: spread(v)["mean"] for a, v in per.items()}, {
            a: (min(v), max(v)) for a, v in per.items()
        }

    loss, loss_err = bars("val")
    weight, weight_err = bars("self_weight")
    copy_acc = {f: _copy_values(m, f, "accuracy") for f in FORMS}
    copy = {f: spread(v)["mean"] for f, v in copy_acc.items()}
    copy_err = {f: (min(v), max(v)) for f, v in copy_acc.items()}
    return [
        save_chart(
            bar_chart(
                loss,
                ylabel=f"validation loss ({UNIT})",
                errors=loss_err,
                title=f"learned vs parameter-free attention ({n} seed(s), min-max bars)",
                reference=m["bigram"],
                reference_label="add-one bigram",
            ),
            out_dir,
            "loss.png",
            "Validation loss per arm at its chosen rate (mean over seeds, min-max error bars); "
            "dashed: the add-one bigram baseline.",
        ),  # fmt: skip
        save_chart(
            bar_chart(
                weight,
                ylabel="mean attention on its own position, A_tt",
                errors=weight_err,
                title="self-weight of a query (held-out windows)",
                reference=_uniform(m),
                reference_label="uniform causal",
            ),
            out_dir,
            "self_weight.png",
            "The mean weight a query puts on its own position (t >= 1, every layer and head; "
            "mean over seeds, min-max error bars); dashed: uniform causal attention.",
        ),  # fmt: skip
        save_chart(
            bar_chart(
                copy,
                ylabel="validation per-token copy accuracy",
                errors=copy_err,
                title=f"copy task ({n} seed(s), min-max bars)",
                reference=1 / COPY_SYMBOLS,
                reference_label="uniform guess",
            ),
            out_dir,
            "copy.png",
            "Copy task: per-token accuracy on the copy half at each arm's chosen rate (mean over "
            "seeds, min-max error bars); dashed: a uniform guess over the symbols.",
        ),  # fmt: skip
        la.curve_figure(
            m,
            m["arms"],
            out_dir,
            "training.png",
            f"Training loss (running mean of {la.SMOOTH} steps) of every arm at its chosen rate "
            "(mean over seeds, min-max band); dashed: the bigram baseline.",
            "training loss, learned vs parameter-free attention",
        ),
    ]


def _setup(m: dict[str, Any], quick: bool) -> list[str]:
    n = m["copy_steps"]
    return [
        "Arms: attention with learned W_q, W_k, W_v or with q = k = v = x "
        f"(ModelConfig(qkv_proj=False)), at {' and '.join(map(str, m['heads']))} head(s); no W^O "
        "in any arm (out_proj=False); the rest of the block (pre-norm, residuals, ReLU "
        "feed-forward of width 4 d_model) is the same.",
        "Self-weight: mean attention weight A_tt of query t >= 1 on its own position over every "
        f"layer and head of {la.N_WEIGHTS} held-out windows.",
        f"Copy task: '<bos> x_1 .. x_n | x_1 .. x_n <eos>', n in 1..{COPY_N_MAX} distinct symbols "
        f"of {COPY_SYMBOLS}, loss and accuracy on the copy half (teacher-forced): at the copy of "
        "x_k the model must attend to x_{k+1}, a token unlike itself (an induction head: "
        "a query matches the key *after* its earlier occurrence). 2-layer decoder, d_model 64, "
        f"4 heads, no W^O, learned positions; AdamW, {n} steps of 64, warm-up {n // 10} then "
        "cosine to lr/10; 20000 training and 400 validation sequences per seed.",
        (QUICK_COPY_SWEEP if quick else COPY_SWEEP).describe(f"{n} steps") + " (copy task)",
    ]


def _copy_rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "arm": name,
            "lr": g.chosen,
            "validation copy accuracy": spread_text(g.values("accuracy")),
            "self-weight A_tt (every position, padding too)": spread_text(g.values("self_weight")),
        }
        for name, g in _copy_runs(m).items()
    ]


def write_up(m: dict[str, Any], out_dir: Path, quick: bool) -> Report:
    """The report of :func:`measure`'s numbers: tables, figures, the gated verdict."""
    found, reason = _checks(m)
    tables = [
        Table("character LM, per arm (mean (min-max) over seeds)", _rows(m)),
        Table("copy task, per arm (mean (min-max) over seeds)", _copy_rows(m)),
    ]
    return la.arm_report(
        PAPER,
        m,
        quick,
        (found, reason),
        _setup(m, quick),
        tables,
        figures=_figures(m, out_dir),
        more=(_copy_competence(m, quick), sweep_rows(_copy_runs(m), str)),
        per_seed={
            "val": {a: la.values(m, a, "val") for a in m["arms"]},
            "self_weight": {a: la.values(m, a, "self_weight") for a in m["arms"]},
            "copy_accuracy": {n: g.values("accuracy") for n, g in _copy_runs(m).items()},
        },
        metrics={
            "params": {a: la.values(m, a, "params")[0] for a in m["arms"]},
            "uniform_self_weight": _uniform(m),
            "checks": [c.state for c in found],
        },
    )


PAPER = la.Paper("qkv", "Queries, keys and values: learned projections vs parameter-free "
                 "self-attention", CLAIM, SOURCE, THRESHOLDS, COST)  # fmt: skip


@experiment("qkv", notes="001 'Basic Self-Attention', 'Queries, Keys and Values'; 000")
def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
    """Self-attention needs learned query, key and value projections: without them (001's
    parameter-free form, q = k = v = x) each vector must play all three roles, a query leans on
    its own position, and the character LM ends at a higher validation loss."""
    return write_up(measure(quick, seed, data), out_dir, quick)
