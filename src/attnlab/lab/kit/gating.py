"""Gating an arm: a bracketed learning-rate sweep and a step doubling (the rule of
:mod:`attnlab.lab.kit.verdict`), run for many arms at once through the process pool.

For every arm the same procedure, whatever the claim predicts for it:

1. **Sweep** the rates of :attr:`Sweep.grid` on the first seed at the arm's step budget and score
   each by the arm's metric (lower is better, e.g. validation loss). Rates whose score lies within
   :attr:`Sweep.tie` of the best are tied; the chosen rate is the tied one nearest the middle of
   the tried rates (a flat sweep -- an arm stuck at the same loss at every rate -- chooses an
   inner rate, not the noise's edge). A choice at an edge of the tried rates adds the next rate
   beyond it (times or divided by :attr:`Sweep.factor`), at most :attr:`Sweep.max_extensions`
   rates per arm; a choice still at the edge then is reported unbracketed.
2. **Seeds**: every other seed at the chosen rate (the first seed's sweep run is reused).
3. **Doubling**: the chosen rate at twice the steps (the schedule stretched) on
   :attr:`Sweep.doubling_seeds` seeds (the first ones); converged when the metric moves by at most
   :attr:`Sweep.tolerance` on each.

Other shapes share the choice and the extension rule: :func:`train_gated`, the whole gate for a
job function of the experiment's own shape and a score that may be higher-is-better (one arm or
many; :meth:`ArmRuns.record` and :func:`recorded_competence` keep an arm's gate as plain data);
:func:`bracketed_lr`, one arm's sweep a round of rates at a time, and :func:`bracketed_sweep`, the
same run by run, keeping each rate's result (for an experiment that runs the seeds and doubling
itself).

A training job of :func:`gate_arms` is the tuple ``(arm, lr, scale, seed, quick, data)``: ``arm``
the experiment's own (hashable) arm key, ``scale`` 1 or 2 (the step multiplier of the doubling),
``data`` the folder of real datasets or None. The experiment's module-level ``train(job) -> dict``
returns at least the metric under ``Sweep.metric_key`` (``inf`` for a diverged run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from attnlab.lab.kit.seeds import Plan, run_plans
from attnlab.lab.kit.verdict import Competence, Doubling, LearningRate

Job = tuple[Any, float, int, int, bool, Any]  # (arm, lr, scale, seed, quick, data)


@dataclass(frozen=True)
class Sweep:
    """The learning-rate sweep and step doubling every gated arm of an experiment gets."""

    grid: tuple[float, ...]  # the rates tried first
    tolerance: float  # doubling: largest change of the metric that counts as converged
    metric: str  # what the metric is, e.g. "validation loss (nats/char)"
    metric_key: str = "metric"  # its key in the train function's result dict
    factor: float = 3.0  # an edge choice adds edge * factor (or / factor)
    max_extensions: int = 2  # at most this many added rates per arm
    tie: float | None = None  # scores within this of the best are tied (default: tolerance)
    doubling_seeds: int = 1  # the doubling runs on this many of the first seeds

    def describe(self, steps: str) -> str:
        """One setup line stating the rule with its numbers."""
        grid = ", ".join(f"{g:g}" for g in sorted(self.grid))
        return (
            f"Gate of every compared arm: learning rates {{{grid}}} swept on the first seed at "
            f"{steps}, scored by {self.metric}; rates within {self.tie_width:g} of the best are "
            f"tied and the chosen one is the tied rate nearest the middle of the tried rates; a "
            f"choice at an edge adds the next rate (x{self.factor:g} or /{self.factor:g}), at "
            f"most {self.max_extensions} per arm. Step doubling on the first "
            f"{self.doubling_seeds} seed(s): twice the steps, converged when the metric moves by "
            f"at most {self.tolerance:g}."
        )

    @property
    def tie_width(self) -> float:
        return self.tolerance if self.tie is None else self.tie

    def quick(self, grid: tuple[float, ...], max_extensions: int = 1) -> Sweep:
        """The quick (CI-sized) form of this sweep: the same metric, tolerance and extension
        factor on ``grid``, at most ``max_extensions`` added rates, the doubling on one seed."""
        return replace(self, grid=grid, max_extensions=max_extensions, doubling_seeds=1)


@dataclass
class Gated:
    """One arm's runs: the sweep's scores, the chosen rate, the result of every seed at that rate
    (in seed order) and the doubling runs' results (2x steps, the first seeds)."""

    scores: dict[float, float]
    chosen: float
    bracketed: bool
    runs: list[dict[str, Any]]
    doubled: list[dict[str, Any]]
    seeds: list[int]
    doubling_seeds: list[int] = field(default_factory=list)

    def learning_rate(self, sweep: Sweep) -> LearningRate:
        return LearningRate(
            self.chosen, sorted(self.scores), chosen_on=f"{sweep.metric}, seed {self.seeds[0]}"
        )

    def doubling(self, sweep: Sweep, steps: int) -> Doubling:
        key = sweep.metric_key
        return Doubling(
            steps,
            [self.runs[i][key] for i in range(len(self.doubling_seeds))],
            [r[key] for r in self.doubled],
            sweep.tolerance,
            self.doubling_seeds,
            sweep.metric,
        )

    def values(self, key: str) -> list[Any]:
        """``key`` of every seed's run at the chosen rate."""
        return [r[key] for r in self.runs]

    def competence(
        self,
        arm: str,
        criterion: str,
        threshold: float,
        sweep: Sweep,
        steps: int,
        key: str | None = None,
        higher_is_better: bool = True,
    ) -> Competence:
        """The arm's :class:`Competence`: ``criterion`` against ``threshold`` on every seed's
        ``key`` (default: the sweep's metric), with the sweep's rate and the step doubling."""
        return Competence(
            arm,
            criterion,
            threshold,
            self.values(key or sweep.metric_key),
            higher_is_better=higher_is_better,
            lr=self.learning_rate(sweep),
            doubling=self.doubling(sweep, steps),
        )


