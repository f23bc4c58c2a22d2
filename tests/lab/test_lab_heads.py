"""Experiment ``heads`` (quick form): multi-head attention costs exactly the FLOPs of one head at
the same d_model; the two-relation task's targets are the tokens 1 and 2 back; 1 and 4 heads
have the same parameters; the gate judges the 1-head arm by convergence, not by its accuracy,
and a flat loss on the one-relation saddle is not convergence."""

from __future__ import annotations

import math

import numpy as np
import torch

from attnlab.lab.experiments.heads import (
    ARMS,
    GAIN,
    OFFSETS,
    PLATEAU,
    SADDLE,
    SETTINGS,
    _targets,
    attention_flops,
    attention_to_offsets,
    converged,
    make_reader,
    make_sequences,
    one_relation_level,
    pair_accuracy,
    pair_loss,
)


def test_targets_are_the_tokens_one_and_two_back():
    ids = make_sequences(5, 16, 8, np.random.default_rng(0))
    assert ids.shape == (5, 8) and int(ids.max()) < 16
    one, two = _targets(ids)
    assert OFFSETS == (1, 2) and one.shape == two.shape == (5, 6)
    for t in range(2, 8):  # position t names x_{t-1} and x_{t-2}
        assert torch.equal(one[:, t - 2], ids[:, t - 1]) and torch.equal(
            two[:, t - 2], ids[:, t - 2]
        )


def test_head_count_does_not_change_parameters_and_scores_are_weights():
    ids = make_sequences(4, 16, 8, np.random.default_rng(1))
    for setting in SETTINGS:
        counts = set()
        for h in (1, 4):
            torch.manual_seed(0)
            model = make_reader(setting, 16, 8, h)
            counts.add(sum(p.numel() for p in model.parameters()))
            assert float(pair_loss(model, (ids,)).detach()) > 0
            acc = pair_accuracy(model, ids)
            assert set(acc) == {"1 back", "2 back", "both"} and acc["both"] <= acc["1 back"]
            looks = attention_to_offsets(model, ids)
            assert len(looks) == h and all(0 <= w <= 1 for row in looks for w in row)
        assert len(counts) == 1


def test_flop_formula_matches_the_counter():
    counted, formula = attention_flops(2, 2, 8, 16)
    assert counted == 3 * formula


def _run(loss: float, both: float) -> dict:
    return {"loss": loss, "acc": {"both": both}}


def test_plateau_check_needs_a_flat_loss_a_flat_accuracy_and_to_be_off_the_saddle():
    level = one_relation_level(quick=False)
    assert abs(level - math.log(64)) < 1e-12
    low = level - 3  # off the saddle: both relations partly named
    assert converged({8: _run(low + PLATEAU / 2, 0.15), 16: _run(low, 0.16)}, 8, quick=False)
    # the loss still falls, or the claim's quantity still rises: not converged
    assert not converged({8: _run(low + 2 * PLATEAU, 0.15), 16: _run(low, 0.16)}, 8, False)
    assert not converged({8: _run(low, 0.15), 16: _run(low, 0.15 + 2 * GAIN)}, 8, False)
    # the earlier full run's creep, 0.08 nats per doubling, is a curve still falling
    assert PLATEAU <= 0.03
    assert not converged({8: _run(low + 0.08, 0.15), 16: _run(low, 0.15)}, 8, False)
    # flat on the one-relation saddle (one read-out at chance): not converged either
    assert not converged({8: _run(level, 1 / 64), 16: _run(level - 0.01, 1 / 64)}, 8, False)


def test_quick_heads_run(tmp_path, monkeypatch):
    """One quick run, every check."""
    import attnlab.lab.experiments.heads as heads

    measured = heads.measure(quick=True, seed=0)
    report = heads.write_up(measured, tmp_path / "heads", quick=True)
    # write_up re-renders from the numbers alone: no training
    monkeypatch.setattr(heads, "fit", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    again = heads.write_up(measured, tmp_path / "again", quick=True)
    assert again.verdict_reason == report.verdict_reason
    # both compared arms gated: a bracketed-or-extended sweep and a step doubling each
    assert report.arms == ["attention only, 1 head", "attention only, 4 heads"]
    assert report.thresholds == heads.THRESHOLDS
    gated = [c for c in report.competence if c.gated]
    assert [c.arm for c in gated] == report.arms
    assert all({1e-3, 3e-3, 1e-2} <= set(c.lr.grid) for c in gated)
    assert gated[1].doubling.steps == 30 and gated[1].doubling.seeds == [0]
    rows = report.table("(a) cost at equal d_model").rows
    assert [r["heads"] for r in rows] == [1, 2, 4, 8]
    assert len({r["counted FLOPs (fwd+bwd)"] for r in rows}) == 1
    # backward costs twice the forward: counted fwd+bwd = 3 x the closed-form forward count
    assert all(r["counted FLOPs (fwd+bwd)"] == 3 * r["formula FLOPs (fwd)"] for r in rows)
    rows = report.table("(b) the token 1 back and 2 back at once (mean (min-max) over seeds)").rows
    assert [(r["model"], r["heads"]) for r in rows] == ARMS
    assert [r["steps"] for r in rows[1:]] == [30, 30, 30]
    for setting in SETTINGS:  # same width: the head count does not change the parameter count
        assert len({r["parameters"] for r in rows if r["model"] == setting}) == 1
    # the 1-head attention-only arm is judged by convergence (its failure is the finding): loss
    # and accuracy plateaus and off the saddle; the 4-head arm by accuracy; full blocks: references
    loss, acc, saddle, four = report.competence[:4]
    assert {c.arm for c in (loss, acc, saddle)} == {"attention only, 1 head"}
    assert (
        "plateau" in loss.criterion and "plateau" in acc.criterion and "saddle" in saddle.criterion
    )
    assert all(c.in_verdict and not c.higher_is_better for c in (loss, acc, saddle))
    assert saddle.threshold == one_relation_level(quick=True) - SADDLE
    assert "right" in four.criterion and four.in_verdict
    assert [c.in_verdict for c in report.competence[4:]] == [False, False]
    assert len(report.per_seed["one_head_loss_drop"]) == 1 and report.seeds == [0]
    # the ladder: 120 and 240 steps, then 480 and 960 (the cap) while the check fails
    (steps,) = report.per_seed["one_head_steps"]
    ladder = report.table(
        "the 1-head attention-only arm, per seed and budget (test accuracy; the "
        "drop and the rise from half the steps are the plateau check)"
    ).rows
    rungs = [120 * 2**k for k in range(heads.DOUBLINGS + 1)]
    assert [r["steps"] for r in ladder] == rungs[: rungs.index(steps) + 1]
    budgets = measured["ladder"][0]
    for short in rungs[: rungs.index(steps) - 1]:  # every earlier check failed: extended
        assert not converged(budgets, short, quick=True)
    if steps < rungs[-1]:  # stopped before the cap only because the check passed
        assert converged(budgets, steps // 2, quick=True) and loss.doubling.converged
    assert loss.doubling.tolerance == PLATEAU and str(rungs[-1]) in loss.criterion
    assert ladder[-1]["loss drop from half the steps"] == report.per_seed["one_head_loss_drop"][0]
    assert (tmp_path / "heads" / "learning.png").is_file()
