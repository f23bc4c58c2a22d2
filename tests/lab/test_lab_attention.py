"""Experiment ``attention`` (quick form): the report compares soft and hard attention on both
tasks; the tasks are what they claim to be."""

from __future__ import annotations

import numpy as np

from attnlab.lab import run_experiment
from attnlab.lab.experiments.attention import SHAPES, TASKS, VARIANTS
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
    """One quick run (xdist would repeat a module fixture per worker), every check."""
    path = tmp_path / "attention"
    report, readme = run_experiment("attention", quick=True, out_dir=path)
    assert (path / "accuracy.png").is_file() and "Soft vs hard" in readme.read_text()
    _check_every_task_and_variant_is_reported(report)


def _check_every_task_and_variant_is_reported(report):
    rows = report.tables[0].rows
    assert [(r["task"], r["model"], r["attention"]) for r in rows] == [
        (t, shape, v) for t in TASKS for shape, _, _ in SHAPES for v, _, _ in VARIANTS
    ]
    assert all(0.0 <= r["test accuracy"] <= 1.0 for r in rows)
