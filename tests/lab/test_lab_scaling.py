"""Experiment ``scaling`` (quick form): Var(q.k) grows like d_k, the scaled logits stay near 1,
and unscaled attention rows saturate as d_k grows."""

from __future__ import annotations

import pytest
import torch

from attnlab.lab import run_experiment
from attnlab.lab.experiments import scaling
from attnlab.lab.experiments.scaling import DIMS, logit_variance, saturation, slope
from lab_write_up import write_up_without_training


def test_helpers_on_known_cases():
    gen = torch.Generator().manual_seed(0)
    assert slope([1, 2, 4], [3.0, 6.0, 12.0]) == pytest.approx(1.0)
    raw, scaled = logit_variance(1, 20000, gen)
    assert raw == pytest.approx(scaled) and raw == pytest.approx(1.0, abs=0.1)
    uniform = saturation(1, 50, 8, True, torch.Generator().manual_seed(0))
    assert uniform["max weight"] < 1.0 and uniform["entropy"] <= torch.log(torch.tensor(8.0))


def test_quick_scaling_run(tmp_path, monkeypatch):
    """One quick run, every check."""
    report, _ = run_experiment("scaling", quick=True, out_dir=tmp_path / "scaling")
    _check_variance_grows_like_d_k_without_scaling_and_stays_near_one_with_it(report)
    _check_unscaled_softmax_saturates_and_its_gradient_vanishes(report)
    _check_report_tables(report)
    _check_every_arm_is_gated(report)
    _check_write_up_renders_without_training(tmp_path, monkeypatch)


def _check_every_arm_is_gated(report):
    arms = {f"{s}, init {i}" for s in ("scaled", "unscaled") for i in scaling.INITS}
    assert set(report.arms) == arms == {c.arm for c in report.competence}
    for c in report.competence:  # the unscaled arms (the claim's losers) swept and doubled too
        assert c.lr is not None and len(c.lr.grid) >= 2 and c.doubling is not None
        assert c.doubling.seeds == [0] and c.doubling.steps == 15
    assert len(report.thresholds) == 3 and all(t.source for t in report.thresholds)


def _check_write_up_renders_without_training(tmp_path, monkeypatch):
    measured = {**scaling.measure_logits(True, 0), "seeds": [0], "steps": 15, "gated": {}}
    fake = {
        "scores": {1e-3: 0.0, 2e-3: 0.0, 4e-3: 0.1},
        "chosen": 2e-3,
        "bracketed": True,
        "runs": [dict(_RUN)],
        "doubled": [dict(_RUN)],
        "seeds": [0],
        "doubling_seeds": [0],
    }
    measured["gated"] = {
        f"{s}, init {i}": fake for s in ("scaled", "unscaled") for i in scaling.INITS
    }
    report = write_up_without_training(
        monkeypatch, scaling, measured, tmp_path / "again", "gate_arms", "train_job"
    )
    assert report.verdict == "mixed"  # the logits' checks held, the training difference did not
    assert (tmp_path / "again" / "variance.png").is_file()


_RUN = {
    "losses": [2.0, 1.0],
    "entropy0": 1.9,
    "loss@10%": 2.0,
    "loss@50%": 1.5,
    "final loss": 1.0,
    "accuracy": 1.0,
    "error": 0.0,
    "diverged": False,
}


def _check_variance_grows_like_d_k_without_scaling_and_stays_near_one_with_it(report):
    m = report.metrics
    assert abs(m["slope_raw"] - 1.0) < 0.05 and abs(m["slope_scaled"]) < 0.05
    for d, raw, scaled in zip(DIMS, m["var_raw"], m["var_scaled"]):
        assert 0.85 * d < raw < 1.15 * d and 0.85 < scaled < 1.15


def _check_unscaled_softmax_saturates_and_its_gradient_vanishes(report):
    raw, scaled = report.metrics["entropy_raw"], report.metrics["entropy_scaled"]
    assert all(a > b for a, b in zip(raw, raw[1:]))  # entropy falls with every doubling of d_k
    assert raw[-1] < 0.1 * raw[0] and min(scaled) > 0.9 * max(scaled)
    jac = report.metrics["jacobian_raw"]
    assert jac[-1] < 0.25 * jac[0] and min(report.metrics["jacobian_scaled"]) > 0.2


def _check_report_tables(report):
    assert [r["d_k"] for r in report.table("logit variance").rows] == list(DIMS)
    rows = report.table("training with and without scaling (d_head = 256)").rows
    assert {(r["W_q, W_k init"], r["scale_logits"]) for r in rows} == {
        ("N(0, 0.02)", True),
        ("N(0, 0.02)", False),
        ("N(0, 1/D)", True),
        ("N(0, 1/D)", False),
    }
