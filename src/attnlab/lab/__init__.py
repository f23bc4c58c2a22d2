"""The lab: experiments that test the notes' claims (``attnlab experiment NAME``).

    experiments/   one module per experiment, registering ``run(quick, out_dir, seed) -> Report``
                   with :func:`~attnlab.lab.kit.registry.experiment`; no experiment imports another
    kit/           what they share:
        tasks, corpus        generated classification tasks; character text and windows
        copy_task            the copy task and the position-scheme models built on it
        char_models          the small character LM, its shared run directory and baselines
        fit                  the training loop, losses, evaluation (``fit``, ``fit_classifier``)
        seeds                the seeds of a run; arms x seeds as single-threaded jobs
        report               Report, the competence gate, ``outcome`` (checks -> gated verdict)
        charts               line, band-over-seeds, bar and heatmap figures
        registry, runner     ``attnlab experiment NAME``: look up, run, write the report
        index                docs/experiments/README.md, the committed results' table

:func:`run_experiment` runs one experiment and writes its report.
"""

from attnlab.lab.kit.registry import EXPERIMENTS, Experiment, discover, experiment, get_experiment
from attnlab.lab.kit.report import FigureRef, Report, Table
from attnlab.lab.kit.runner import run_experiment

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
