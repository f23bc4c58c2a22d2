"""Character-LM arms that differ in one setting, gated and scored alike: the one harness of
``lm_extrapolation``, ``table3``, ``qkv``, ``ffn_width`` and ``layernorm``.

**Model** (:func:`build`): a small decoder-only pre-norm character LM (:data:`SIZE`: d_model 64,
2 layers, 4 heads, d_ff 4 d_model, learned positions, no dropout), token embeddings drawn from
N(0, 1/d_model) and multiplied by sqrt(d_model) (Vaswani et al. 3.4: unit entries, like the
sinusoids'), tied to the output layer. An :class:`Arm` names the
:class:`~attnlab.config.ModelConfig` fields it changes (positions, heads, d_k, norm, FFN, Q/K/V
projections) and, where it differs, its depth.

**Training** (:func:`train_job`): AdamW on windows of T + 1 characters drawn at random offsets of
the training text, warm-up S/10 steps then cosine to lr/10, gradients clipped at 1; the same
recipe and seeds for every arm, one torch thread per run, two runs at a time.

**Gate** (:data:`SWEEPS`, :func:`competence`): every arm -- the one whose failure is the claim
included -- gets the same learning-rate sweep on the first seed (bracketed: an edge choice extends
the grid, :mod:`attnlab.lab.kit.gating`) and a step doubling on the first seed, converged when its
validation loss moves by at most :data:`TOLERANCE`. Its criterion is the training's own: the
validation loss at most the unigram entropy + margin (it learned the character frequencies,
:data:`attnlab.lab.kit.corpus.LEARNED_FREQUENCIES`), never the outcome the claim predicts.

**Score** (:func:`loss_per_char`), in **nats per character** (natural log, as the lab's other char
LMs, the count baselines and the competence margin of :mod:`attnlab.lab.kit.corpus`; perplexity =
exp(loss), bits/char = loss / ln 2):

    loss = -(1 / N) sum_t ln p(w_{t+1} | w_{<=t})        over the N scored characters

on *non-overlapping* windows of the validation text: every position of every window is scored
(Press et al. 2022's "nonoverlapping evaluation"); an arm with ``multiples`` is also scored on
windows of k T characters, the same stretch of text at every length, so lengths differ only in how
much context each prediction has. Per run also: the training-loss curve, the parameter count and
the *self-weight* -- the mean attention weight A_tt a query puts on its own position over every
layer, head and query t >= 1 of held-out windows (:func:`uniform_self_weight`: its value under
uniform causal attention).

**Checks** of a claim compare per-seed values and let the seed spread decide (:func:`worse`,
:func:`not_worse`, :func:`alike`): a predicted difference whose seed ranges overlap is
"unresolved", and a claim whose predicted differences are all unresolved reads "no effect
resolved" (:func:`judged`).

Shapes: N windows, B batch, T context, L evaluation length, H heads, V characters.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from matplotlib.ticker import MaxNLocator
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.lab.kit.charts import save_chart, seeds_chart
from attnlab.lab.kit.corpus import (
    LEARNED_FREQUENCIES,
    UNIGRAM_MARGIN,
    text_windows,
    unigram_bigram,
)
from attnlab.lab.kit.fit import FitConfig, fit, lm_loss
from attnlab.lab.kit.gating import Gated, Sweep, gate_arms, sweep_rows
from attnlab.lab.kit.report import FigureRef, Report, Table, Threshold
from attnlab.lab.kit.seeds import resolved, spread, spread_text, start_seeds
from attnlab.lab.kit.verdict import Competence, gated_fields, verdict_of
from attnlab.models import build_model

UNIT = "nats/char"
METRIC = f"validation loss ({UNIT}) at the training length"
TOLERANCE = 0.05  # doubling: nats/char (char_lm's tolerance)
TIE = 0.01  # nats/char: sweep scores this close to the best are tied (kit.gating.choose)
SMOOTH = 20  # running mean of the training loss (steps) for curves and steps-to-target
N_WEIGHTS = 64  # held-out windows the self-weight is measured on
SWEEPS = {  # the gate of every arm: full size, and the CI-sized --quick form
    False: Sweep(grid=(1e-3, 3e-3, 1e-2), tolerance=TOLERANCE, metric=METRIC, metric_key="val",
                 factor=3.0, max_extensions=2, tie=TIE, doubling_seeds=1),
    True: Sweep(grid=(3e-3, 1e-2), tolerance=TOLERANCE, metric=METRIC, metric_key="val",
                max_extensions=1, tie=TIE, doubling_seeds=1),
}  # fmt: skip


@dataclass(frozen=True)
class LMSize:
    """The char LM and its training budget (``steps`` at scale 1; the doubling runs 2x)."""

    context: int  # T, the training length
    d_model: int
    n_layers: int
    n_heads: int
    batch: int
    steps: int

    @property
    def warmup(self) -> int:
        return self.steps // 10

    def describe(self) -> str:
        return (
            f"decoder-only pre-norm char LM, {self.n_layers} layers unless the arm changes "
            f"them, d_model {self.d_model}, {self.n_heads} heads, d_ff {4 * self.d_model}, "
            "learned positions (each unless the arm changes it), no dropout; token embeddings "
            "drawn from N(0, 1/d_model) and multiplied by sqrt(d_model) (Vaswani et al. 3.4), "
            f"tied to the output layer; training length T = {self.context}; AdamW (weight "
            f"decay 0.01 on weight matrices), {self.steps} steps of {self.batch} windows drawn "
            f"at random offsets, warm-up {self.warmup} steps then cosine to lr/10, gradients "
            "clipped at 1"
        )


# The recipe of every arm (why these numbers, and what the probes found: CONVERGENCE).
SIZE = {
    False: LMSize(context=32, d_model=64, n_layers=2, n_heads=4, batch=32, steps=5000),
    True: LMSize(context=16, d_model=32, n_layers=2, n_heads=4, batch=16, steps=30),
}


CONVERGENCE = (
    "Recipe and convergence: one recipe for the five char-LM experiments, the largest budget "
    "the 60-minute cap affords the costliest of them (table3's 8 arms, layernorm's 6-layer "
    "arms). Single-seed probes of it (seed 0, tinyshakespeare, one thread, 27 Nov 2026), "
    "validation loss at 5000 -> 10000 steps: sinusoidal positions 1.705 -> 1.622 nats/char at "
    "lr 3e-3 and 1.688 -> 1.619 at lr 1e-2, learned positions 1.686 -> 1.607 at lr 1e-2: "
    "changes of 0.07-0.08, above the 0.05 tolerance, so an arm still falling this fast fails "
    "its doubling and the verdict reads inconclusive, with every number kept. Neither the "
    "embedding init (default N(0, 1), no sqrt(d_model) scale: 1.674 -> 1.606) nor the earlier "
    "T = 64 recipe (0.05-0.07 nats/char per doubling at 3000 -> 6000 steps) converged faster."
)


@dataclass(frozen=True)
class Arm:
    """One arm: its name in the report, the ModelConfig fields it changes (``(field, value)``
    pairs), its depth (None: the recipe's) and the multiples of T it is also scored at."""

    name: str
    changes: tuple[tuple[str, Any], ...] = ()
    n_layers: int | None = None
    multiples: tuple[int, ...] = ()

    def lengths(self, context: int) -> list[int]:
        return [k * context for k in self.multiples]


def build(arm: Arm, vocab: int, size: LMSize, max_len: int) -> nn.Module:
    """The arm's model: the common char LM with the arm's changes, embeddings N(0, 1/d_model)."""
    fields: dict[str, Any] = dict(d_model=size.d_model, n_heads=size.n_heads,
                                  n_layers=arm.n_layers or size.n_layers, dropout=0.0,
                                  embed_scale=True)  # fmt: skip
    fields.update(arm.changes)
    model: Any = build_model(
        ModelConfig(kind="decoder_lm", vocab_size=vocab, max_len=max_len, **fields)
    )
    torch.nn.init.normal_(model.embed.tok_emb.weight, 0.0, size.d_model**-0.5)
    return model


@torch.no_grad()
def loss_per_char(model: nn.Module, ids: Tensor, length: int, batch: int = 16) -> float:
    """Validation nats/char of ``ids`` (S + 1,) cut into non-overlapping windows of ``length``:
    inputs ids[:S] viewed (N, L), targets ids[1:S+1]; every position is scored. S must be a
    multiple of ``length``."""
    s = ids.numel() - 1
    if s % length:
        raise ValueError(f"the scored text ({s} characters) is not a multiple of {length}")
    x, y = ids[:s].view(-1, length), ids[1:].view(-1, length)  # (N, L)
    model.eval()
    total = 0.0
    for i in range(0, x.size(0), batch):
        logits = model(x[i : i + batch]).logits  # (B, L, V)
        total += float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y[i : i + batch].reshape(-1), reduction="sum"
        ))  # fmt: skip
    return total / s


