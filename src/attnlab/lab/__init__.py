"""The lab: experiments that test the notes' claims (``attnlab experiment NAME``).

Each experiment is one module here registering ``run(quick, out_dir, seed) -> Report`` with
:func:`~attnlab.lab.registry.experiment`; :func:`run_experiment` runs one and writes its report.
An experiment states the claim, builds its arms and measures them; the scaffolding they share:

    tasks, corpus   generated classification tasks; character text and windows for small LMs
    fit             the training loop, losses, evaluation (``fit``, ``fit_classifier``, ...)
    seeds           the seeds of a run; arms x seeds as single-threaded jobs over processes
    report          Report, the competence gate, ``outcome`` (checks -> gated verdict fields)
    charts          line, band-over-seeds, bar and heatmap figures
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
