"""Experiment ``attention`` (quick form): the report compares soft and hard attention on both
tasks; the tasks are what they claim to be."""

from __future__ import annotations

import numpy as np

from attnlab.lab import run_experiment
from attnlab.lab.experiments.attention import (
    COMPARED,
    SHAPES,
    TASKS,
    THRESHOLDS,
    VARIANTS,
    label_entropy,
    write_up,
)
from attnlab.lab.kit.tasks import counting, kv_lookup


def test_kv_lookup_answer_is_the_value_paired_with_the_query():
    data = kv_lookup(300, n_pairs=4, n_keys=6, n_values=5, rng=np.random.default_rng(0))
    for row, label in zip(data.ids.tolist(), data.labels.tolist()):
        query, pairs = row[0], row[1:]
        keys = [(p - 6) // 5 for p in pairs]
        assert len(set(keys)) == 4 and keys.count(query) == 1
        assert (pairs[keys.index(query)] - 6) % 5 == label
    assert data.vocab_size == 6 + 6 * 5 and int(data.ids.max()) < data.vocab_size


def test_counting_labels_count_the_a_symbols():
    data = counting(200, 7, np.random.default_rng(0))
    assert (data.labels == (data.ids[:, 1:] == 1).sum(1)).all() and (data.ids[:, 0] == 0).all()
    assert len(set(data.labels.tolist())) > 5  # counts spread over 0..7


def test_quick_attention_run(tmp_path):
    """One quick run, every check."""
    path = tmp_path / "attention"
    report, readme = run_experiment("attention", quick=True, out_dir=path)
    assert (path / "accuracy.png").is_file() and "Soft vs hard" in readme.read_text()
    _check_every_task_and_variant_is_reported(report)
    assert len(report.arms) == len(COMPARED) == 3 and report.thresholds == THRESHOLDS
    assert [c.arm for c in report.competence] == report.arms
    for c in report.competence:  # every compared arm: a sweep and a doubling, in quick form too
        assert c.gated and c.doubling.steps == 20 and {1e-3, 3e-3, 1e-2} <= set(c.lr.grid)


def test_label_entropy_is_the_loss_of_the_label_frequencies():
    data = counting(400, 7, np.random.default_rng(0))
    p = np.bincount(data.labels.numpy()) / 400
    assert abs(label_entropy(data) + sum(x * np.log(x) for x in p if x > 0)) < 1e-9


def test_write_up_renders_and_gates_without_training(tmp_path):
    def runs(acc, loss=0.1):
        return [
            {
                "test accuracy": acc,
                "valid accuracy": acc,
                "majority class": 0.2,
                "label entropy": 2.0,
                "final train loss": loss,
                "train s": 1.0,
            }
        ] * 3

    keys = [(t, sh, v) for t in TASKS for sh, _, _ in SHAPES for v, _, _ in VARIANTS]
    good = {("count the a's", "1 layer, 1 head", "hard, straight-through"): 0.3}
    m = {
        "seeds": [0, 1, 2],
        "steps": 1000,
        "runs": {" / ".join(k): runs(good.get(k, 0.99)) for k in keys},
        "lr": {
            " / ".join(k): {"chosen": 3e-3, "grid": [1e-3, 3e-3, 1e-2], "chosen_on": "v"}
            for k in COMPARED
        },
        "sweep": {" / ".join(k): {"0.003": 0.9} for k in COMPARED},
        "double": {" / ".join(k): 0.1 for k in COMPARED},
    }
    assert write_up(m, tmp_path, quick=False).verdict == "held"
    m["double"][" / ".join(COMPARED[2])] = 0.3  # the failing arm still learning: no verdict
    report = write_up(m, tmp_path, quick=False)
    assert report.verdict == "inconclusive" and "count the a's" in report.verdict_reason


def _check_every_task_and_variant_is_reported(report):
    rows = report.tables[0].rows
    assert [(r["task"], r["model"], r["attention"]) for r in rows] == [
        (t, shape, v) for t in TASKS for shape, _, _ in SHAPES for v, _, _ in VARIANTS
    ]
    assert all(0.0 <= r["test accuracy"] <= 1.0 for r in rows)
