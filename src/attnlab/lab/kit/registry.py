"""The experiment registry: ``attnlab experiment NAME`` looks experiments up here.

An experiment is one module in ``attnlab/lab/experiments/`` that registers its run function with the
:func:`experiment` decorator::

    @experiment("order", notes="000; 004 eq. 14")
    def run(quick: bool, out_dir: Path, seed: int, data: Path | None = None) -> Report:
        "Without positions, self-attention cannot tell ... (the claim, as the docstring)"

``run`` trains what it needs (``data``: the folder of real datasets, or None for generated data;
see :mod:`attnlab.lab.kit.datasets`), saves its PNGs into ``out_dir`` and returns a :class:`Report`;
the runner times it and writes the report. Its docstring is the claim, in one paragraph;
``attnlab experiment --list`` and the index show it. Adding an experiment needs no edit
anywhere else: :func:`discover` imports every public module of the package, and importing
registers.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnlab.lab.kit.report import Report

RunFunction = Callable[[bool, Path, int, Path | None], Report]


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: its name, run function, the claim it tests and where."""

    name: str
    run: RunFunction
    claim: str  # one line
    notes: str  # the notes it tests, e.g. "000, 001, 004 eq. 14"


EXPERIMENTS: dict[str, Experiment] = {}


def experiment(name: str, *, notes: str) -> Callable[[RunFunction], RunFunction]:
    """Decorator registering ``run(quick, out_dir, seed, data) -> Report`` under ``name``; the claim
    it tests is ``run``'s docstring."""
    if not name or not name.replace("_", "").replace("-", "").isalnum() or name != name.lower():
        raise ValueError(f"experiment name {name!r} must be lower-case letters, digits, - or _")

    def register(run: RunFunction) -> RunFunction:
        claim = " ".join(inspect.cleandoc(run.__doc__ or "").split())
        if not claim:
            raise ValueError(
                f"experiment {name!r}: give its run function a docstring stating the claim of "
                "the notes it tests"
            )
        try:
            inspect.signature(run).bind(False, Path("."), 0, None)
        except TypeError:
            raise ValueError(
                f"experiment {name!r}: its run function must take run(quick, out_dir, seed, "
                "data=None) (data: the folder of real datasets, or None)"
            ) from None
        previous = EXPERIMENTS.get(name)
        if previous is not None and previous.run.__module__ != run.__module__:
            raise ValueError(
                f"experiment {name!r} is registered twice ({previous.run.__module__} and "
                f"{run.__module__}); rename one"
            )
        EXPERIMENTS[name] = Experiment(name, run, claim, notes)
        return run

    return register


def discover() -> dict[str, Experiment]:
    """Import every module of ``attnlab.lab.experiments`` (importing registers); returns the
    registry."""
    package = importlib.import_module("attnlab.lab.experiments")
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"attnlab.lab.experiments.{info.name}")
    return dict(sorted(EXPERIMENTS.items()))


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name``; an unknown name is an error listing the valid ones."""
    experiments = discover()
    if name in experiments:
        return experiments[name]
    close = difflib.get_close_matches(name, list(experiments), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"unknown experiment {name!r}.{hint} Available: {', '.join(experiments) or '(none)'}"
    )
