"""Experiment ``nonlinearity`` (quick form): stacked attention with given weights is one map
A* X V*^T; a fixed-weight attention stack without FFN is affine in its embeddings; every one of
the 8 compared arms is gated (swept rate, step doubling); write_up re-renders without training."""

from __future__ import annotations

import numpy as np
import torch

from attnlab.lab import run_experiment
from attnlab.lab.experiments import nonlinearity
from attnlab.lab.experiments.nonlinearity import AttentionStack, affine_gap, collapse_gaps, xor_task


def test_collapse_holds_for_any_seed_and_depth():
    for seed in (1, 2):
        gap, rows = collapse_gaps(3, relu=False, seed=seed)
        assert gap < 1e-12 and rows < 1e-12


def test_xor_task_labels():
    data = xor_task(200, 5, np.random.default_rng(0))
    first, second = data.ids[:, 1] == 1, data.ids[:, 2] == 1
    assert torch.equal(data.labels.bool(), first ^ second) and (data.ids[:, 0] == 0).all()
    model = AttentionStack(3, 2, attention="fixed", ffn=False)
    assert affine_gap(model, data.ids[:16]) < 1e-12


def test_quick_nonlinearity_run(tmp_path, monkeypatch):
    """One quick run, every check."""
    measured = []
    measure = nonlinearity.measure
    monkeypatch.setattr(
        nonlinearity, "measure", lambda *a: measured.append(measure(*a)) or measured[-1]
    )
    path = tmp_path / "nonlinearity"
    report, _ = run_experiment("nonlinearity", quick=True, out_dir=path)
    _check_stacked_attention_collapses_to_one_map_and_relu_breaks_it(report)
    _check_fixed_weights_without_ffn_are_affine_and_the_others_are_not(report)
    _check_every_arm_is_gated_and_thresholds_are_quoted(report)
    _check_the_criterion_and_the_step_extension(measured[0], report)
    _check_write_up_re_renders_without_training(measured[0], tmp_path, report, monkeypatch)


def _check_stacked_attention_collapses_to_one_map_and_relu_breaks_it(report):
    two, four, relu = report.metrics["collapse"]
    assert two < 1e-12 and four < 1e-12 and relu > 1e-2


def _check_fixed_weights_without_ffn_are_affine_and_the_others_are_not(report):
    for row in report.metrics["rows"]:
        if row["model"] == "fixed weights, no FFN":
            assert row["affine gap"] < 1e-12
        else:
            assert row["affine gap"] > 1e-6, row["model"]


def _check_every_arm_is_gated_and_thresholds_are_quoted(report):
    assert len(report.arms) == 8 and len(set(report.arms)) == 8
    by_arm = {c.arm: c for c in report.competence}
    assert set(by_arm) == set(report.arms)
    for arm, c in by_arm.items():
        assert c.gated and len(c.lr.grid) >= 3 and c.doubling.tolerance == nonlinearity.TOLERANCE
        if "no FFN" in arm:  # its affine class's optimum on its training set, never the outcome
            assert c.threshold == nonlinearity.PRIOR_TOLERANCE and not c.higher_is_better
            assert "entropy of the training class prior" in c.criterion
        else:
            assert c.threshold == nonlinearity.LEARNS and c.higher_is_better
    assert len(report.thresholds) >= 3 and all(t.source for t in report.thresholds)
    assert report.verdict in ("held", "did not hold", "mixed", "no effect resolved", "inconclusive")
    if report.verdict == "mixed":
        assert "did not hold:" in report.verdict_reason


def _check_the_criterion_and_the_step_extension(measured, report):
    """No-FFN values are training cross-entropy minus H(training prior), per seed; an arm whose
    doubling moved more than the tolerance ran again at twice the steps, up to the cap."""
    runs, base = measured["runs"], nonlinearity.STEPS[True]
    cap = base * 2 ** nonlinearity.MAX_DOUBLINGS[True]
    by_arm = {c.arm: c for c in report.competence}
    for arm in nonlinearity.ARMS:
        c, steps = by_arm[nonlinearity.arm_name(arm)], runs.steps_of(arm)
        if not arm[2]:
            excess = [r["train loss"] - r["prior entropy"] for r in runs.per[arm]]
            assert c.values == excess
        ladder = runs.ladder[arm]
        assert base <= steps <= cap and sorted(ladder) == [base * 2**k for k in range(len(ladder))]
        assert c.doubling.steps == steps and max(ladder) == 2 * steps
        for s in sorted(ladder)[:-2]:  # every rung below the last doubling was unsettled
            assert abs(ladder[2 * s]["val loss"] - ladder[s]["val loss"]) > nonlinearity.TOLERANCE
        if steps < cap:  # stopped early only because the doubling settled
            assert c.doubling.converged
    (ladder_table,) = [t for t in report.tables if t.caption.startswith("step doubling")]
    assert len(ladder_table.rows) == sum(len(runs.ladder[a]) for a in nonlinearity.ARMS)


def test_an_affine_head_at_the_prior_reaches_the_prior_entropy():
    """The criterion's premise: the head's bias alone (weights zero) gives cross-entropy
    H(prior) on the training set, so an affine stack at its optimum is at or below it."""
    train = nonlinearity.mod3_task(300, 12, np.random.default_rng(0))
    model = AttentionStack(3, 3, attention="fixed", ffn=False)
    p = torch.bincount(train.labels, minlength=3).float() / len(train.labels)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(p.log())
    h = nonlinearity.prior_entropy(train)
    assert abs(nonlinearity.validation_loss(model, train) - h) < 1e-6
    assert abs(h - float(-(p * p.log()).sum())) < 1e-6 and 0.9 < h <= np.log(3)


def _check_write_up_re_renders_without_training(measured, tmp_path, report, monkeypatch):
    monkeypatch.setattr(nonlinearity, "train_job", None)  # any training would fail
    again = nonlinearity.write_up(measured, tmp_path / "again", quick=True)
    assert again.verdict_reason == report.verdict_reason
    assert (tmp_path / "again" / "accuracy.png").is_file()
