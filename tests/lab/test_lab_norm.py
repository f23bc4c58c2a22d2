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
    spread = report.metrics["spread_library"]  # the library init: post-norm's layer-1 spike
    assert spread["pre"] < 2.0 < 5.0 < spread["post"]  # deterministic for the seeded init
    rows = report.table(
        "(a) gradient spread over layers at initialisation (mean (min-max) over seeds)"
    ).rows
    assert {(r["init"], r["norm"]) for r in rows} == {
        (i, p)
        for i in ("xavier", "library", "library, N(0, 1) embeddings")
        for p in ("pre", "post")
    }
    assert all(r["layer 1 |grad block|"] > 0 for r in rows)
    assert {c.arm.split()[0] for c in report.competence} == {"pre-norm", "post-norm"}


def _check_training_sweep_covers_both_placements_with_and_without_warmup(report):
    rows = report.table("(b) training with and without warm-up").rows
    assert {(r["norm"], r["warm-up"] > 0) for r in rows} == {
        ("pre", False),
        ("pre", True),
        ("post", False),
        ("post", True),
    }
    assert all(r["diverged (seeds)"] == 0 for r in rows)
