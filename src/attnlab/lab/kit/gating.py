"""The measurements behind the competence gate (:mod:`attnlab.lab.kit.report`): a learning-rate
sweep that brackets its choice, and step doubling.

:func:`train_gated` is the usual shape of an experiment's training: every arm's rate swept on the
first seed, every seed trained at the chosen rate, the first seed again at twice the steps.

:func:`bracketed_sweep` scores a grid of rates and, while the best lies at an edge, tries one more
rate beyond that edge (a factor ``step`` further), up to ``max_extra`` times: the chosen rate then
has a tried rate on each side, or the returned :class:`LearningRate` says it has not (and the gate
makes the verdict inconclusive). Scores are validation numbers, never the test set's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnlab.lab.kit.report import Doubling, LearningRate
from attnlab.lab.kit.seeds import run_jobs

Scorer = Callable[[list[float]], dict[float, float]]  # rates -> {rate: validation metric}


def best_of(scores: dict[float, float], higher_is_better: bool) -> float:
    """The rate with the best score (ties: the smaller rate, the safer choice)."""
    sign = -1.0 if higher_is_better else 1.0
    return min(sorted(scores), key=lambda r: sign * scores[r])


def bracketed_sweep(
    score: Scorer,
    grid: Sequence[float],
    higher_is_better: bool,
    step: float = 3.0,
    max_extra: int = 2,
    chosen_on: str = "",
) -> tuple[LearningRate, dict[float, float]]:
    """Score ``grid`` (one call, so the caller may run the rates in parallel), then extend it
    past whichever edge holds the best rate, one rate per call, until the best is inside or
    ``max_extra`` extensions are spent. Returns the :class:`LearningRate` and every score."""
    scores = dict(score(sorted(float(r) for r in grid)))
    for _ in range(max_extra):
        beyond = extension(scores, higher_is_better, step)
        if beyond is None:
            break
        scores.update(score([beyond]))
    chosen = best_of(scores, higher_is_better)
    return LearningRate(chosen, sorted(scores), chosen_on=chosen_on), scores


def extension(scores: dict[float, float], higher_is_better: bool, step: float) -> float | None:
    """The next rate to try: one ``step`` beyond the edge that holds the best, or None when the
    best is inside (bracketed)."""
    best, rates = best_of(scores, higher_is_better), sorted(scores)
    if len(rates) >= 3 and rates[0] < best < rates[-1]:
        return None
    return best * step if best == rates[-1] else best / step


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
    grid: Sequence[float] | Mapping[Any, Sequence[float]],
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
    ``2 * steps``, in one batch. ``grid`` is one grid for every arm, or a grid per arm (a
    mapping ``{arm: rates}``, e.g. multiples of each arm's own recipe rate)."""
    first = seeds[0]
    results: dict[tuple, Any] = {}

    def run(todo: list[tuple]) -> None:
        results.update(run_jobs(fn, [j for j in dict.fromkeys(todo) if j not in results], workers))

    grids = {a: grid[a] if isinstance(grid, Mapping) else grid for a in arms}
    run([job(a, float(r), steps, first) for a in arms for r in grids[a]])
    sweeps = {a: {float(r): score(results[job(a, float(r), steps, first)]) for r in grids[a]}
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