def scored_text(val: Tensor, longest: int) -> Tensor:
    """The stretch of validation text every evaluation length scores: the validation windows
    (N, T + 1) read back as one text, cut to a multiple of ``longest`` characters plus one."""
    flat = val.flatten()
    n = (flat.numel() - 1) // longest * longest
    if n == 0:
        raise ValueError(f"the validation text is shorter than one window of {longest}")
    return flat[: n + 1]


@torch.no_grad()
def self_weight(model: nn.Module, ids: Tensor) -> float:
    """Mean A_tt over layers, heads, windows and queries t >= 1 of ``ids`` (N, T)."""
    model.eval()
    out = model(ids, need_weights=True)
    diag = [a.self_attn.diagonal(dim1=-2, dim2=-1)[..., 1:] for a in out.attentions]  # (N, H, T-1)
    return float(torch.stack(diag).mean())


def uniform_self_weight(context: int) -> float:
    """Mean A_tt over t = 1..T-1 when query t spreads its weight evenly over its t + 1 keys."""
    return sum(1 / (t + 1) for t in range(1, context)) / (context - 1)


def train_job(job: tuple) -> dict[str, Any]:
    """One arm at one rate for ``scale`` x the budget on one seed (the job of
    :func:`attnlab.lab.kit.gating.gate_arms`): the validation loss at the training length
    (``val``, the gate's metric) and at each of the arm's lengths (``by_length``), the training
    losses, the parameter count and the self-weight."""
    arm, lr, scale, seed, quick, data = job
    size = SIZE[quick]
    train, val, chars, _ = text_windows(quick, size.context, data)
    longest = max((size.context, *arm.lengths(size.context)))
    text = scored_text(val, longest)
    torch.manual_seed(seed)
    model = build(arm, len(chars), size, longest)
    n = size.steps * scale
    cfg = FitConfig(steps=n, batch_size=size.batch, lr=lr, warmup_steps=n // 10, min_lr=lr / 10)
    starts = train.flatten().unfold(0, size.context + 1, 1)  # every window, (N', T + 1): a view
    result = fit(model, (starts,), lm_loss, cfg, seed=seed)
    ok = not result.diverged
    return {
        "val": loss_per_char(model, text, size.context) if ok else math.inf,
        "by_length": [
            loss_per_char(model, text, n) if ok else math.inf for n in arm.lengths(size.context)
        ],  # fmt: skip
        "train": result.final_loss(),
        "losses": result.losses,
        "diverged": result.diverged,
        "params": sum(p.numel() for p in model.parameters()),
        "self_weight": self_weight(model, val[:N_WEIGHTS, : size.context]) if ok else math.nan,
        "seconds": result.seconds,
    }


def measure_arms(arms: list[Arm], quick: bool, seed: int, data: Path | None) -> dict[str, Any]:
    """Every arm gated and trained on every seed; plain numbers (the gate's runs as dicts, by
    arm name, in the order given)."""
    seeds = start_seeds(seed, quick)
    size = SIZE[quick]
    train, val, chars, source = text_windows(quick, size.context, data)
    uni, bi = unigram_bigram(train, val, len(chars))
    depth = lambda j: (j[0].n_layers or size.n_layers) * j[2]  # noqa: E731 (long runs first)
    gated = gate_arms(train_job, arms, SWEEPS[quick], seeds, quick, data, cost=depth)
    return {
        "seeds": seeds,
        "size": asdict(size),
        "unigram": uni,
        "bigram": bi,
        "source": source,
        "vocab": len(chars),
        "arms": [a.name for a in arms],
        "gated": {a.name: asdict(gated[a]) for a in arms},
        "threads": torch.get_num_threads(),
    }


def size_of(m: dict[str, Any]) -> LMSize:
    return LMSize(**m["size"])


def gated_runs(m: dict[str, Any]) -> dict[str, Gated]:
    """The measured runs of every arm, by name, in the order measured."""
    return {name: Gated(**m["gated"][name]) for name in m["arms"]}


def values(m: dict[str, Any], arm: str, key: str) -> list[Any]:
    """``key`` of every seed's run of ``arm`` at its chosen rate."""
    return [r[key] for r in m["gated"][arm]["runs"]]


def competence(m: dict[str, Any], quick: bool) -> list[Competence]:
    """Every arm: validation loss at most the unigram entropy + margin on every seed, at its
    swept rate, with its step doubling."""
    threshold = m["unigram"] + UNIGRAM_MARGIN
    return [
        g.competence(name, LEARNED_FREQUENCIES, threshold, SWEEPS[quick], size_of(m).steps,
                     higher_is_better=False)
        for name, g in gated_runs(m).items()
    ]  # fmt: skip


def arm_row(m: dict[str, Any], arm: str) -> dict[str, Any]:
    """The first columns of an arm's table row: name, parameters, chosen rate, validation loss."""
    return {
        "arm": arm,
        "parameters": values(m, arm, "params")[0],
        "lr": m["gated"][arm]["chosen"],
        f"validation loss ({UNIT})": spread_text(values(m, arm, "val")),
    }


def sweep_table_rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    return sweep_rows(gated_runs(m), str)


def setup_lines(m: dict[str, Any], quick: bool) -> list[str]:
    """The recipe every arm shares, the score and the gate, with their numbers."""
    size = size_of(m)
    return [
        f"Text: {m['source']}; vocabulary {m['vocab']} characters; the last 10% of the text "
        f"is validation. Count baselines: unigram {m['unigram']:.3f}, bigram "
        f"{m['bigram']:.3f} {UNIT}.",
        f"Model: {size.describe()}.",
        f"Score: validation loss in {UNIT} (natural log; bits/char = loss / ln 2) on "
        "non-overlapping validation windows of the training length, every position scored.",
        SWEEPS[quick].describe(f"{size.steps} steps"),
        f"Competence of every arm: validation loss at most the unigram entropy "
        f"({m['unigram']:.3f} {UNIT}) + {UNIGRAM_MARGIN:g} on every seed, and the doubling.",
        f"Runs: one torch thread each, two at a time (this run: {m['threads']} thread(s) in "
        "the parent process).",
    ]


CHECKS = "checks of the claim (seed ranges deciding)"


@dataclass(frozen=True)
class Paper:
    """What an experiment tests: its report's name and title, the claim quoted with its source,
    the thresholds it is judged by and the full run's cost."""

    name: str
    title: str
    claim: str
    source: str
    thresholds: list[Threshold]
    cost: str


def arm_report(
    paper: Paper,
    m: dict[str, Any],
    quick: bool,
    checked: tuple[list[Check], str],
    setup: list[str],
    tables: list[Table],
    *,
    figures: list[FigureRef],
    more: tuple[list[Competence], list[dict[str, Any]]] = ([], []),
    **fields: Any,
) -> Report:
    """The report of a char-LM arm experiment: ``paper``'s texts, :func:`report_fields` of its
    checks and reason (``checked``), ``figures`` and the other Report ``fields`` (per_seed,
    metrics, findings)."""
    found, reason = checked
    shared = report_fields(m, quick, found, reason, setup=setup, cost=paper.cost, tables=tables,
                           more=more)  # fmt: skip
    return Report(name=paper.name, title=paper.title, claim=paper.claim, source=paper.source,
                  thresholds=paper.thresholds, figures=figures, **shared, **fields)  # fmt: skip


def report_fields(
    m: dict[str, Any],
    quick: bool,
    found: list[Check],
    reason: str,
    *,
    setup: list[str],
    cost: str,
    tables: list[Table],
    more: tuple[list[Competence], list[dict[str, Any]]] = ([], []),
) -> dict[str, Any]:
    """The :class:`~attnlab.lab.kit.report.Report` fields every char-LM arm experiment shares:
    the recipe's setup lines, its own ``setup`` (and ``cost`` at full size), its ``tables``
    then the checks and the sweep, and the verdict of the checks, gated on every arm (``more``:
    other compared arms' competence and sweep rows, e.g. a second task's)."""
    extra, sweeps = more
    return {
        "setup": [*setup_lines(m, quick), *setup, *([] if quick else [cost, CONVERGENCE])],
        "tables": [
            *tables,
            Table(CHECKS, [c.row() for c in found]),
            Table("learning-rate sweep (first seed)", sweep_table_rows(m) + sweeps),
        ],
        **gated_fields(
            judged(found),
            reason,
            competence(m, quick) + extra,
            m["seeds"],
            quick,
            m["arms"] + [c.arm for c in extra],
        ),  # fmt: skip
    }


def steps_to(losses: list[float], target: float, window: int = SMOOTH) -> float:
    """The first step whose running-mean training loss is at most ``target`` (inf: never)."""
    total = 0.0
    for i, loss in enumerate(losses):
        total += loss - (losses[i - window] if i >= window else 0.0)
        if i + 1 >= window and total / window <= target:
            return float(i + 1)
    return math.inf


def smoothed(losses: list[float]) -> list[float]:
    """Running means of :data:`SMOOTH` training losses; entry i ends at step i + SMOOTH."""
    return [sum(losses[i - SMOOTH : i]) / SMOOTH for i in range(SMOOTH, len(losses) + 1)]


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
        ylabel=f"training loss ({UNIT}, mean of {SMOOTH} steps)",
        title=title,
        hline=m["bigram"],
    )
    fig.axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    return save_chart(fig, out_dir, file, caption)