def choose(scores: dict[float, float], tie: float) -> float:
    """The chosen rate of a sweep: among rates within ``tie`` of the best score, the one nearest
    the middle of the tried rates (ties broken towards the best score); the smallest rate when
    every run diverged."""
    rates = sorted(scores)
    finite = [s for s in scores.values() if math.isfinite(s)]
    if not finite:  # every run diverged: the smallest rate, so an extension tries lower
        return rates[0]
    best = min(finite)
    tied = [r for r in rates if scores[r] <= best + tie]
    middle = (len(rates) - 1) / 2
    return min(tied, key=lambda r: (abs(rates.index(r) - middle), scores[r]))


def _edge_extension(scores: dict[float, float], sweep: Sweep) -> float | None:
    """The next rate to try when the choice sits at an edge (None: bracketed or limit reached)."""
    rates = sorted(scores)
    chosen = choose(scores, sweep.tie_width)
    if len(rates) - len(sweep.grid) >= sweep.max_extensions:
        return None
    if chosen == rates[0]:
        return rates[0] / sweep.factor
    if chosen == rates[-1]:
        return rates[-1] * sweep.factor
    return None


def gate_arms(
    train: Callable[[Job], dict[str, Any]],
    arms: Sequence[Hashable],
    sweep: Sweep,
    seeds: Sequence[int],
    quick: bool,
    data: Path | None,
    workers: int | None = None,
    cost: Callable[[Job], float] | None = None,
) -> dict[Any, Gated]:
    """Sweep, seeds and doubling for every arm (module docstring), each arm moving on as soon as
    its own jobs are done (:func:`attnlab.lab.kit.seeds.run_plans`): an arm whose sweep is
    settled runs its seeds and doubling while another still extends its grid."""
    seeds = list(seeds)
    double_seeds = seeds[: max(1, sweep.doubling_seeds)]
    workers = workers if workers is not None else (1 if quick else 2)

    def job(arm: Hashable, lr: float, scale: int, seed: int) -> Job:
        return (arm, lr, scale, seed, quick, data)

    def scores(arm: Hashable) -> dict[float, float] | None:
        tried = {j[1]: r[sweep.metric_key] for j, r in done.items() if _is(j, arm, 1, seeds[0])}
        return tried if all(lr in tried for lr in sweep.grid) else None

    def plan(arm: Hashable) -> Plan:
        """One arm's course; it moves on as soon as its own jobs are done (:func:`run_plans`)."""
        tried: dict[float, float] = {}
        rates = list(sweep.grid)
        while rates:  # the sweep, extended past an edge
            result = yield [job(arm, lr, 1, seeds[0]) for lr in rates]
            tried.update({lr: result[job(arm, lr, 1, seeds[0])][sweep.metric_key] for lr in rates})
            extra = _edge_extension(tried, sweep)
            rates = [] if extra is None else [extra]
        lr = choose(tried, sweep.tie_width)
        yield [job(arm, lr, 1, s) for s in seeds[1:]] + [job(arm, lr, 2, s) for s in double_seeds]

    done = run_plans(train, [plan(arm) for arm in arms], workers, cost)
    out = {}
    for arm in arms:
        tried = scores(arm) or {}
        lr = choose(tried, sweep.tie_width)
        out[arm] = Gated(
            scores=tried,
            chosen=lr,
            bracketed=LearningRate(lr, list(tried)).bracketed,
            runs=[done[job(arm, lr, 1, s)] for s in seeds],
            doubled=[done[job(arm, lr, 2, s)] for s in double_seeds],
            seeds=seeds,
            doubling_seeds=double_seeds,
        )
    return out


