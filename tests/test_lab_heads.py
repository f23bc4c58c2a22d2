"""Experiment ``heads`` (quick form): multi-head attention costs exactly the FLOPs of one head at
the same d_model; the generated giving sentences label the roles correctly."""

from __future__ import annotations

import numpy as np

from attnlab.lab import run_experiment
from attnlab.lab.heads import NAMES, OBJECTS, SETTINGS, WORDS, attention_flops, make_giving


def test_generated_sentences_carry_their_roles():
    ids, verb, labels = make_giving(100, np.random.default_rng(0))
    for row, v, (giver, obj, recipient) in zip(ids.tolist(), verb.tolist(), labels.tolist()):
        words = [WORDS[i] for i in row if i != 0]
        assert words[v] == "gave" and words[v - 1] == NAMES[giver]
        assert OBJECTS[obj] in words and NAMES[recipient] in words[v + 1 :]
        assert giver != recipient


def test_flop_formula_matches_the_counter():
    counted, formula = attention_flops(2, 2, 8, 16)
    assert counted == 3 * formula


def test_quick_heads_run(tmp_path):
    """One quick run (xdist would repeat a module fixture per worker), every check."""
    report, _ = run_experiment("heads", quick=True, out_dir=tmp_path / "heads")
    _check_flops_do_not_depend_on_the_number_of_heads(report)
    _check_role_table_has_both_models(report)


def _check_flops_do_not_depend_on_the_number_of_heads(report):
    rows = report.table("(a) cost at equal d_model").rows
    assert [r["heads"] for r in rows] == [1, 2, 4, 8]
    assert len({r["counted FLOPs (fwd+bwd)"] for r in rows}) == 1
    # backward costs twice the forward: counted fwd+bwd = 3 x the closed-form forward count
    assert all(r["counted FLOPs (fwd+bwd)"] == 3 * r["formula FLOPs (fwd)"] for r in rows)


def _check_role_table_has_both_models(report):
    rows = report.table("(b) who gave what to whom").rows
    assert [(r["model"], r["heads"]) for r in rows] == [
        (setting, h) for setting in SETTINGS for h in (1, 4)
    ]
    for setting in SETTINGS:  # same width: the head count does not change the parameter count
        assert len({r["parameters"] for r in rows if r["model"] == setting}) == 1
    all_three = report.metrics["all_three"]  # one seed in the quick form: the plain values
    assert all(0.0 <= v <= 1.0 for v in all_three.values()) and len(all_three) == 4
    assert len(report.competence) == 4 and report.seeds == [0]
