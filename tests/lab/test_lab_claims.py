"""The notes' untested claims (issue 33, item 6), quick forms: ``qkv`` (001), ``ffn_width``
(000, 003) and ``layernorm`` (000, 003, 004) on the shared char-LM harness
(:mod:`attnlab.lab.kit.lm_arms`). Each: every arm gated (a swept rate and a step doubling),
thresholds with their sources, measure() and write_up() separate, and a number that must hold."""

from __future__ import annotations

import copy
import math

import pytest

from attnlab.lab.experiments import ffn_width, layernorm, qkv
from attnlab.lab.kit import lm_arms as la
from attnlab.lab.kit.registry import discover
from lab_write_up import no_training

D = la.SIZE[True].d_model  # the quick recipe's d_model


def test_harness_counts_steps_and_self_weight():
    assert la.steps_to([3.0] * 25 + [1.0] * 25, 2.0, window=4) == 27.0  # steps 24-27: 3, 3, 1, 1
    assert math.isinf(la.steps_to([3.0] * 50, 2.0))
    assert la.uniform_self_weight(2) == 0.5  # query 1 sees 2 keys
    assert layernorm.spike([2.0] * 30 + [1.0] * 30 + [1.5] * 30, 0) == pytest.approx(0.5)
    assert {"qkv", "ffn_width", "layernorm"} <= set(discover())


def _check_gated(report, measured, extra=(), extra_steps=0):
    """Every compared arm has a criterion with a swept rate and a doubling; thresholds quoted."""
    assert report.arms == [*measured["arms"], *extra] == [c.arm for c in report.competence]
    for c in report.competence:
        assert c.lr is not None and len(c.lr.grid) >= 2 and c.lr.chosen in c.lr.grid
        steps = extra_steps if c.arm in extra else la.size_of(measured).steps
        assert c.doubling is not None and c.doubling.steps == steps
        assert c.doubling.seeds == [0]
    assert report.thresholds and all(t.source and t.value for t in report.thresholds)
    assert report.verdict in ("held", "did not hold", "mixed", "no effect resolved", "inconclusive")
    checks = report.table(la.CHECKS).rows
    assert checks and all(r["outcome"] in (la.HELD, la.NOT_HELD, la.UNRESOLVED) for r in checks)


def _quick(module, tmp_path):
    """(measured, report) of ``module``'s quick form, seed 0, written to ``tmp_path``."""
    measured = module.measure(True, 0, None)
    return measured, module.write_up(measured, tmp_path, True)


def _rerenders(module, measured, report, tmp_path, monkeypatch):
    """Every figure is written, and write_up renders the same report from the measured numbers
    alone, training nothing."""
    assert all((tmp_path / f.file).is_file() for f in report.figures)
    monkeypatch.setattr(la, "train_job", no_training)
    again = module.write_up(copy.deepcopy(measured), tmp_path / "again", True)
    assert again.verdict_reason == report.verdict_reason and again.tables == report.tables


def test_qkv_quick_report(tmp_path, monkeypatch):
    measured, report = _quick(qkv, tmp_path)
    copy_arms = [f"copy task: {f}" for f in qkv.FORMS]
    _check_gated(report, measured, copy_arms, measured["copy_steps"])
    params = report.metrics["params"]
    # the arms differ by W_q, W_k, W_v (and their biases) alone, in each of the 2 layers
    assert params["learned Q, K, V, 1 head"] - params["q = k = v = x, 1 head"] == 2 * (
        3 * D * D + 3 * D
    )
    free = report.per_seed["self_weight"]["q = k = v = x, 1 head"]
    assert all(
        w > la.uniform_self_weight(la.SIZE[True].context) for w in free
    )  # x_i . x_i dominates its row
    files = {"loss.png", "self_weight.png", "copy.png", "training.png"}
    assert {f.file for f in report.figures} == files
    copy = report.per_seed["copy_accuracy"]
    assert all(0.0 <= a <= 1.0 for accs in copy.values() for a in accs)
    _rerenders(qkv, measured, report, tmp_path, monkeypatch)


def test_ffn_width_quick_report(tmp_path, monkeypatch):
    measured, report = _quick(ffn_width, tmp_path)
    _check_gated(report, measured)
    assert report.arms == ["no FFN", "d_ff = 1 d_model", "d_ff = 2 d_model", "d_ff = 4 d_model"]
    params = list(report.metrics["params"].values())
    assert params == sorted(params) and len(set(params)) == 4
    # no FFN drops W1, b1, W2, b2 and the sublayer's norm (g, b) of each of the 2 layers
    assert params[1] - params[0] == 2 * (2 * D * D + D + D + 2 * D)
    _rerenders(ffn_width, measured, report, tmp_path, monkeypatch)


def test_layernorm_quick_report(tmp_path, monkeypatch):
    measured, report = _quick(layernorm, tmp_path)
    _check_gated(report, measured)
    assert len(report.metrics["checks"]) == 2 * len(measured["depths"])  # loss and speed each
    rows = {r["arm"]: r["parameters"] for r in report.tables[0].rows}
    for d in measured["depths"]:  # two norms per block and the final one, a gain and a bias each
        n = f"{d} layer{'s' if d > 1 else ''}"
        assert rows[f"LayerNorm, {n}"] - rows[f"no norm, {n}"] == (2 * d + 1) * 2 * D
    _rerenders(layernorm, measured, report, tmp_path, monkeypatch)
