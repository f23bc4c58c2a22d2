"""The timing harness: interleaved rounds, medians, ratios against targets.

A *workload* is a callable ``work(round_index) -> units`` that does one piece of work (a training
step, one generate call, one attention forward+backward) and returns how much it did (tokens,
FLOPs, calls). Contenders of one comparison are timed in **interleaved rounds**

    round r:  A(r) B(r) C(r)   (each repeated ``repeats[name]`` times back to back)

so slow drifts of the machine (other jobs, thermal state) hit every contender alike, instead of
all-A-then-all-B. Every contender gets ``warmup`` untimed calls first (allocation, kernel
selection, lazy init), plus one more when a call is cheap (< min_round_s / 2), and its
``repeats`` per round is calibrated from the fastest warm-up call so a round lasts about
``min_round_s``. A round's rate is units / seconds; we report the **median** of
the per-round rates (robust to one round hit by a noisy neighbour) and keep every round in the
JSON so the spread can be checked.

Ratios compare medians: ratio = rate(A) / rate(B). A target is met when ratio >= target (or, for
"lower is better" targets such as time or memory fractions, ratio <= target).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from attnlab.errors import ConfigValueError

Workload = Callable[[int], float]


def setup_torch(threads: int | None = None) -> int:
    """Pin the intra-op thread count (default: every core) and flush denormals; return threads.

    Denormal floats are ~100x slower on x86; flushing them to zero is what every fast CPU kernel
    assumes, so it is set for every contender alike.
    """
    n = threads if threads is not None else available_cores()
    if n < 1:
        raise ConfigValueError(f"threads must be >= 1, got {n}", fields=("threads",))
    torch.set_num_threads(n)
    torch.set_flush_denormal(True)
    return n


def available_cores() -> int:
    """CPU cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class Timing:
    """Every timed round of one contender: seconds and units of work per round."""

    name: str
    repeats: int
    seconds: list[float] = field(default_factory=list)
    units: list[float] = field(default_factory=list)
    warmup_seconds: list[float] = field(default_factory=list)

    @property
    def rates(self) -> list[float]:
        """units / second of each round."""
        return [u / s if s > 0 else math.inf for u, s in zip(self.units, self.seconds)]

    @property
    def median_rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def median_seconds_per_call(self) -> float:
        return statistics.median(s / self.repeats for s in self.seconds)

    def to_dict(self, unit: str) -> dict[str, Any]:
        """JSON fields: ``<unit>_per_s`` (median), ``<unit>_per_s_rounds``, ``seconds_rounds``."""
        return {
            f"{unit}_per_s": self.median_rate,
            f"{unit}_per_s_rounds": self.rates,
            "seconds_rounds": self.seconds,
            "calls_per_round": self.repeats,
            "seconds_per_call": self.median_seconds_per_call,
            "rel_spread": relative_spread(self.rates),
            "warmup_seconds": self.warmup_seconds,
        }


def relative_spread(values: list[float]) -> float:
    """(max - min) / median: how noisy the rounds were (0.05 = within 5%)."""
    if not values:
        return math.nan
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else math.nan


def interleave(
    workloads: Mapping[str, Workload],
    *,
    rounds: int,
    warmup: int = 1,
    min_round_s: float = 0.5,
    max_repeats: int = 1000,
    clock: Callable[[], float] = time.perf_counter,
    log: list[tuple[str, int]] | None = None,
) -> dict[str, Timing]:
    """Time ``workloads`` in interleaved rounds; return one :class:`Timing` per contender.

    ``log`` (if given) receives ``(name, round_index)`` for every call in execution order; warm-up
    calls carry round index -1. Round r passes ``r`` to each workload, so a workload can use the
    same input in round r as its rivals (``identical inputs per round``).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if not workloads:
        raise ValueError("nothing to time: no workloads given")
    repeats: dict[str, int] = {}
    warm: dict[str, list[float]] = {}
    for name, work in workloads.items():
        warm[name] = []
        for _ in range(max(1, warmup)):
            warm[name].append(_timed(work, clock, name, log))
        if min(warm[name]) < min_round_s / 2:  # cheap: calibrate on a call that is not the first
            warm[name].append(_timed(work, clock, name, log))
        repeats[name] = _calibrate(min(warm[name]), min_round_s, max_repeats)
    timings = {name: Timing(name, repeats[name], warmup_seconds=warm[name]) for name in workloads}
    for r in range(rounds):
        for name, work in workloads.items():
            units = 0.0
            t0 = clock()
            for _ in range(repeats[name]):
                units += work(r)
                if log is not None:
                    log.append((name, r))
            timings[name].seconds.append(clock() - t0)
            timings[name].units.append(units)
    return timings


def _timed(work: Workload, clock, name: str, log: list | None) -> float:
    t0 = clock()
    work(-1)
    if log is not None:
        log.append((name, -1))
    return clock() - t0


def _calibrate(seconds_per_call: float, min_round_s: float, max_repeats: int) -> int:
    if not math.isfinite(seconds_per_call) or seconds_per_call <= 0:
        return 1
    return int(min(max_repeats, max(1, math.ceil(min_round_s / seconds_per_call))))


def ratio(numerator: float | None, denominator: float | None) -> float:
    """numerator / denominator, NaN when either side is missing or the denominator is 0."""
    if numerator is None or denominator is None or not denominator:
        return math.nan
    return numerator / denominator


def target_entry(
    target_id: str,
    description: str,
    value: float | None,
    target: float,
    *,
    higher_is_better: bool = True,
    note: str = "",
) -> dict[str, Any]:
    """One row of the targets table: value vs target, met or not and by how much.

    ``margin`` is value / target for higher-is-better targets and target / value otherwise, so
    margin >= 1 always means "met" and 0.8 means "20% short".
    """
    met: bool | None = None
    margin: float | None = None
    if value is not None and not math.isfinite(value):
        value = None
    if value is not None:
        met = value >= target if higher_is_better else value <= target
        margin = value / target if higher_is_better else (target / value if value else math.inf)
    return {
        "id": target_id,
        "description": description,
        "value": value,
        "target": target,
        "higher_is_better": higher_is_better,
        "met": met,
        "margin": margin,
        "note": note,
    }


def loglog_slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares exponent a of y ~ c x^a (slope of log y on log x); None with < 2 points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
