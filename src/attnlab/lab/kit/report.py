"""An experiment's report: the claim, the setup, result tables, figures and an honest verdict.

Every experiment returns a :class:`Report`; the runner (:mod:`attnlab.lab.kit.runner`) fills in the
command that produced it, the wall time and the machine, then :meth:`Report.write` renders

    OUT/README.md     the human-readable report (GitHub renders it in docs/experiments/NAME/)
    OUT/report.json   the same content as data (tables, headline metrics, verdict, provenance)

next to the PNG figures the experiment saved into OUT. A quick (CI-sized) report refuses to
overwrite a full-size one, so a ``--quick`` run can never clobber the committed results.

The competence gate (the rule of docs/experiments/README.md): a comparison between arms says
something about the claim only if every compared arm learned its own training distribution. Each
experiment names its compared arms (:attr:`Report.arms`) and states, per arm, a
:class:`Competence` criterion measured on every seed (e.g. ">= 0.99 per-token accuracy on the
training lengths"), shown

- at a learning rate **bracketed** by the arm's sweep (:class:`LearningRate`: the chosen rate has
  a tried rate on each side; a choice at a grid edge extends the grid), and
- by **step doubling** (:class:`Doubling`: doubling the training steps changes the arm's metric
  by less than a stated tolerance, so the arm has reached what its recipe can reach).

An arm whose failure is the claim gets the same sweep and doubling as the winner. A full-size
report whose compared arm misses its criterion, lacks its sweep or doubling, or has no criterion
at all carries the verdict "inconclusive" (:func:`gate` builds it; :class:`Report` refuses
anything else) and says which arm missed what, keeping the numbers the comparison would have
rested on.

A criterion measures whether the arm learned its *training setup*, never the outcome the claim
predicts for it. Where an arm's failure is the finding (one attention head on a task that needs
two), its criterion is convergence itself -- the doubling -- so a failure at the plateau counts,
and a failure that more training would remove makes the verdict inconclusive.

Verdict words, one meaning each (:data:`VERDICTS`): **held**, **did not hold**, **mixed** (some of
the claim's checks held, others did not), **no effect resolved** (the difference the claim
predicts lies inside the seed spread), **inconclusive** (an arm failed its gate, or too few seeds).
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.checkpoint.atomic import atomic_write_text
from attnlab.errors import UserError
from attnlab.runtime import cpu_model, load_average

VERDICTS = ("held", "did not hold", "mixed", "no effect resolved", "inconclusive")
VERDICT_MEANINGS = {
    "held": "every check of the claim held",
    "did not hold": "no check of the claim held",
    "mixed": "some of the claim's checks held, others did not",
    "no effect resolved": "the difference the claim predicts lies inside the seed spread",
    "inconclusive": "an arm failed its competence gate, or fewer than 3 seeds back the numbers",
}
REPORT_FILE = "README.md"
DATA_FILE = "report.json"


@dataclass
class Table:
    """A results table: one dict per row; columns are the keys in first-seen order."""

    caption: str
    rows: list[dict[str, Any]]

    def columns(self) -> list[str]:
        cols: list[str] = []
        for row in self.rows:
            cols.extend(k for k in row if k not in cols)
        return cols

    def to_markdown(self) -> str:
        cols = self.columns()
        if not cols:
            return "(no rows)"
        header = "| " + " | ".join(format_cell(c) for c in cols) + " |"
        lines = [header, "|" + "|".join("---" for _ in cols) + "|"]
        for row in self.rows:
            lines.append("| " + " | ".join(format_cell(row.get(c, "")) for c in cols) + " |")
        return "\n".join(lines)


@dataclass
class FigureRef:
    """A figure the experiment saved into the output directory (``file`` is relative to it)."""

    file: str
    caption: str


@dataclass
class Threshold:
    """A number a verdict is judged by, with the paper or note it is taken from."""

    what: str  # e.g. "share of heads removable at <= 1 BLEU loss"
    value: str  # e.g. ">= 20 % (WMT), >= 40 % (BERT)"
    source: str  # e.g. "Michel et al. 2019, Fig. 1 and section 3.2"


@dataclass
class LearningRate:
    """The learning rate an arm was compared at and the sweep it was chosen from: ``bracketed``
    when a tried rate lies on each side of the chosen one (an edge choice says the best rate may
    lie outside the grid: extend it). A single-rate grid is bracketed only when ``fixed`` gives
    the reason the rate is not the arm's to choose (e.g. a paper's recipe reproduced as is)."""

    chosen: float
    grid: list[float]
    chosen_on: str = ""  # what picked it, e.g. "validation loss, seed 0"
    fixed: str = ""  # why no sweep applies (then the grid is the one rate)
    bracketed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.grid = sorted(float(g) for g in self.grid)
        self.chosen = float(self.chosen)
        below = any(g < self.chosen for g in self.grid)
        above = any(g > self.chosen for g in self.grid)
        self.bracketed = (below and above) or (bool(self.fixed) and self.grid == [self.chosen])

    def describe(self) -> str:
        grid = ", ".join(f"{g:g}" for g in self.grid)
        if self.fixed:
            return f"lr {self.chosen:g} fixed ({self.fixed})"
        edge = "" if self.bracketed else " (at the grid's edge: not bracketed)"
        return f"lr {self.chosen:g} of {{{grid}}}{edge}"


@dataclass
class Doubling:
    """Step doubling: the arm's metric after ``steps`` and after ``2 * steps`` training steps
    (same recipe, the schedule stretched), per seed in ``seeds``; converged when every seed's
    change is at most ``tolerance``."""

    steps: int
    at_steps: list[float]
    at_double: list[float]
    tolerance: float
    seeds: list[int]
    metric: str = ""  # e.g. "validation loss (nats)"
    converged: bool = field(init=False)

    def __post_init__(self) -> None:
        self.at_steps = [float(v) for v in self.at_steps]
        self.at_double = [float(v) for v in self.at_double]
        changes = [abs(b - a) for a, b in zip(self.at_steps, self.at_double)]
        self.converged = (
            bool(changes)
            and len(self.at_steps) == len(self.at_double) == len(self.seeds)
            and all(math.isfinite(c) and c <= self.tolerance for c in changes)
        )

    def describe(self) -> str:
        pairs = ", ".join(f"{a:.4g} -> {b:.4g}" for a, b in zip(self.at_steps, self.at_double))
        return (
            f"{self.metric or 'metric'} {self.steps} -> {2 * self.steps} steps: {pairs} "
            f"(tolerance {self.tolerance:g})"
        )


@dataclass
class Competence:
    """One arm's competence criterion on its own training distribution, measured per seed.

    ``passed`` is True when every seed meets the threshold (a criterion met on average but
    missed by one seed is missed: that seed's arm is not competent)."""

    arm: str
    criterion: str  # what is measured, on which data, e.g. "copy accuracy on n <= 16"
    threshold: float
    values: list[float]  # one per seed, in the order of Report.seeds
    higher_is_better: bool = True
    in_verdict: bool = True  # False: a reference arm, reported but not compared in the verdict
    lr: LearningRate | None = None  # the sweep the arm's rate was chosen from
    doubling: Doubling | None = None  # the step-doubling check of convergence
    met: bool = field(init=False)  # the threshold, on every seed
    passed: bool = field(init=False)  # met, and (where given) bracketed and converged

    def __post_init__(self) -> None:
        self.values = [float(v) for v in self.values]
        if isinstance(self.lr, dict):
            self.lr = LearningRate(**{k: v for k, v in self.lr.items() if k != "bracketed"})
        if isinstance(self.doubling, dict):
            self.doubling = Doubling(**{k: v for k, v in self.doubling.items() if k != "converged"})
        ok = [
            math.isfinite(v)
            and (v >= self.threshold if self.higher_is_better else v <= self.threshold)
            for v in self.values
        ]
        self.met = bool(ok) and all(ok)
        self.passed = (
            self.met
            and (self.lr is None or self.lr.bracketed)
            and (self.doubling is None or self.doubling.converged)
        )

    @property
    def gated(self) -> bool:
        """Whether the full rule applies: a bracketed rate and a step doubling are both given."""
        return self.lr is not None and self.doubling is not None

    def describe(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        measured = spread_text(self.values)
        text = f"{self.arm}: {self.criterion} {sign} {self.threshold:g}, measured {measured}"
        if self.lr is not None and not self.lr.bracketed:
            text += f"; {self.lr.describe()}"
        if self.doubling is not None and not self.doubling.converged:
            text += f"; not converged: {self.doubling.describe()}"
        return text


def missed(competence: list[Competence]) -> list[Competence]:
    """The criteria of compared arms that were missed (threshold, bracket or doubling)."""
    return [c for c in competence if c.in_verdict and not c.passed]


def ungated(arms: list[str], competence: list[Competence]) -> list[str]:
    """The compared arms the full rule does not cover, each with what it lacks: no criterion at
    all, or no criterion that carries both a learning-rate sweep and a step doubling."""
    criteria: dict[str, list[Competence]] = {}
    for c in competence:
        if c.in_verdict:
            criteria.setdefault(c.arm, []).append(c)
    gaps = []
    for arm in arms:
        if arm not in criteria:
            gaps.append(f"{arm} (no competence criterion)")
        elif not any(c.gated for c in criteria[arm]):
            gaps.append(f"{arm} (no learning-rate sweep with step doubling)")
    return gaps


MIN_SEEDS = 3  # a full-size verdict rests on at least this many seeds


def gate(
    verdict: str,
    reason: str,
    competence: list[Competence],
    n_seeds: int | None = None,
    min_seeds: int = MIN_SEEDS,
    arms: list[str] | None = None,
) -> tuple[str, str]:
    """(verdict, reason) after the competence gate: "inconclusive" when a compared arm missed a
    criterion, when ``arms`` (the compared arms) is given and one of them is not fully gated
    (:func:`ungated`), or when ``n_seeds`` is given and fewer than ``min_seeds`` seeds back the
    numbers; the arms are named and the comparison's numbers kept for the reader."""
    failed = missed(competence)
    if failed:
        names = "; ".join(c.describe() for c in failed)
        n_arms = len({c.arm for c in failed})  # an arm may miss more than one criterion
        return (
            "inconclusive",
            f"no verdict: {n_arms} arm(s) missed {len(failed)} competence "
            f"{'criterion' if len(failed) == 1 else 'criteria'} on their own training "
            f"distribution ({names}). "
            f"The comparison would have read: {reason}",
        )
    gaps = ungated(arms, competence) if arms is not None else []
    if gaps:
        return (
            "inconclusive",
            f"no verdict: {len(gaps)} compared arm(s) not shown competent by a bracketed "
            f"learning rate and step doubling: {'; '.join(gaps)}. The numbers read: {reason}",
        )
    if n_seeds is not None and n_seeds < min_seeds:
        return (
            "inconclusive",
            f"no verdict: {n_seeds} seed(s), fewer than the {min_seeds} a verdict needs. "
            f"The numbers read: {reason}",
        )
    return verdict, reason


def verdict_of(checks: list[bool]) -> str:
    """ "held" when every check passed, "did not hold" when none did, else "mixed"."""
    return "held" if all(checks) else ("did not hold" if not any(checks) else "mixed")


def resolved(a: list[float], b: list[float]) -> bool:
    """Whether a difference between two arms' per-seed values is resolved: their seed ranges do
    not overlap. A claim whose predicted difference is not resolved reads "no effect resolved"."""
    return not overlap(a, b)


def gated_fields(
    verdict: str,
    reason: str,
    competence: list[Competence],
    seeds: list[int],
    quick: bool,
    arms: list[str] | None = None,
) -> dict[str, Any]:
    """The :class:`Report` fields of a run's outcome: verdict and reason after :func:`gate` (a
    full-size run needs MIN_SEEDS seeds and, when ``arms`` names the compared arms, every one of
    them fully gated; a quick run one seed and the thresholds), with the competence checks, the
    compared arms and the seeds they rest on."""
    min_seeds = 1 if quick else MIN_SEEDS
    verdict, reason = gate(
        verdict,
        reason,
        competence,
        n_seeds=len(seeds),
        min_seeds=min_seeds,
        arms=None if quick else arms,
    )
    return {
        "verdict": verdict,
        "verdict_reason": reason,
        "competence": competence,
        "seeds": seeds,
        "arms": list(arms or []),
    }


def outcome(
    checks: list[bool],
    reason: str,
    competence: list[Competence],
    seeds: list[int],
    quick: bool,
    arms: list[str] | None = None,
) -> dict[str, Any]:
    """:func:`gated_fields` for the usual verdict: the claim's checks, one bool each, read by
    :func:`verdict_of` (held / did not hold / mixed), then gated."""
    return gated_fields(verdict_of(checks), reason, competence, seeds, quick, arms)


def spread(values: list[float]) -> dict[str, float]:
    """mean, min and max of per-seed values."""
    vals = [float(v) for v in values]
    if not vals:
        return {"mean": math.nan, "min": math.nan, "max": math.nan}
    return {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals)}


def spread_text(values: list[float], digits: int = 3) -> str:
    """``mean (min-max)`` over seeds, e.g. ``0.93 (0.91-0.95)``; a single value alone."""
    s = spread(values)
    if len(values) == 1:
        return f"{s['mean']:.{digits}g}"
    return f"{s['mean']:.{digits}g} ({s['min']:.{digits}g}-{s['max']:.{digits}g})"


def overlap(a: list[float], b: list[float]) -> bool:
    """True when the seed ranges [min, max] of ``a`` and ``b`` overlap: a difference between
    them lies inside the spread and a verdict resting on it must say so."""
    sa, sb = spread(a), spread(b)
    return not (sa["max"] < sb["min"] or sb["max"] < sa["min"])


@dataclass
class Report:
    """What an experiment found, ready to render as markdown."""

    name: str
    title: str
    claim: str  # quoted from the note
    source: str  # where the claim is, e.g. "000, 'Position representations'; 004 eq. 14"
    setup: list[str]
    tables: list[Table]
    verdict: str  # one of VERDICTS
    verdict_reason: str  # one honest sentence with the numbers
    figures: list[FigureRef] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)  # headline numbers, also for tests
    competence: list[Competence] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)  # every seed the numbers come from
    per_seed: dict[str, Any] = field(default_factory=dict)  # headline numbers, one per seed
    arms: list[str] = field(default_factory=list)  # the compared arms (the gate covers each)
    thresholds: list[Threshold] = field(default_factory=list)  # what the verdict is judged by
    quick: bool = False
    seed: int = 0
    command: str = ""
    wall_time_s: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)
    code_hash: str = ""  # provenance.code_hash of the code that ran (the runner fills it)
    code_modules: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} must be one of {list(VERDICTS)}")
        self.thresholds = [
            t if isinstance(t, Threshold) else Threshold(**t) for t in self.thresholds
        ]
        self.competence = [
            c
            if isinstance(c, Competence)
            else Competence(**{k: v for k, v in c.items() if k not in ("passed", "met")})
            for c in self.competence
        ]
        failed = missed(self.competence)
        if failed and self.verdict != "inconclusive":
            raise ValueError(
                f"verdict {self.verdict!r} drawn while arm(s) "
                f"{', '.join(c.arm for c in failed)} missed their competence criterion; "
                "the verdict must be 'inconclusive' (use attnlab.lab.kit.report.gate)"
            )

    def table(self, caption: str) -> Table:
        """The table with this caption (tests and later experiments look results up by name)."""
        for t in self.tables:
            if t.caption == caption:
                return t
        raise KeyError(f"no table {caption!r}; tables are {[t.caption for t in self.tables]}")

    def to_markdown(self) -> str:
        size = "quick (CI-sized)" if self.quick else "full-size"
        out = [f"# {self.title}", ""]
        out += [f"> {line}" for line in self.claim.strip().splitlines()]
        out += [">", f"> -- {self.source}", ""]
        out += [f"**Verdict: {self.verdict}.** {self.verdict_reason}", ""]
        if self.quick:
            out += ["*This is a quick, CI-sized run: the numbers are indicative only.*", ""]
        out += ["## Setup", ""] + [f"- {s}" for s in self.setup] + [""]
        if self.thresholds:
            out += ["Thresholds the verdict is judged by, with their source:", ""]
            out += [f"- {t.what}: {t.value} ({t.source})" for t in self.thresholds] + [""]
        if len(self.seeds) > 1:
            seeds = ", ".join(str(s) for s in self.seeds)
            out += [
                f"Seeds: {seeds}; numbers are the mean over seeds with the (min-max) range "
                "unless a table says otherwise.",
                "",
            ]
        elif self.seeds:
            out += [f"One seed ({self.seeds[0]}): no spread is measured.", ""]
        out += ["## Competence", ""]
        if self.competence:
            out += [
                "Each arm must learn its own training distribution before it is compared; "
                "an arm that misses makes the verdict inconclusive.",
                "",
            ]
            rows = [
                {
                    "arm": c.arm,
                    "criterion": c.criterion,
                    "threshold": (">= " if c.higher_is_better else "<= ") + f"{c.threshold:g}",
                    "per seed": ", ".join(f"{v:.4g}" for v in c.values),
                    "learning rate": c.lr.describe() if c.lr is not None else "-",
                    "step doubling": c.doubling.describe() if c.doubling is not None else "-",
                    "passed": c.passed,
                    "in verdict": c.in_verdict,
                }
                for c in self.competence
            ]
            out += [Table("competence", rows).to_markdown(), ""]
        else:
            out += ["(no trained arm is compared in this experiment)", ""]
        out += ["## Results", ""]
        for t in self.tables:
            out += [f"**{t.caption}**", "", t.to_markdown(), ""]
        for f in self.figures:
            out += [f"![{f.caption}]({f.file})", "", f"*{f.caption}*", ""]
        if self.findings:
            out += ["## What we saw", ""] + [f"- {s}" for s in self.findings] + [""]
        m = self.machine
        out += ["## Reproduce", "", "```", self.command, "```", ""]
        out += [
            f"{size} run, seed {self.seed}, wall time {self.wall_time_s:.1f} s on "
            f"{m.get('logical_cores', '?')} logical cores ({m.get('cpu_model', '?')}), "
            f"{m.get('threads', '?')} torch thread{'' if m.get('threads') == 1 else 's'}, "
            f"torch {m.get('torch', '?')}, "
            f"Python {m.get('python', '?')}.{_load_note(m)}",
            "",
        ]
        if self.code_hash:
            out += [
                f"Code hash `{self.code_hash}` over {len(self.code_modules)} modules (the "
                "experiment, the lab kit and the attnlab modules they import; see "
                "`attnlab.lab.kit.provenance`).",
                "",
            ]
        return "\n".join(out)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=_json_default, allow_nan=True)

    def write(self, out_dir: str | os.PathLike) -> Path:
        """Write README.md and report.json into ``out_dir``; returns the README path."""
        out = Path(out_dir)
        check_may_write(out, self.quick)
        atomic_write_text(out / DATA_FILE, self.to_json())
        return atomic_write_text(out / REPORT_FILE, self.to_markdown())


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


