"""Experiment ``norm`` (quick form): gradients at initialisation per layer and placement; the
four training arms (pre/post-norm x warm-up) each gated by a learning-rate sweep and a step
doubling; the verdict judged by Xiong et al.'s statements (top layers, growth with depth)."""

from __future__ import annotations

import math

from attnlab.lab.experiments import norm
from lab_write_up import write_up_without_training


def test_quick_norm_run(tmp_path, monkeypatch):
    """One quick run, every check."""
    measured = norm.measure(True, 0, None)
    report = norm.write_up(measured, tmp_path / "norm", True)
    _check_gradients_at_initialisation(report, measured)
    _check_every_training_arm_is_gated(report)
    _check_write_up_renders_without_training(measured, tmp_path, monkeypatch)


def _check_gradients_at_initialisation(report, measured):
    # the library init: post-norm's gradients are far smaller than pre-norm's at every layer
    w1 = measured["gradients"]["w1"]
    assert max(w1["library, post"][0]) < 0.1 * min(w1["library, pre"][0])
    rows = report.table("(a) gradients at initialisation (mean (min-max) over seeds)").rows
    assert {(r["init"], r["norm"]) for r in rows} == {
        (i, p) for i in norm.INITS for p in ("pre", "post")
    }
    assert all(len(s) == norm.depth(True) for v in w1.values() for s in v)
    assert set(report.metrics["w1_top"]) == {"pre", "post"}


def _check_every_training_arm_is_gated(report):
    arms = {f"{p}-norm, warm-up {w}" for p in ("pre", "post") for w in norm.warmups(True)}
    assert set(report.arms) == arms == {c.arm for c in report.competence}
    for c in report.competence:  # post-norm without warm-up, the claim's loser, too
        assert c.lr is not None and len(c.lr.grid) >= 2 and c.doubling is not None
        assert c.doubling.steps == norm.train_steps(True) and c.doubling.seeds == [0]
    rows = report.table("(b) training with and without warm-up, each arm at its chosen rate").rows
    assert {r["arm"] for r in rows} == arms and all(r["diverged (seeds)"] == 0 for r in rows)
    assert len(report.thresholds) == 4 and all("Xiong" in t.source for t in report.thresholds[:3])
    assert all(math.isfinite(v) for c in report.competence for v in c.values)


def _check_write_up_renders_without_training(measured, tmp_path, monkeypatch):
    again = write_up_without_training(
        monkeypatch, norm, measured, tmp_path / "again", "train_job", "gate_arms"
    )
    assert (tmp_path / "again" / "training.png").is_file()
    assert "post-norm's |grad W1|" in again.verdict_reason
