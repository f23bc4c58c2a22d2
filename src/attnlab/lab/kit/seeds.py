"""Seeds, spread and parallel runs for the experiments.

Every headline number of a full-size report comes from :data:`MIN_SEEDS`
seeds (``seed, seed + 1, ...``); a quick run uses one. Independent seeded runs go to a process
pool, one single-threaded run per core (:func:`run_jobs`): the results do not depend on which
process ran a job or in which order, because each job seeds itself.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Generator, Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

import torch

MIN_SEEDS = 3  # a full-size verdict rests on at least this many seeds


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


def resolved(a: list[float], b: list[float]) -> bool:
    """Whether a difference between two arms' per-seed values is resolved: their seed ranges do
    not overlap. A claim whose predicted difference is not resolved reads "no effect resolved"."""
    return not overlap(a, b)


def seed_list(seed: int, quick: bool, n: int = MIN_SEEDS) -> list[int]:
    """The seeds a run uses: ``[seed]`` for a quick run, ``seed .. seed + n - 1`` otherwise."""
    return [seed] if quick else [seed + i for i in range(n)]


def start_seeds(seed: int, quick: bool, n: int = MIN_SEEDS) -> list[int]:
    """:func:`seed_list` for a run of small models, after pinning torch to one thread (a second
    thread costs more than it gives, and the pool in :func:`run_jobs` runs one job per core)."""
    torch.set_num_threads(1)
    return seed_list(seed, quick, n)


def run_jobs(
    fn: Callable[[Any], Any],
    jobs: Sequence[Hashable],
    workers: int = 2,
    cost: Callable[[Any], float] | None = None,
) -> dict:
    """``{job: fn(job)}`` for every job, ``workers`` spawned processes at a time (``fn`` must be
    a module-level function; jobs are picklable tuples): :func:`run_plans` with one plan."""

    def plan() -> Plan:
        yield list(jobs)

    results = run_plans(fn, [plan()], workers if len(jobs) > 1 else 1, cost)
    return {job: results[job] for job in jobs}


Plan = Generator[Sequence[Hashable], dict, None]  # yields jobs; is sent their results


def run_plans(
    fn: Callable[[Any], Any],
    plans: Sequence[Plan],
    workers: int = 2,
    cost: Callable[[Any], float] | None = None,
) -> dict:
    """Run the jobs ``plans`` ask for and return ``{job: fn(job)}`` for all of them. A plan is a
    generator that yields the jobs it needs next and is sent ``{job: result}`` for them once all
    are done (then it yields its next jobs, or ends), so each plan -- an arm's sweep, doubling and
    seeds -- moves on as soon as its own jobs are done, while the others' still run: a worker is
    never idle while any plan has a job to run. A job asked for twice runs once.

    ``workers`` spawned processes run at a time (``fn`` must be a module-level function; jobs
    are picklable tuples), each job on one torch thread (small models: a second thread costs
    more than it gives). With ``cost(job)``, the costliest ready jobs start first. The
    environment variable ``ATTNLAB_LAB_WORKERS`` caps ``workers`` (e.g. 1 when two experiments
    run side by side). A job goes to the pool only when a worker is free: an interrupt (Ctrl-C
    reaches the workers too) or a failed job ends the run after the running jobs, with no queued
    job starting. The results do not depend on the order, since each job seeds itself."""
    cap = os.environ.get("ATTNLAB_LAB_WORKERS")
    if cap:
        workers = min(workers, max(1, int(cap)))
    results: dict[Hashable, Any] = {}
    waiting: dict[int, list[Hashable]] = {}  # plan -> the jobs it waits for

    def resume(i: int, sent: dict | None) -> None:
        try:
            waiting[i] = list(dict.fromkeys(plans[i].send(sent)))  # type: ignore[arg-type]
        except StopIteration:
            waiting.pop(i, None)

    def advance() -> None:  # resume every plan whose jobs are all done, until none is
        while done := [i for i, jobs in waiting.items() if all(j in results for j in jobs)]:
            for i in done:
                resume(i, {j: results[j] for j in waiting[i]})

    def ready(running: Sequence[Hashable]) -> list[Hashable]:  # asked for, not done or running
        todo = [j for jobs in waiting.values() for j in jobs if j not in results]
        todo = [j for j in dict.fromkeys(todo) if j not in running]
        return sorted(todo, key=lambda j: -cost(j)) if cost is not None else todo

    for i in range(len(plans)):
        resume(i, None)  # each plan's first jobs
    advance()
    if workers <= 1:
        torch.set_num_threads(1)
        while waiting:
            for job in ready(()):
                results[job] = fn(job)
            advance()
        return results
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with torch threads
    running: dict[Future, Hashable] = {}
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=torch.set_num_threads, initargs=(1,)
    ) as pool:
        while waiting:
            for job in ready(list(running.values()))[: workers - len(running)]:
                running[pool.submit(fn, job)] = job  # handed over only to a free worker
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                results[running.pop(future)] = future.result()  # a failed job stops the run
            advance()
    return results


def run_arms(
    fn: Callable[[tuple], Any], arms: Sequence[Hashable], seeds: Sequence[int], quick: bool
) -> dict:
    """Every arm on every seed: ``fn((*arm, seed, quick))`` through :func:`run_jobs` (one process
    for a quick run, two otherwise), as ``{arm: [the result of each seed, in seed order]}``. An
    arm is a tuple of settings, or one value standing for a 1-tuple."""
    keys = {arm: arm if isinstance(arm, tuple) else (arm,) for arm in arms}
    jobs = [(*keys[arm], s, quick) for arm in arms for s in seeds]
    results = run_jobs(fn, jobs, 1 if quick else 2)
    return {arm: [results[keys[arm] + (s, quick)] for s in seeds] for arm in arms}


def bands(per_seed: Sequence[Sequence[float]]) -> tuple[list[float], list[float], list[float]]:
    """(means, mins, maxes) along a curve from one curve per seed (all the same length)."""
    cols = [spread(list(c)) for c in zip(*per_seed)]
    return [c["mean"] for c in cols], [c["min"] for c in cols], [c["max"] for c in cols]