def _is(job: Job, arm: Hashable, scale: int, seed: int) -> bool:
    return job[0] == arm and job[2] == scale and job[3] == seed


def sweep_rows(gated: dict[Any, Gated], label: Callable[[Any], str]) -> list[dict]:
    """One table row per arm and tried rate: the sweep's score, which rate was chosen."""
    return [
        {"arm": label(arm), "lr": lr, "score (first seed)": score, "chosen": lr == g.chosen}
        for arm, g in gated.items()
        for lr, score in sorted(g.scores.items())
    ]


# -- one arm, run by run -------------------------------------------------------------------------

R = TypeVar("R")


class SweepRuns(Generic[R]):
    """The runs of one arm's sweep, ``{lr: result}``, their scores (lower is better), the chosen
    rate (:func:`choose`, ties within ``tie``) and what it was chosen on."""

    def __init__(
        self, runs: dict[float, R], scores: dict[float, float], chosen_on: str, tie: float = 0.0
    ):
        self.runs, self.scores, self.chosen_on = runs, scores, chosen_on
        self.chosen = choose(scores, tie)

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
    step: float = 3.0,
    max_extra: int = 2,
    tie: float = 0.0,
) -> SweepRuns[R]:
    """One arm's sweep run by run: ``train(lr)`` at every rate of ``grid`` (>= 2 rates), then
    one rate past the edge holding the choice (``step`` times further), at most ``max_extra``
    times; ``score(result)`` is the number to minimise. The runs are kept for reuse (the chosen
    rate's run is the first seed's result)."""
    runs: dict[float, R] = {}

    def trained(rates: list[float]) -> dict[float, float]:
        runs.update({lr: train(lr) for lr in rates})
        return {lr: score(runs[lr]) for lr in rates}

    _, scores = bracketed_lr(
        trained, grid, chosen_on=chosen_on, max_extensions=max_extra, factor=step, tie=tie
    )
    return SweepRuns(runs, scores, chosen_on, tie)


