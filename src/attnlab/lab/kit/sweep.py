"""A learning-rate sweep whose choice is bracketed (the gate of :mod:`attnlab.lab.kit.report`).

An arm's rate is the best of a grid of tried rates; a choice at the grid's edge says the best
rate may lie outside it, so the grid is extended by one more rate beyond that edge (the grid's
own ratio between neighbours: 1e-3, 3e-3, 1e-2 extends to 3e-2 or 3e-4) and the sweep goes on,
up to ``max_extensions`` times (the stated limit). A rate whose run diverged (a non-finite
score) counts as the worst. The result is a :class:`~attnlab.lab.kit.report.LearningRate`, which
says itself whether the final choice is bracketed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from attnlab.lab.kit.report import LearningRate

Scorer = Callable[[list[float]], dict[float, float]]  # rates -> {rate: score} (runs them all)
MAX_EXTENSIONS = 2  # at most two rates beyond the grid's edge


def _rank(score: float, higher_is_better: bool) -> float:
    if not math.isfinite(score):
        return math.inf
    return -score if higher_is_better else score


def best_rate(scores: dict[float, float], higher_is_better: bool = False) -> float:
    """The rate with the best score (the lower rate on a tie)."""
    return min(sorted(scores), key=lambda lr: _rank(scores[lr], higher_is_better))


def bracketed_lr(
    score: Scorer,
    grid: Sequence[float],
    *,
    chosen_on: str,
    higher_is_better: bool = False,
    max_extensions: int = MAX_EXTENSIONS,
) -> tuple[LearningRate, dict[float, float]]:
    """Sweep ``grid`` with ``score`` (one call per round, so the caller may run a round's rates
    in parallel), extending the grid past an edge choice up to ``max_extensions`` times.
    Returns the :class:`LearningRate` (chosen rate, every rate tried) and every rate's score."""
    rates = sorted(float(g) for g in grid)
    if len(rates) < 2:
        raise ValueError(f"a learning-rate sweep needs at least 2 rates, got {rates}")
    scores = dict(score(rates))
    for _ in range(max_extensions):
        tried = sorted(scores)
        best = best_rate(scores, higher_is_better)
        if best == tried[0]:
            new = tried[0] * tried[0] / tried[1]
        elif best == tried[-1]:
            new = tried[-1] * tried[-1] / tried[-2]
        else:
            break
        scores |= score([new])
    best = best_rate(scores, higher_is_better)
    return LearningRate(best, sorted(scores), chosen_on=chosen_on), scores
