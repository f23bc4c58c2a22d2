"""The lab: experiments that test the notes' claims (``attnlab experiment NAME``).

Each experiment is one module here registering ``run(quick, out_dir, seed) -> Report`` with
:func:`~attnlab.lab.registry.experiment`; :func:`run_experiment` runs one and writes its report.
"""

from attnlab.lab.registry import EXPERIMENTS, Experiment, discover, experiment, get_experiment
from attnlab.lab.report import FigureRef, Report, Table
from attnlab.lab.runner import run_experiment

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "FigureRef",
    "Report",
    "Table",
    "discover",
    "experiment",
    "get_experiment",
    "run_experiment",
]