def check_may_write(out: Path, quick: bool) -> None:
    """A quick run must not replace a full-size report (the committed results)."""
    if out.exists() and not out.is_dir():
        raise UserError(
            f"out={str(out)!r} is a file; give a directory for the report", fields=("out",)
        )
    data = out / DATA_FILE
    if not quick or not data.is_file():
        return
    try:
        previous_quick = bool(json.loads(data.read_text(encoding="utf-8")).get("quick", True))
    except (OSError, ValueError, AttributeError):
        return  # unreadable: not a report we need to protect
    if not previous_quick:
        raise UserError(
            f"{str(out)!r} holds a full-size report; a quick run will not overwrite it. "
            "Give another out directory (or leave out unset to use a temporary one)",
            fields=("out",),
        )


def machine_info() -> dict[str, Any]:
    """Where the numbers come from: CPU model, logical cores, torch threads and versions."""
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": load_average(),
    }


def _load_note(machine: dict[str, Any]) -> str:
    load, cores = machine.get("load_average"), machine.get("logical_cores")
    if not load or not cores:
        return ""
    note = f" Load average at the end: {', '.join(f'{x:g}' for x in load)}"
    if load[0] > cores:
        return (
            note + " (above the core count: other processes shared the CPU, so times are inflated)."
        )
    return note + "."


def format_cell(value: Any) -> str:
    """Markdown cell text: floats to 4 significant digits, NaN shown as 'nan', pipes escaped."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot store {type(obj).__name__} in report.json")
