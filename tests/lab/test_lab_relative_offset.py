"""Experiment ``relative_offset`` (quick form): PE(n + k) = M_k PE(n) exactly, and every arm of
the learned part is gated (swept rate, step doubling)."""

from __future__ import annotations

import pytest
import torch

from attnlab.lab import run_experiment
from attnlab.lab.experiments import relative_offset as ro
from attnlab.lab.kit.verdict import LearningRate
from attnlab.nn.positional import sinusoidal_table


@pytest.mark.parametrize("k", [1, 7, 250, -4])
def test_rotation_maps_every_position_k_ahead(k):
    n = torch.arange(0, 3000, 7)
    pe = sinusoidal_table(n, 32, dtype=torch.float64)  # (N, 32)
    ahead = sinusoidal_table(n + k, 32, dtype=torch.float64)
    assert float((pe @ ro.rotation(k, 32).T - ahead).abs().max()) < 1e-10


def test_rotation_refuses_an_odd_width():
    with pytest.raises(ValueError, match="must be even"):
        ro.rotation(1, 7)


def test_quick_relative_offset_run(tmp_path):
    report, path = run_experiment("relative_offset", quick=True, out_dir=tmp_path / "ro")
    assert path.is_file() and (path.parent / "accuracy_by_position.png").is_file()
    assert report.metrics["exact_error"] < 1e-10  # the identity is exact in float64
    assert report.arms == ro.arm_names(True) and {a.split()[0] for a in report.arms} == set(
        ro.KINDS
    )
    assert [c.arm for c in report.competence] == report.arms
    for c in report.competence:  # every compared arm, the losing one too, is gated
        assert c.gated and len(c.lr.grid) >= 3 and c.doubling.seeds == [0]
        assert c.doubling.steps == ro.STEPS[True]
    assert len(report.thresholds) == 4 and all(t.source for t in report.thresholds)
    rows = report.table("accuracy by window start (mean (min-max) over seeds)").rows
    assert [r["arm"] for r in rows] == report.arms


def _measured(sin_unseen: float) -> dict:
    arms = ro.arm_names(False)
    lr = LearningRate(3e-3, [1e-3, 3e-3, 1e-2])

    def run(kind: str) -> dict:
        far = sin_unseen if kind == "sinusoidal" else 0.15
        return {"val_loss": 0.01, "val_acc": 1.0, "by_start": [1.0] + [far] * 4, "seconds": 1.0}

    per = {a: [run(a.split()[0])] * 3 for a in arms}
    return {"exact": [ro.exact_check(64, 3)], "arms": arms, "seeds": [0, 1, 2], "steps": 1500,
            "lr": dict.fromkeys(arms, lr), "sweeps": {a: {1e-3: 1.0, 3e-3: 0.01, 1e-2: 0.1}
                                                     for a in arms},
            "per": per, "double": {a: per[a][0] for a in arms}}  # fmt: skip


@pytest.mark.parametrize(("sin_unseen", "verdict"), [(0.97, "held"), (0.06, "mixed")])
def test_write_up_judges_measured_numbers_without_training(tmp_path, monkeypatch, sin_unseen,
                                                           verdict):  # fmt: skip
    monkeypatch.setattr(ro, "train_job", None)  # write_up must not train
    report = ro.write_up(_measured(sin_unseen), tmp_path, quick=False)
    assert report.verdict == verdict, report.verdict_reason
    assert all(c.passed for c in report.competence)
    assert (tmp_path / "accuracy_by_position.png").is_file()
