"""Experiment long_range (quick form): every arm, the plain LSTMs whose failure is the claim
included, carries a bracketed learning-rate sweep and a step doubling; measure() trains, keeping
each run beside the report so that a later piece reloads it, and write_up() only renders."""

from __future__ import annotations

import json

import pytest

from attnlab.lab.experiments import long_range
from attnlab.lab.kit.resume import JOBS_DIR
from attnlab.lab.kit.verdict import VERDICTS


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("long_range")


@pytest.fixture(scope="module")
def measured(out_dir):
    return long_range.measure(True, 0, None, out_dir)


def test_long_range_quick_report_gates_every_arm(measured, tmp_path):
    report = long_range.write_up(measured, tmp_path, quick=True)
    report.write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["quick"] is True and data["verdict"] in VERDICTS
    for fig in (
        "accuracy_vs_length.png",
        "exact_vs_length.png",
        "accuracy_per_position.png",
        "alignment_bahdanau.png",
        "cross_attention_transformer.png",
    ):
        assert (tmp_path / fig).is_file(), fig
    lengths = report.metrics["lengths"]
    expected = {long_range.arm_name(n, t) for n in long_range.MODELS for t in lengths}
    assert set(report.arms) == expected == {c.arm for c in report.competence}
    for c in report.competence:  # the plain LSTMs too: same sweep, same doubling
        assert c.lr is not None and c.doubling is not None and c.gated
        assert len(c.lr.grid) >= 3 and c.lr.chosen in c.lr.grid
        assert c.doubling.seeds == [0] and c.doubling.tolerance == long_range.TOLERANCE
        assert len(c.values) == len(report.seeds)
    plain = [c for c in report.competence if c.arm.startswith("plain LSTM")]
    assert len(plain) == 2 * len(lengths) and all(c.threshold == 0.0 for c in plain)
    assert report.thresholds and all(t.source for t in report.thresholds)
    token, exact = report.metrics["token_accuracy"], report.metrics["exact_match"]
    for name in long_range.MODELS:  # a whole target right implies each of its tokens right
        assert all(0.0 <= e <= t <= 1.0 for e, t in zip(exact[name], token[name]))


def test_a_sweep_extends_past_an_edge_choice(measured):
    for by_length in measured["runs"].values():
        for r in by_length.values():
            grid = sorted(r["sweep"])
            edge = r["lr"] in (grid[0], grid[-1])
            # an edge choice is left only when the extensions ran out
            assert not edge or len(grid) == 3 + long_range.MAX_EXTRA


def test_a_later_piece_reloads_every_kept_run_and_trains_none(measured, out_dir, monkeypatch):
    kept = sorted(p.name for p in (out_dir / JOBS_DIR).iterdir())
    arm_runs = [r for by_length in measured["runs"].values() for r in by_length.values()]
    sweeps = sum(len(r["sweep"]) for r in arm_runs)
    arms = len(long_range.MODELS) * len(measured["lengths"])
    seeds = len(measured["seeds"])
    assert len(kept) == sweeps + arms * seeds  # the sweep's runs, the other seeds, the doubling
    assert all(name.endswith("-quick.json") for name in kept)

    def no_training(*args, **kwargs):
        raise AssertionError("a kept run must be reloaded, not trained again")

    monkeypatch.setattr(long_range, "one_run", no_training)
    assert long_range.measure(True, 0, None, out_dir) == measured


def test_write_up_renders_without_training(measured, tmp_path, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("write_up must not train")

    monkeypatch.setattr(long_range, "one_run", no_training)
    monkeypatch.setattr(long_range, "fit", no_training)
    first = long_range.write_up(measured, tmp_path / "a", quick=True)
    again = long_range.write_up(measured, tmp_path / "b", quick=True)
    assert first.verdict == again.verdict and first.metrics == again.metrics


def test_bracketed_sweep_extends_the_grid_past_an_edge_choice():
    import math

    from attnlab.lab.kit.gating import bracketed_sweep

    def loss(lr):  # best at lr = 0.1: beyond the grid's top
        return (math.log10(lr) + 1) ** 2

    sweep = bracketed_sweep(lambda lr: lr, [1e-3, 3e-3, 1e-2], loss, chosen_on="toy")
    assert sorted(sweep.runs) == pytest.approx([1e-3, 3e-3, 1e-2, 3e-2, 9e-2])
    assert sweep.chosen == pytest.approx(9e-2) and not sweep.learning_rate().bracketed
    inside = bracketed_sweep(lambda lr: lr, [1e-3, 1e-1, 1.0], loss, chosen_on="toy")
    assert inside.chosen == pytest.approx(0.1) and inside.learning_rate().bracketed
    assert len(inside.runs) == 3  # bracketed at once: no extension
    below = bracketed_sweep(lambda lr: lr, [1.0, 3.0], loss, chosen_on="toy", max_extra=3)
    assert below.learning_rate().bracketed and below.chosen == pytest.approx(1 / 9)
    with pytest.raises(ValueError, match="at least 2 rates"):
        bracketed_sweep(lambda lr: lr, [1e-3], loss, chosen_on="toy")
