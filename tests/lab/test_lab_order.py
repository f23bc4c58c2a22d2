"""Experiment ``order`` (quick form): without positions the encoder is exactly permutation
equivariant and the classifier cannot beat 1/2 on a swap-closed test set."""

from __future__ import annotations

import numpy as np

from attnlab.lab import run_experiment
from attnlab.lab.experiments.order import GAP, KINDS, NOUNS, make_sentences, swap_nouns


def test_swap_exchanges_subject_and_object_only():
    sentences, subjects = make_sentences(50, np.random.default_rng(0))
    for words, subject in zip(sentences, subjects):
        swapped = swap_nouns(words)
        nouns = [w for w in words if w in NOUNS]
        assert nouns[0] == NOUNS[subject] and [w for w in swapped if w in NOUNS] == nouns[::-1]
        assert sorted(swapped) == sorted(words) and swapped[0] == "[cls]"


def test_quick_order_run(tmp_path):
    """One quick run (xdist would repeat a module fixture per worker), every check."""
    report, path = run_experiment("order", quick=True, out_dir=tmp_path / "order")
    assert path.is_file() and (path.parent / "accuracy.png").is_file()
    _check_no_positions_is_permutation_equivariant_and_blind_to_order(report)
    _check_table_lists_every_position_kind(report)


def _check_no_positions_is_permutation_equivariant_and_blind_to_order(report):
    acc = report.metrics["accuracy"]
    assert report.metrics["gap_none"] < 1e-12  # float64: h(Px) == P h(x) up to rounding
    assert acc["none"] <= 0.5  # identical logits for each (sentence, swap) pair: one is wrong
    for kind in KINDS[1:]:
        assert report.metrics["gaps"][kind] > 1e-3, kind  # positions break the symmetry


def _check_table_lists_every_position_kind(report):
    rows = report.tables[0].rows
    assert [r["positions"] for r in rows] == list(KINDS)
    assert all(GAP in r and "test accuracy (swap-closed)" in r for r in rows)