# -- a job function of the experiment's own shape ------------------------------------------------


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
    arm_steps: dict[Any, int] = field(default_factory=dict)  # an arm's steps, when extended
    ladder: dict[Any, dict[int, Any]] = field(default_factory=dict)  # first seed: steps -> result

    def steps_of(self, arm: Hashable) -> int:
        """The steps ``per[arm]`` ran (``steps`` unless the doubling extended them)."""
        return self.arm_steps.get(arm, self.steps)

    def doubling(self, arm: Hashable, value: Callable[[Any], float], tolerance: float,
                 metric: str) -> Doubling:  # fmt: skip
        """The arm's :class:`Doubling` on the first seed, ``value`` read from each result."""
        return Doubling(self.steps_of(arm), [value(self.per[arm][0])], [value(self.double[arm])],
                        tolerance, self.seeds[:1], metric)  # fmt: skip

    def record(self, arm: Hashable, value: Callable[[Any], float]) -> dict[str, Any]:
        """One arm's runs as plain data for ``measure()`` (JSON-ready): ``lr`` (the chosen rate,
        its grid, what chose it), ``sweep`` (rate -> score), ``double`` (the first seed's
        ``value`` at twice the steps) and ``runs`` (one result per seed). With ``steps`` and
        ``seeds`` beside them, :func:`recorded_competence` rebuilds the arm's gate from it."""
        lr = self.lr[arm]
        return {
            "lr": {"chosen": lr.chosen, "grid": lr.grid, "chosen_on": lr.chosen_on},
            "sweep": {str(k): v for k, v in self.sweeps[arm].items()},
            "double": [value(self.double[arm])],
            "runs": self.per[arm],
        }


def recorded_competence(
    m: dict[str, Any],
    arm: str,
    criterion: str,
    threshold: float,
    values: list[float],
    *,
    value: Callable[[Any], float],
    tolerance: float,
    metric: str,
    higher_is_better: bool = False,
) -> Competence:
    """The :class:`Competence` of the arm :meth:`ArmRuns.record` stored in ``m`` (beside
    ``steps`` and ``seeds``): ``values`` (one per seed) against ``threshold``, the recorded rate,
    and the doubling of the first seed's ``value`` (``metric``, moving by at most ``tolerance``)."""
    first = [value(m["runs"][0])]
    return Competence(
        arm,
        criterion,
        threshold,
        values,
        higher_is_better=higher_is_better,
        lr=LearningRate(**m["lr"]),
        doubling=Doubling(m["steps"], first, m["double"], tolerance, m["seeds"][:1], metric),
    )


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
    settled: Callable[[Any, Any], bool] | None = None,
    max_doublings: int = 0,
) -> ArmRuns:
    """The gate's rule for a job function of the experiment's own shape: ``job(arm, lr, steps,
    seed)`` is the picklable job of ``fn`` (a module-level function, run through
    :func:`attnlab.lab.kit.seeds.run_jobs`, ``workers`` at a time); ``job`` and ``score`` (the
    validation number of a result, higher or lower is better) run here, so they may be closures.
    ``grid`` is one grid for every arm, or a grid per arm (``{arm: rates}``). All arms' rates
    run as one batch per round, extensions as :func:`gate_arms` makes them (the choice is the
    best score, no tie width); then the first seed at twice the steps (the longest jobs, so they
    start first) and the other seeds.

    Step extension (``settled`` given, ``max_doublings`` > 0): the first seed runs at the
    chosen rate at S = ``steps`` and 2S; while ``settled(result at S, result at 2S)`` is False
    the arm's budget doubles (S -> 2S, a fresh run at 4S), at most ``max_doublings`` times; the
    other seeds then run at the arm's final S (:meth:`ArmRuns.steps_of`), and ``double`` is the
    first seed at 2S -- a still-unsettled arm at the cap shows as an unconverged doubling."""
    sign = -1.0 if higher_is_better else 1.0
    rules = {
        a: Sweep(tuple(float(r) for r in (grid[a] if isinstance(grid, Mapping) else grid)),
                 tolerance=0.0, metric=chosen_on, factor=step, max_extensions=max_extra, tie=0.0)
        for a in arms
    }  # fmt: skip
    first = seeds[0]
    tried: dict[Any, dict[float, float]] = {a: {} for a in arms}  # rate -> sign * score
    chosen: dict[Any, float] = {}
    budget = dict.fromkeys(arms, steps)

    costs: dict[Hashable, int] = {}  # a job's steps: the longest ready jobs start first

    def make(a: Any, lr: float, n: int, seed: int) -> Hashable:
        costs[made := job(a, lr, n, seed)] = n
        return made

    def plan(a: Any) -> Plan:
        """One arm's course; it moves on as soon as its own jobs are done (:func:`run_plans`)."""
        rates = list(rules[a].grid)
        while rates:  # the sweep, extended past an edge
            done = yield [make(a, r, steps, first) for r in rates]
            tried[a].update({r: sign * float(score(done[make(a, r, steps, first)])) for r in rates})
            more = _edge_extension(tried[a], rules[a])
            rates = [] if more is None else [more]
        chosen[a] = choose(tried[a], 0.0)
        if settled is not None and max_doublings > 0:  # the first seed's ladder
            at = yield [make(a, chosen[a], steps, first), make(a, chosen[a], 2 * steps, first)]
            while budget[a] < steps * 2**max_doublings and not settled(
                at[make(a, chosen[a], budget[a], first)],
                at[make(a, chosen[a], 2 * budget[a], first)],
            ):
                budget[a] *= 2
                at = yield [make(a, chosen[a], n, first) for n in (budget[a], 2 * budget[a])]
        yield [make(a, chosen[a], 2 * budget[a], first)] + [
            make(a, chosen[a], budget[a], s) for s in seeds[1:]
        ]

    results = run_plans(fn, [plan(a) for a in arms], workers, costs.__getitem__)
    return ArmRuns(
        lr={a: LearningRate(chosen[a], sorted(tried[a]), chosen_on=chosen_on) for a in arms},
        sweeps={a: {r: sign * v for r, v in tried[a].items()} for a in arms},
        per={a: [results[job(a, chosen[a], budget[a], s)] for s in seeds] for a in arms},
        double={a: results[job(a, chosen[a], 2 * budget[a], first)] for a in arms},
        steps=steps,
        seeds=list(seeds),
        arm_steps={a: n for a, n in budget.items() if n != steps},
        ladder={
            a: {n: results[job(a, chosen[a], n, first)] for n in _rungs(steps, budget[a])}
            for a in arms
        },  # fmt: skip
    )


