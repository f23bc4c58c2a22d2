"""Experiment ``induction`` (quick form): the data, the scores, the ablation, the copying
control, the path patching of layer 1, the gated arm and the measure / write_up split."""

from __future__ import annotations

import re

import numpy as np
import torch

from attnlab import inspect
from attnlab.lab import run_experiment
from attnlab.lab.experiments.induction import (
    ARM,
    THRESHOLDS,
    ablation,
    half_losses,
    head_scores,
    make_model,
    path_patched,
    repeated_segments,
    substituted,
    write_up,
)


def _model_and_data():
    ids, second = repeated_segments(6, 5, 10, np.random.default_rng(0), max_gap=3)
    torch.manual_seed(0)
    model = make_model(10, 14, quick=True)
    means = inspect.run_with_cache(model, ids, names="*.heads")[1]
    return model, ids, second, means


def test_induction_data_scores_and_ablation():
    model, ids, second, means = _model_and_data()
    assert ids.shape == (6, 14) and (ids[:, 0] == 0).all() and (ids[:, 1:] > 0).all()
    for row, s in zip(ids, second):  # the second copy starts after a gap of 0..3 tokens
        assert 6 <= s <= 9 and torch.equal(row[s : s + 5], row[1:6])
    ind, prev = head_scores(model, ids, second, 5)
    assert ind.shape == prev.shape == (2, 4) and (ind >= 0).all() and (ind <= 1).all()
    rng = np.random.default_rng(0)
    none = ablation(model, 1, [0.1, 0.2, 0.0, 0.05], (ids, second), 5, rng, means)  # none > 0.3
    assert none == {"heads": [], "others": [], "loss": None, "first": None, "other loss": None}
    some = ablation(model, 1, [0.9, 0.2, 0.0, 0.5], (ids, second), 5, rng, means)
    assert some["heads"] == [0, 3] and len(some["others"]) == 2
    assert not set(some["others"]) & {0, 3} and some["loss"] > 0 and some["other loss"] > 0


def test_the_copying_control_changes_one_token_of_the_first_copy():
    ids, second = repeated_segments(50, 5, 10, np.random.default_rng(1), max_gap=3)
    out, query, y = substituted(ids, second, 5, 10, np.random.default_rng(2))
    changed = (out != ids).nonzero()
    assert changed.size(0) == 50 and torch.equal(changed[:, 0], torch.arange(50))
    j = changed[:, 1] - 1  # the first copy's x_{j+1} (index j + 1) changed, 1 <= j <= L - 1
    assert ((j >= 1) & (j <= 4)).all() and ((y >= 1) & (y <= 9)).all()
    assert (
        torch.equal(out[torch.arange(50), j + 1], y) and (y != ids[torch.arange(50), j + 1]).all()
    )
    assert torch.equal(out[torch.arange(50), query], out[torch.arange(50), j])  # x_j again


def test_path_patching_touches_only_the_chosen_path():
    model, ids, second, means = _model_and_data()
    clean = half_losses(model, ids, second, 5)[1]
    data = (ids, second)
    assert abs(path_patched(model, [], [0, 1], "K", data, 5, means) - clean) < 1e-6
    assert abs(path_patched(model, [2], [], "K", data, 5, means) - clean) < 1e-6
    patched = path_patched(model, [0, 1, 2, 3], [0, 1, 2, 3], "K", data, 5, means)
    with inspect.ablate_heads(model, [(0, h) for h in range(4)], mode="mean", means=means):
        full = half_losses(model, ids, second, 5)[1]
    assert patched != clean and patched != full  # the keys alone, not the whole layer


def test_quick_induction_run(tmp_path):
    report, _ = run_experiment("induction", quick=True, out_dir=tmp_path)
    assert (tmp_path / "ablation.png").is_file()
    assert not re.search(r"\bnan\b", (tmp_path / "README.md").read_text())  # stated instead
    assert len(report.metrics["curves"][0]) == len(report.metrics["curve_steps"]) == 40
    assert report.arms == [ARM] and report.thresholds == THRESHOLDS
    (lm,) = report.competence
    assert lm.gated and {3e-4, 1e-3, 3e-3} <= set(lm.lr.grid) and lm.doubling.steps == 40
    table = report.table(
        "layer 1 by path patching: repeat loss with one layer-1 head mean-ablated only along "
        "the path into the layer-2 induction heads' keys (K) or queries (Q), and fully"
    )
    assert len(table.rows) == 4


def _measured(k_prev, k_other, copy=0.95, double=0.02):
    runs = []
    for kp, ko in zip(k_prev, k_other):
        first, repeat = 4.0, 0.05
        gain = first - repeat

        def loss(frac, repeat=repeat, gain=gain):
            return repeat + frac * gain

        def ablated(heads, hit, other, first=first, loss=loss):
            """An ablation's record: ``heads`` off (loss at ``hit`` of the gain), the others
            off instead (at ``other``)."""
            rest = [h for h in range(4) if h not in heads]
            return {"heads": heads, "others": rest, "loss": loss(hit), "first": first,
                    "other loss": loss(other)}  # fmt: skip

        runs.append(
            {
                "first": first,
                "repeat": repeat,
                "valid": 0.05,
                "induction": [[0.0] * 4, [0.9, 0.8, 0.1, 0.05]],
                "previous": [[0.6, 0.1, 0.5, 0.1], [0.0] * 4],
                "ablate induction": ablated([0, 1], 0.9, 0.1),
                "ablate previous": ablated([0, 2], 0.7, 0.6),
                "single and cumulative": ([[0.1] * 4, [0.2] * 4], [1.0, 3.0, 3.5, 3.9]),
                "copy": copy,
                "copy ablated": 0.02,
                "paths": {
                    "per head": {"K": [1.0] * 4, "Q": [0.1] * 4},
                    "prev K": loss(kp),
                    "other K": loss(ko),
                    "targets": [0, 1],
                },
                "steps": [10, 20],
                "curve": [3.0, 0.1],
                "track": [(0.1, 0.2), (0.9, 0.6)],
                "log V": 4.1,
            }
        )
    return {
        "seeds": [0, 1, 2],
        "steps": 2000,
        "lr": {"chosen": 1e-3, "grid": [3e-4, 1e-3, 3e-3], "chosen_on": "val"},
        "sweep": {"0.0003": 0.5, "0.001": 0.05, "0.003": 0.3},
        "double": [double],
        "runs": runs,
    }


def test_write_up_follows_the_path_patching_evidence(tmp_path):
    held = write_up(_measured([0.8, 0.7, 0.9], [0.1, 0.2, 0.15]), tmp_path, quick=False)
    assert held.verdict == "held" and all(held.metrics["checks"].values())
    # the previous-token heads' key path no better than other layer-1 heads': not resolved
    mixed = write_up(_measured([0.3, 0.7, 0.5], [0.4, 0.2, 0.6]), tmp_path, quick=False)
    assert mixed.verdict == "mixed" and "no effect resolved" in mixed.verdict_reason
    assert not mixed.metrics["checks"]["layer-1 previous-token heads act through the keys"]
    # a model that does not follow a changed first copy fails the copying control
    assert not write_up(_measured([0.8] * 3, [0.1] * 3, copy=0.1), tmp_path, quick=False).metrics[
        "checks"
    ]["the model copies"]
    # a repeat loss still falling when the steps double: inconclusive
    still = write_up(_measured([0.8] * 3, [0.1] * 3, double=0.2), tmp_path, quick=False)
    assert still.verdict == "inconclusive"
