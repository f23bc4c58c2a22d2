"""A bracketed learning-rate sweep and a step doubling, the two halves of an arm's gate
(:class:`attnlab.lab.kit.report.LearningRate`, :class:`attnlab.lab.kit.report.Doubling`).

:func:`bracketed_sweep` trains one arm at every rate of a grid and keeps the rate with the lowest
score (e.g. validation loss on the arm's own training distribution). A choice at an edge of the
grid says the best rate may lie beyond it, so the grid is extended by one rate past that edge
(a factor ``step`` further) and the choice is made again, up to ``max_extra`` extensions; if the
choice is still at an edge the sweep reports it unbracketed (the gate then says so).

The caller's ``train(lr)`` returns whatever it measured (a dict, a tuple); ``score`` reads the
number to minimise from it, so the sweep's runs can be reused (the chosen rate's run is the
first seed's result).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from attnlab.lab.kit.report import LearningRate

R = TypeVar("R")


class Sweep(Generic[R]):
    """The runs of a sweep, ``{lr: result}``, the chosen rate and what it was chosen on."""

    def __init__(self, runs: dict[float, R], scores: dict[float, float], chosen_on: str):
        self.runs, self.scores, self.chosen_on = runs, scores, chosen_on
        finite = {lr: s for lr, s in scores.items() if math.isfinite(s)}
        pool = finite or scores  # every run diverged: any rate, reported unbracketed
        self.chosen = min(sorted(pool), key=lambda lr: pool[lr])

    @property
    def best(self) -> R:
        """The result of the chosen rate's run."""
        return self.runs[self.chosen]

    def learning_rate(self) -> LearningRate:
        """The :class:`LearningRate` the report's competence entry carries."""
        return LearningRate(self.chosen, sorted(self.scores), chosen_on=self.chosen_on)

    def at_edge(self) -> bool:
        return not self.learning_rate().bracketed


def bracketed_sweep(
    train: Callable[[float], R],
    grid: Sequence[float],
    score: Callable[[R], float],
    *,
    chosen_on: str,
    step: float = 3.0,
    max_extra: int = 2,
) -> Sweep[R]:
    """Train at every rate of ``grid`` (>= 2 rates), then extend the grid past the edge the best
    rate sits on, one rate (``step`` times further) at a time, at most ``max_extra`` times."""
    if len(grid) < 2:
        raise ValueError(f"a sweep needs at least 2 rates to bracket a choice, got {list(grid)}")
    runs: dict[float, R] = {}
    scores: dict[float, float] = {}

    def add(lr: float) -> None:
        runs[lr] = train(lr)
        scores[lr] = float(score(runs[lr]))

    for lr in sorted(float(g) for g in grid):
        add(lr)
    sweep = Sweep(runs, scores, chosen_on)
    for _ in range(max_extra):
        if not sweep.at_edge():
            break
        add(sweep.chosen * step if sweep.chosen == max(scores) else sweep.chosen / step)
        sweep = Sweep(runs, scores, chosen_on)
    return sweep
