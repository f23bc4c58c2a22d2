"""A check the lab experiments' tests share: the write-up from saved measurements trains nothing."""

from __future__ import annotations


def no_training(*args, **kwargs):
    """Stands in for a training function that a write-up must never call."""
    raise AssertionError("write_up must not train")


def write_up_without_training(monkeypatch, experiment, measured: dict, out, *trainers: str):
    """``experiment.write_up(measured, out, True)`` with each of ``trainers`` (names of the
    experiment module's training functions, e.g. "train_job") replaced by a failure: a report
    re-rendered from saved measurements must not train. Returns the report."""
    for name in trainers:
        monkeypatch.setattr(experiment, name, no_training)
    return experiment.write_up(measured, out, True)
