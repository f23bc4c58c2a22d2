"""The gate of arms chosen by their validation loss, kept as plain data: the shared measuring
step of ``enc_dec_vs_dec_only``, ``relative_offset`` and ``source_reversal``.

:func:`gated_by_loss` runs :func:`attnlab.lab.kit.gating.train_gated` for the arms of a job
function ``fn((arm, lr, steps, seed))`` whose result carries ``val_loss`` (lower is better): a
learning-rate sweep on the first seed (bracketed: an edge choice extends the grid), every seed
at the chosen rate, the first seed at twice the steps; two runs at a time (one for --quick).
:func:`first_doubling` and :func:`sweep_rows` read an arm's doubling and the sweep table back
from that record, so ``write_up`` trains nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attnlab.lab.kit.gating import train_gated
from attnlab.lab.kit.seeds import start_seeds
from attnlab.lab.kit.verdict import Doubling


def _job(arm: str, lr: float, steps: int, seed: int) -> tuple[str, float, int, int]:
    return (arm, lr, steps, seed)


def _val_loss(result: dict[str, Any]) -> float:
    return float(result["val_loss"])


def gated_by_loss(
    fn: Callable[[tuple], dict[str, Any]],
    arms: Sequence[str],
    quick: bool,
    seed: int,
    *,
    grid: Sequence[float],
    steps: int,
    chosen_on: str,
) -> dict[str, Any]:
    """Every arm gated and trained on every seed (``chosen_on``: what the sweep's validation
    loss is, e.g. "validation loss per target token, seed 0"): ``arms``, ``seeds``, ``steps``,
    ``lr`` (the chosen :class:`~attnlab.lab.kit.verdict.LearningRate` per arm), ``sweeps``
    (rate -> validation loss), ``per`` (one result per seed) and ``double`` (the first seed at
    twice the steps)."""
    runs = train_gated(fn, list(arms), _job, _val_loss, grid=grid, steps=steps,
                       seeds=start_seeds(seed, quick), higher_is_better=False,
                       workers=1 if quick else 2, chosen_on=chosen_on)  # fmt: skip
    return {"arms": list(arms), "seeds": runs.seeds, "steps": runs.steps, "lr": runs.lr,
            "sweeps": runs.sweeps, "per": runs.per, "double": runs.double}  # fmt: skip


def first_doubling(
    m: dict[str, Any], arm: str, key: str, tolerance: float, metric: str
) -> Doubling:
    """The arm's step doubling: ``key`` of the first seed's result at the budget and at twice
    it, converged when it moves by at most ``tolerance``."""
    first, double = m["per"][arm][0][key], m["double"][arm][key]
    return Doubling(m["steps"], [first], [double], tolerance, m["seeds"][:1], metric)


def sweep_rows(m: dict[str, Any], arms: Sequence[str]) -> list[dict[str, Any]]:
    """One table row per arm and tried rate: its validation loss on the first seed, and which
    rate was chosen."""
    return [
        {"arm": a, "lr": lr, "validation loss (seed 0)": v, "chosen": lr == m["lr"][a].chosen}
        for a in arms
        for lr, v in sorted(m["sweeps"][a].items())
    ]
