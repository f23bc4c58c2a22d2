"""Experiment ``residual`` (quick form): both arms at every depth gated alike (a learning-rate
sweep and a step doubling), measure() and write_up() separate, the position probe."""

from __future__ import annotations

import torch

from attnlab.lab.experiments import residual
from attnlab.lab.experiments.residual import layer_outputs, make_model, position_probe
from lab_write_up import write_up_without_training


def test_residual_switch_and_position_probe():
    torch.manual_seed(0)
    ids = torch.randint(0, 9, (6, 8))
    with_res, without = (
        make_model("with residuals", 9, 8, 2),
        make_model("without residuals", 9, 8, 2),
    )
    without.load_state_dict(with_res.state_dict())
    a, b = layer_outputs(with_res, ids), layer_outputs(without, ids)
    assert len(a) == 3 and torch.equal(a[0], b[0]) and not torch.allclose(a[1], b[1])
    # The probe reads a position that is written in the vectors, and not one that is absent.
    coded = torch.stack([torch.nn.functional.one_hot(torch.arange(8), 8).float()] * 10)
    assert position_probe(coded + 0.01 * torch.randn(10, 8, 8)) == 1.0
    assert position_probe(torch.randn(10, 8, 4)) < 0.5


def test_residual_quick_report(tmp_path, monkeypatch):
    measured = residual.measure(True, 0, None)
    report = residual.write_up(measured, tmp_path, True)
    arms = {f"{a}, {d} layers" for a in residual.ARMS for d in (2, 4)}
    assert set(report.arms) == arms == {c.arm for c in report.competence}
    for c in report.competence:  # every arm, the no-residual ones too, swept and doubled
        assert c.lr is not None and c.doubling is not None and len(c.lr.grid) >= 2
        assert c.doubling.steps == measured["steps"] and c.doubling.seeds == [0]
    assert report.thresholds and all(t.source for t in report.thresholds)
    probe = report.metrics["probe"]["with residuals"]
    assert len(probe) == 5 and probe[0] > 0.9  # learned positions are readable from the embedding
    assert (tmp_path / "depth.png").is_file() and (tmp_path / "position_probe.png").is_file()
    # write_up re-renders the measured numbers without training anything
    again = write_up_without_training(
        monkeypatch, residual, measured, tmp_path / "again", "train_job"
    )
    assert again.verdict_reason == report.verdict_reason
