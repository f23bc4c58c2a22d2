"""The measurements behind the competence gate (:mod:`attnlab.lab.kit.report`): a learning-rate
sweep that brackets its choice, and step doubling.

A sweep scores a grid of rates (validation numbers, never the test set's) and, while the best lies
at an edge, tries one more rate beyond that edge (a factor ``step`` further), up to ``max_extra``
times: the chosen rate then has a tried rate on each side, or the :class:`LearningRate` says it has
not (and the gate makes the verdict inconclusive). Two shapes:

- :func:`train_gated`, the usual shape of an experiment's training: every arm's rate swept on the
  first seed (all arms' runs batched over processes), every seed trained at the chosen rate, the
  first seed again at twice the steps;
- :func:`bracketed_sweep`, one arm's sweep run by run, for an experiment that already runs each
  arm as one job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from attnlab.lab.kit.report import Doubling, LearningRate
from attnlab.lab.kit.seeds import run_jobs


def best_of(scores: dict[float, float], higher_is_better: bool) -> float:
    """The rate with the best finite score (ties: the smaller rate, the safer choice); when every
    run diverged (no finite score), the smallest rate, which the sweep then reports unbracketed."""
    finite = {r: v for r, v in scores.items() if math.isfinite(v)}
    if not finite:
        return min(scores)
    sign = -1.0 if higher_is_better else 1.0
    return min(sorted(finite), key=lambda r: sign * finite[r])


def extension(scores: dict[float, float], higher_is_better: bool, step: float) -> float | None:
    """The next rate to try: one ``step`` beyond the edge that holds the best, or None when the
    best is inside (bracketed)."""
    best, rates = best_of(scores, higher_is_better), sorted(scores)
    if len(rates) >= 3 and rates[0] < best < rates[-1]:
        return None
    return best * step if best == rates[-1] else best / step


R = TypeVar("R")


class Sweep(Generic[R]):
    """The runs of one arm's sweep, ``{lr: result}``, their scores, the chosen rate and what it
    was chosen on."""

    def __init__(
        self,
        runs: dict[float, R],
        scores: dict[float, float],
        chosen_on: str,
        higher_is_better: bool = False,
    ):
        self.runs, self.scores, self.chosen_on = runs, scores, chosen_on
        self.chosen = best_of(scores, higher_is_better)

    @property
    def best(self) -> R:
        """The result of the chosen rate's run."""
        return self.runs[self.chosen]

    def learning_rate(self) -> LearningRate:
        """The :class:`LearningRate` the report's competence entry carries."""
        return LearningRate(self.chosen, sorted(self.scores), chosen_on=self.chosen_on)


def bracketed_sweep(
    train: Callable[[float], R],
    grid: Sequence[float],
    score: Callable[[R], float],
    *,
    chosen_on: str,
    higher_is_better: bool = False,
    step: float = 3.0,
    max_extra: int = 2,
) -> Sweep[R]:
    """One arm's sweep, run by run: ``train(lr)`` at every rate of ``grid`` (>= 2 rates), then
    one rate past the edge holding the best (``step`` times further), at most ``max_extra``
    times. ``score(result)`` reads the validation number from a run's result, so the runs can be
    reused (the chosen rate's run is the first seed's result)."""
    if len(grid) < 2:
        raise ValueError(f"a sweep needs at least 2 rates to bracket a choice, got {list(grid)}")
    runs: dict[float, R] = {}
    scores: dict[float, float] = {}
    for lr in sorted(float(g) for g in grid):
        runs[lr] = train(lr)
        scores[lr] = float(score(runs[lr]))
    for _ in range(max_extra):
        beyond = extension(scores, higher_is_better, step)
        if beyond is None:
            break
        runs[beyond] = train(beyond)
        scores[beyond] = float(score(runs[beyond]))
    return Sweep(runs, scores, chosen_on, higher_is_better)


@dataclass
class ArmRuns:
    """What :func:`train_gated` trained: per arm, the chosen rate (with its sweep), one result
    per seed at that rate, and the first seed's result at twice the steps."""

    lr: dict[Any, LearningRate]
    sweeps: dict[Any, dict[float, float]]  # rate -> validation score, first seed
    per: dict[Any, list[Any]]
    double: dict[Any, Any]
    steps: int
    seeds: list[int]

    def doubling(self, arm: Hashable, value: Callable[[Any], float], tolerance: float,
                 metric: str) -> Doubling:  # fmt: skip
        """The arm's :class:`Doubling` on the first seed, ``value`` read from each result."""
        return Doubling(self.steps, [value(self.per[arm][0])], [value(self.double[arm])],
                        tolerance, self.seeds[:1], metric)  # fmt: skip


def train_gated(
    fn: Callable[[tuple], Any],
    arms: Sequence[Hashable],
    job: Callable[[Any, float, int, int], tuple],
    score: Callable[[Any], float],
    *,
    grid: Sequence[float],
    steps: int,
    seeds: Sequence[int],
    higher_is_better: bool,
    workers: int,
    chosen_on: str,
    step: float = 3.0,
    max_extra: int = 2,
) -> ArmRuns:
    """Train every arm under the gate's rule. ``job(arm, lr, steps, seed)`` is the picklable
    job of ``fn`` (run through :func:`attnlab.lab.kit.seeds.run_jobs`, ``workers`` at a time);
    ``score(result)`` its validation number. All arms' grids run as one batch, then each arm
    whose best rate lies at an edge tries one more rate beyond it (all such arms together), up
    to ``max_extra`` times; then the other seeds at the chosen rates and the first seed at
    ``2 * steps``, in one batch."""
    first = seeds[0]
    results: dict[tuple, Any] = {}

    def run(todo: list[tuple]) -> None:
        results.update(run_jobs(fn, [j for j in dict.fromkeys(todo) if j not in results], workers))

    run([job(a, float(r), steps, first) for a in arms for r in grid])
    sweeps = {a: {float(r): score(results[job(a, float(r), steps, first)]) for r in grid}
              for a in arms}  # fmt: skip
    for _ in range(max_extra):
        more = {a: extension(sweeps[a], higher_is_better, step) for a in arms}
        todo = {a: r for a, r in more.items() if r is not None}
        if not todo:
            break
        run([job(a, r, steps, first) for a, r in todo.items()])
        for a, r in todo.items():
            sweeps[a][r] = score(results[job(a, r, steps, first)])
    lr = {a: LearningRate(best_of(sweeps[a], higher_is_better), sorted(sweeps[a]),
                          chosen_on=chosen_on) for a in arms}  # fmt: skip
    run([job(a, lr[a].chosen, steps, s) for a in arms for s in seeds[1:]]
        + [job(a, lr[a].chosen, 2 * steps, first) for a in arms])  # fmt: skip
    return ArmRuns(
        lr=lr,
        sweeps=sweeps,
        per={a: [results[job(a, lr[a].chosen, steps, s)] for s in seeds] for a in arms},
        double={a: results[job(a, lr[a].chosen, 2 * steps, first)] for a in arms},
        steps=steps,
        seeds=list(seeds),
    )