def _rungs(steps: int, last: int) -> list[int]:
    """The first seed's budgets of an arm whose ladder ends at ``last``: steps, 2 steps, ...,
    2 last."""
    rungs = [steps]
    while rungs[-1] < 2 * last:
        rungs.append(2 * rungs[-1])
    return rungs


# -- one arm, a round of rates at a time ---------------------------------------------------------


def bracketed_lr(
    score: Callable[[list[float]], dict[float, float]],
    grid: Sequence[float],
    *,
    chosen_on: str,
    higher_is_better: bool = False,
    max_extensions: int = 2,
    factor: float | None = None,
    tie: float = 0.0,
) -> tuple[LearningRate, dict[float, float]]:
    """One arm's sweep a round at a time: ``score(rates)`` trains and scores a round (the
    caller may run its rates in parallel); an edge choice adds one rate beyond that edge at the
    grid's own ratio (1e-3, 3e-3, 1e-2 extends to 3e-2 or 3e-4) or ``factor``, at most
    ``max_extensions`` times; scores within ``tie`` of the best are tied (:func:`choose`). A
    diverged run (non-finite score) counts as the worst. Returns the :class:`LearningRate` and
    every rate's score."""
    rates = sorted(float(g) for g in grid)
    if len(rates) < 2:
        raise ValueError(f"a sweep needs at least 2 rates to bracket a choice, got {rates}")
    sign = -1.0 if higher_is_better else 1.0
    rule = Sweep(tuple(rates), tolerance=tie, metric=chosen_on,
                 factor=factor if factor is not None else rates[1] / rates[0],
                 max_extensions=max_extensions, tie=tie)  # fmt: skip
    scores = {float(r): float(v) for r, v in score(rates).items()}
    while (new := _edge_extension({r: sign * v for r, v in scores.items()}, rule)) is not None:
        scores.update({float(r): float(v) for r, v in score([new]).items()})
    chosen = choose({r: sign * v for r, v in scores.items()}, tie)
    return LearningRate(chosen, sorted(scores), chosen_on=chosen_on), scores
