"""Experiment ``norm`` (quick form): per-layer gradients at initialisation are far more uniform
with pre-norm than with post-norm; the training sweep is reported."""

from __future__ import annotations

from attnlab.lab import run_experiment


def test_quick_norm_run(tmp_path):
    """One quick run (xdist would repeat a module fixture per worker), every check."""
    report, _ = run_experiment("norm", quick=True, out_dir=tmp_path / "norm")
    _check_pre_norm_gradients_are_more_uniform_across_layers(report)
    _check_training_sweep_covers_both_placements_with_and_without_warmup(report)


def _check_pre_norm_gradients_are_more_uniform_across_layers(report):
    spread = report.metrics["spread"]
    assert spread["pre"] < 2.0 < 5.0 < spread["post"]  # deterministic for the seeded init
    rows = report.table("(a) gradient norms per layer at initialisation").rows
    assert all(r["pre-norm |grad block|"] > 0 and r["post-norm |grad block|"] > 0 for r in rows)


def _check_training_sweep_covers_both_placements_with_and_without_warmup(report):
    rows = report.table("(b) training with and without warm-up").rows
    assert {(r["norm"], r["warm-up steps"] > 0) for r in rows} == {
        ("pre", False), ("pre", True), ("post", False), ("post", True)
    }  # fmt: skip
    assert sum(r["trained (final <= best + 0.1)"] for r in rows) >= 1
