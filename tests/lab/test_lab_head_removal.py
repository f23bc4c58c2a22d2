"""Experiment ``head_removal`` (quick form): greedy removal, held-out scoring, the gated LM and
the measure / write_up split."""

from __future__ import annotations

import pytest
import torch

from attnlab.lab import run_experiment
from attnlab.lab.experiments.head_removal import (
    THRESHOLDS,
    greedy_removal,
    make_model,
    one_head_layers,
    removable,
    val_loss,
    write_up,
)
from attnlab.lab.kit.gating import bracketed_lr


def test_greedy_head_removal_removes_every_head_once():
    torch.manual_seed(0)
    model = make_model(12, 10, quick=True)
    windows = torch.randint(0, 12, (4, 10))
    losses, order = greedy_removal(model, windows, 2, 4)
    assert len(losses) == 9 and sorted(order) == [(a, b) for a in range(2) for b in range(4)]
    assert abs(losses[-1] - val_loss(model, windows, order)) < 1e-6  # all heads gone
    assert removable([1.0, 1.01, 1.2, 1.02], 0.05) == 1  # stops at the first rise past tol
    assert removable([1.0, 1.01, 1.02], 0.05) == 2


def test_one_head_per_layer_is_chosen_on_one_split_and_scored_on_the_other():
    torch.manual_seed(0)
    model = make_model(12, 10, quick=True)
    choose, score = torch.randint(0, 12, (4, 10)), torch.randint(0, 12, (4, 10))
    kept = one_head_layers(model, choose, score, 2, 4)
    for layer, k in enumerate(kept):
        others = [(layer, h) for h in range(4) if h != k["head"]]
        assert abs(k["loss"] - val_loss(model, score, others)) < 1e-6
        best = min(
            range(4),
            key=lambda h: val_loss(model, choose, [(layer, x) for x in range(4) if x != h]),
        )
        assert k["head"] == best


def test_the_sweep_extends_an_edge_choice_until_bracketed():
    calls = []

    def score(lrs):
        calls.append(lrs)
        return {lr: abs(lr - 0.05) for lr in lrs}  # best rate above the grid

    lr, scores = bracketed_lr(score, [1e-3, 1e-2], chosen_on="toy", max_extensions=3)
    assert len(calls) == 2 and calls[1] == [pytest.approx(0.1)]  # one rate past the edge
    assert lr.bracketed and lr.chosen == 1e-2 and len(scores) == 3
    edge, _ = bracketed_lr(score, [1e-4, 1e-3], chosen_on="toy", max_extensions=1)
    assert not edge.bracketed  # the limit reached at the edge: the gate will say so


def test_quick_head_removal_run(tmp_path):
    report, _ = run_experiment("head_removal", quick=True, out_dir=tmp_path / "a")
    assert (tmp_path / "a" / "greedy.png").is_file() and len(report.metrics["curve_mean"]) == 9
    assert report.arms == ["character LM"] and report.thresholds == THRESHOLDS
    (lm,) = report.competence
    assert lm.gated and {1e-3, 3e-3, 1e-2} <= set(lm.lr.grid) and lm.doubling.steps == 40
    assert report.verdict in ("held", "did not hold", "mixed", "inconclusive")
    assert "scoring split" in report.verdict_reason


def test_write_up_renders_measured_numbers_without_training(tmp_path, monkeypatch):
    import attnlab.lab.experiments.head_removal as hr

    runs = []
    for seed in range(3):
        one = [[0.01 * (seed + 1), 0.2, 0.0, 0.03], [0.0, 0.01, 0.3, 0.02]]
        curve = [1.5, 1.5, 1.51, 1.52, 1.6, 1.7, 1.8, 2.0, 2.5]
        runs.append(
            {
                "val": 1.6,
                "one": one,
                "curve choose": curve,
                "curve score": [c + 0.01 for c in curve],
                "order": [[0, 2], [1, 0], [0, 0], [1, 1], [0, 3], [1, 3], [0, 1], [1, 2]],
                "one head": [{"head": 1, "loss": 1.53}, {"head": 2, "loss": 1.9}],
                "L": 2,
                "H": 4,
            }
        )
    measured = {
        "seeds": [0, 1, 2],
        "steps": 1500,
        "source": "text",
        "bigram": 2.4,
        "lr": {"chosen": 3e-3, "grid": [1e-3, 3e-3, 1e-2], "chosen_on": "val"},
        "sweep": {"0.001": 1.7, "0.003": 1.6, "0.01": 1.8},
        "double": [1.58],
        "runs": runs,
    }
    monkeypatch.setattr(hr, "fit", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    report = write_up(measured, tmp_path, quick=False)
    # 3 of 8 heads (37.5 %) before +0.05; 6 heads cost < 0.05 alone; layer 1 keeps one head
    assert report.per_seed["removable"] == [3, 3, 3] and report.per_seed["harmless"] == [6, 6, 6]
    assert report.per_seed["one-head layers"] == [1, 1, 1]
    assert report.verdict == "held" and report.competence[0].passed
    measured["double"] = [1.5]  # still falling by 0.1 > tolerance when the steps double
    assert write_up(measured, tmp_path, quick=False).verdict == "inconclusive"