# -- checks of a claim, the seed spread deciding ---------------------------------------------

HELD, NOT_HELD, UNRESOLVED = "held", "did not hold", "unresolved"


@dataclass
class Check:
    """One check of a claim: what it compares and its state (held / did not hold / unresolved:
    the difference lies inside the seed spread)."""

    what: str
    state: str
    detail: str
    difference: bool = True  # the claim predicts a difference (False: it predicts none)

    def row(self) -> dict[str, str]:
        return {"check": self.what, "outcome": self.state, "numbers": self.detail}


def _means(a: list[float], b: list[float]) -> str:
    sa, sb = spread(a), spread(b)
    return (
        f"{sa['mean']:.3f} ({sa['min']:.3f}-{sa['max']:.3f}) vs "
        f"{sb['mean']:.3f} ({sb['min']:.3f}-{sb['max']:.3f})"
    )


def worse(what: str, a: list[float], b: list[float]) -> Check:
    """Predicted: ``a`` (per seed) is higher than ``b`` (a higher loss, more steps, a larger
    self-weight). Held when the seed ranges are apart with ``a`` above; did not hold when apart
    the other way; else unresolved."""
    if not resolved(a, b):
        return Check(what, UNRESOLVED, _means(a, b))
    return Check(what, HELD if min(a) > max(b) else NOT_HELD, _means(a, b))


def not_worse(what: str, a: list[float], b: list[float]) -> Check:
    """Predicted: ``a`` is no worse than ``b``: did not hold only when ``a``'s seed range lies
    wholly above ``b``'s."""
    return Check(what, NOT_HELD if min(a) > max(b) else HELD, _means(a, b), difference=False)


def alike(what: str, a: list[float], b: list[float]) -> Check:
    """Predicted: no difference ("nearly identical"): held when the seed ranges overlap."""
    return Check(what, NOT_HELD if resolved(a, b) else HELD, _means(a, b), difference=False)


def judged(checks: list[Check]) -> str:
    """The verdict word of a claim's checks: held / did not hold / mixed by which held; "no
    effect resolved" when every predicted difference lies inside the seed spread and no other
    check failed (a check that predicts no difference, held, does not make that "mixed")."""
    held = [c.state == HELD for c in checks]
    differences = [c for c in checks if c.difference]
    others_held = all(c.state == HELD for c in checks if not c.difference)
    if differences and all(c.state == UNRESOLVED for c in differences) and others_held:
        return "no effect resolved"
    if not any(held) and all(c.state == UNRESOLVED for c in checks):
        return "no effect resolved"
    return verdict_of(held)
