"""How a verdict is drawn: the verdict words and the competence gate.

The competence gate (the rule of docs/experiments/README.md): a comparison between arms says
something about the claim only if every compared arm learned its own training distribution. Each
experiment names its compared arms (``Report.arms``) and states, per arm, a
:class:`Competence` criterion measured on every seed (e.g. ">= 0.99 per-token accuracy on the
training lengths"), shown

- at a learning rate **bracketed** by the arm's sweep (:class:`LearningRate`: the chosen rate has
  a tried rate on each side; a choice at a grid edge extends the grid), and
- by **step doubling** (:class:`Doubling`: doubling the training steps changes the arm's metric
  by less than a stated tolerance, so the arm has reached what its recipe can reach).

An arm whose failure is the claim gets the same sweep and doubling as the winner. A full-size
report whose compared arm misses its criterion, lacks its sweep or doubling, or has no criterion
at all carries the verdict "inconclusive" (:func:`gate` builds it; a report refuses anything else)
and says which arm missed what, keeping the numbers the comparison would have rested on.

A criterion measures whether the arm learned its *training setup*, never the outcome the claim
predicts for it. Where an arm's failure is the finding (one attention head on a task that needs
two), its criterion is convergence itself -- the doubling -- so a failure at the plateau counts,
and a failure that more training would remove makes the verdict inconclusive.

Verdict words, one meaning each (:data:`VERDICTS`): **held**, **did not hold**, **mixed** (some of
the claim's checks held, others did not), **no effect resolved** (the difference the claim
predicts lies inside the seed spread), **inconclusive** (an arm failed its gate, or too few seeds).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from attnlab.lab.kit.seeds import MIN_SEEDS, spread_text

COMPARISON = "The comparison would have read:"  # how an inconclusive reason keeps the numbers
VERDICTS = ("held", "did not hold", "mixed", "no effect resolved", "inconclusive")
VERDICT_MEANINGS = {
    "held": "every check of the claim held",
    "did not hold": "no check of the claim held",
    "mixed": "some of the claim's checks held, others did not",
    "no effect resolved": "the difference the claim predicts lies inside the seed spread",
    "inconclusive": "an arm failed its competence gate, or fewer than 3 seeds back the numbers",
}


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

    def pairs(self) -> list[tuple[float, float]]:
        """(metric after ``steps``, after ``2 * steps``) per seed."""
        return list(zip(self.at_steps, self.at_double))

    def describe(self) -> str:
        pairs = ", ".join(f"{a:.4g} -> {b:.4g}" for a, b in self.pairs())
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

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Competence:
        """A criterion from its report.json record, ``met`` and ``passed`` derived again."""
        return cls(**{k: v for k, v in record.items() if k not in ("met", "passed")})

    @property
    def gated(self) -> bool:
        """Whether the full rule applies: a bracketed rate and a step doubling are both given."""
        return self.lr is not None and self.doubling is not None

    def shortfalls(self) -> list[tuple[str, str]]:
        """What this criterion missed, each as (what was missed, the arm's numbers): its
        threshold, the bracket of its learning rate, its step doubling; empty when it passed.
        What passed is not listed (the report's competence table shows every criterion)."""
        out = []
        if not self.met:
            numbers = f"{spread_text(self.values)}; threshold {self.threshold:g}"
            out.append((f"missed {self.criterion}", numbers))
        if self.lr is not None and not self.lr.bracketed:
            out.append(("learning rate at its grid's edge", self.lr.describe()))
        d = self.doubling
        if d is not None and not d.converged:
            moved = (
                f"not converged ({d.metric or 'metric'} moved more than {d.tolerance:g} "
                f"from {d.steps} to {2 * d.steps} steps)"
            )
            out.append((moved, ", ".join(f"{a:.4g} -> {b:.4g}" for a, b in d.pairs())))
        return out


def missed(competence: list[Competence]) -> list[Competence]:
    """The criteria of compared arms that were missed (threshold, bracket or doubling)."""
    return [c for c in competence if c.in_verdict and not c.passed]


def missed_text(failed: list[Competence], comparison: str) -> str:
    """An inconclusive verdict's reason: the arms' shortfalls grouped by what was missed (one
    entry per arm and shortfall, only what failed), then what the comparison would have read."""
    groups: dict[str, list[str]] = {}
    for c in failed:
        for what, numbers in c.shortfalls():
            groups.setdefault(what, []).append(f"{c.arm} ({numbers})")
    shortfalls = "; ".join(f"{what}: {', '.join(arms)}" for what, arms in groups.items())
    n_arms = len({c.arm for c in failed})  # an arm may miss more than one criterion
    return (
        f"no verdict: {n_arms} arm(s) missed their gate (every criterion in the report) -- "
        f"{shortfalls}. {COMPARISON} {comparison}"
    )


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
        return "inconclusive", missed_text(failed, reason)
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


def verdict_of_directions(states: Iterable[str]) -> str:
    """The verdict word of checks that each read one of three ways (docs/lab.md, the verdict
    words): "above" (resolved as the claim says: seed ranges apart, in the claimed direction),
    "below" (resolved otherwise: the other way, or short of the claim's margin) or "inside" (in
    the seed spread). held: every check above; mixed: some above, others not; did not hold: none
    above and some below; no effect resolved: every check inside."""
    seen = set(states)
    if not seen <= {"above", "below", "inside"}:
        raise ValueError(f"each check reads 'above', 'below' or 'inside', got {sorted(seen)}")
    if seen == {"above"}:
        return "held"
    if "above" in seen:
        return "mixed"
    return "did not hold" if "below" in seen else "no effect resolved"


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
