"""Experiment ``order`` (quick form): without positions the encoder is exactly permutation
equivariant and the classifier cannot beat 1/2 on a swap-closed test set."""

from __future__ import annotations

import numpy as np

from attnlab.lab import run_experiment
from attnlab.lab.experiments.order import (
    GAP,
    KINDS,
    NOUNS,
    PROB_GAP,
    STEPS,
    make_sentences,
    swap_nouns,
)
from attnlab.lab.kit.verdict import LearningRate


def test_swap_exchanges_subject_and_object_only():
    sentences, subjects = make_sentences(50, np.random.default_rng(0))
    for words, subject in zip(sentences, subjects):
        swapped = swap_nouns(words)
        nouns = [w for w in words if w in NOUNS]
        assert nouns[0] == NOUNS[subject] and [w for w in swapped if w in NOUNS] == nouns[::-1]
        assert sorted(swapped) == sorted(words) and swapped[0] == "[cls]"


def test_quick_order_run(tmp_path):
    """One quick run, every check."""
    report, path = run_experiment("order", quick=True, out_dir=tmp_path / "order")
    assert path.is_file() and (path.parent / "accuracy.png").is_file()
    _check_no_positions_is_permutation_equivariant_and_blind_to_order(report)
    _check_table_lists_every_position_kind(report)
    _check_every_arm_is_gated(report)


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


def _check_every_arm_is_gated(report):
    assert report.arms == list(KINDS)  # "none", whose failure is the claim, is compared too
    for c in report.competence:
        assert c.lr is not None and len(c.lr.grid) >= 3 and c.doubling is not None
        assert c.doubling.steps == STEPS[True] and c.doubling.seeds == [0]
    assert {t.what for t in report.thresholds} >= {"test accuracy without positions"}
    sweep = report.table("learning-rate sweep (seed 0)").rows
    assert {r["positions"] for r in sweep} == set(KINDS) and sum(r["chosen"] for r in sweep) == 5


def test_write_up_renders_measured_numbers_without_training(tmp_path, monkeypatch):
    from attnlab.lab.experiments import order

    per = {"val": 1.0, "test": 1.0, "final train loss": 0.1, GAP: 0.5, PROB_GAP: 0.5,
           "train s": 1.0, "maps": [[[1.0] * 7] * 7] * 2}  # fmt: skip
    none = {**per, "val": 0.5, "test": 0.5, GAP: 0.0, PROB_GAP: 0.0}
    lr = LearningRate(3e-3, [1e-3, 3e-3, 1e-2])
    measured = {"seeds": [0, 1, 2], "steps": 800, "lr": dict.fromkeys(KINDS, lr),
                "sweeps": {k: {1e-3: 0.9, 3e-3: 1.0, 1e-2: 0.9} for k in KINDS},
                "per": {k: [none if k == "none" else per] * 3 for k in KINDS},
                "double": {k: none if k == "none" else per for k in KINDS}}  # fmt: skip
    monkeypatch.setattr(order, "train_job", None)  # write_up must not train
    report = order.write_up(measured, tmp_path, quick=False)
    assert report.verdict == "held" and report.metrics["gap_none"] == 0.0
    assert all(c.passed for c in report.competence)
