"""Experiment extrapolation (quick form): every compared arm carries a bracketed learning-rate
sweep and a step doubling; measure() trains and write_up() only renders."""

from __future__ import annotations

import pytest

from attnlab.lab.experiments import extrapolation
from attnlab.lab.kit import copy_task


@pytest.fixture(scope="module")
def measured():
    return extrapolation.measure(True, 0)


def test_extrapolation_quick_report_gates_every_compared_arm(measured, tmp_path, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("write_up must not train")

    monkeypatch.setattr(extrapolation, "fit", no_training)
    report = extrapolation.write_up(measured, tmp_path, quick=True)
    report.write(tmp_path)
    for fig in ("accuracy_vs_length.png", "attention_rotary.png", "attention_learned.png"):
        assert (tmp_path / fig).is_file(), fig
    # Learned rows past the longest training sequence never get a gradient: exactly unchanged.
    assert report.metrics["learned_rows_moved"] == {"learned": 0.0}
    arms = set(extrapolation.ARMS) | {"none"}
    assert set(report.metrics["token_accuracy"]) == arms
    assert {c.arm for c in report.competence} == arms and report.seeds == [0]
    assert set(report.arms) == set(extrapolation.ARMS)
    for c in report.competence:
        assert c.gated == c.in_verdict == (c.arm in extrapolation.ARMS)
        if c.in_verdict:
            grid = sorted(c.lr.grid)
            assert len(grid) >= len(extrapolation.LRS) and c.lr.chosen in grid
            assert c.lr.bracketed or len(grid) == len(extrapolation.LRS) + extrapolation.MAX_EXTRA
            assert c.doubling.seeds == [0] and c.doubling.tolerance == extrapolation.TOLERANCE
    assert report.thresholds and all(t.source for t in report.thresholds)
    scales = report.metrics["signal_rms"]  # the rescaled sinusoids sit at the token scale
    assert abs(scales["sinusoidal"]["positions"] / scales["sinusoidal"]["tokens"] - 1) < 0.1
    big = copy_task.build_arm(copy_task.ROTARY_LARGE, 12, 16, quick=True)
    assert big.embed.pos_enc.base == copy_task.LARGE_BASE
    assert scales["learned"]["positions"] < 0.05
