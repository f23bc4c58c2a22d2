"""The learning-rate sweep behind the competence gate (:mod:`attnlab.lab.kit.report`), which
brackets its choice (step doubling needs no helper: train at 2x the steps and build a
:class:`~attnlab.lab.kit.report.Doubling`).

:func:`bracketed_sweep` scores a grid of rates and, while the best lies at an edge, tries one more
rate beyond that edge (a factor ``step`` further), up to ``max_extra`` times: the chosen rate then
has a tried rate on each side, or the returned :class:`LearningRate` says it has not (and the gate
makes the verdict inconclusive). Scores are validation numbers, never the test set's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attnlab.lab.kit.report import LearningRate

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
        best, rates = best_of(scores, higher_is_better), sorted(scores)
        if rates[0] < best < rates[-1]:
            break
        beyond = best * step if best == rates[-1] else best / step
        scores.update(score([beyond]))
    chosen = best_of(scores, higher_is_better)
    return LearningRate(chosen, sorted(scores), chosen_on=chosen_on), scores
