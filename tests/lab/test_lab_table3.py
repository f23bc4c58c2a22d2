"""Experiment ``table3`` (quick form): Vaswani et al.'s Table 3 rows (A), (B), (E) on a char
LM, every arm gated (a learning-rate sweep and a step doubling); measure() and write_up()
separate."""

from __future__ import annotations

import math

from attnlab.lab.experiments import table3 as exp
from attnlab.lab.kit import lm_arms as la
from attnlab.lab.kit.lm_arms import LMSize
from lab_write_up import no_training


def test_table3_arms_keep_width_and_vary_one_setting():
    size = LMSize(context=16, d_model=64, n_layers=2, n_heads=4, batch=8, steps=1)
    arms = exp.arms(size)
    assert arms[exp.BASE] == {}
    assert {a["n_heads"] for a in arms.values() if "n_heads" in a} == {1, 2, 8, 16}
    assert [a["d_head"] for a in arms.values() if "d_head" in a] == [8, 4]  # base d_k 16
    assert all(a.get("d_v", 16) == 16 for a in arms.values() if "d_head" in a)


def test_table3_quick_report(tmp_path, monkeypatch):
    measured = exp.measure(True, 0, None)
    report = exp.write_up(measured, tmp_path, True)
    names = list(exp.arms(la.SIZE[True]))
    assert report.arms == names == [c.arm for c in report.competence] and len(names) == 8
    for c in report.competence:  # every arm swept and doubled
        assert c.lr is not None and len(c.lr.grid) >= 2 and c.lr.chosen in c.lr.grid
        assert c.doubling is not None and c.doubling.seeds == [0]
    assert len(report.thresholds) == 4 and all(t.source for t in report.thresholds)
    params = report.metrics["params"]  # row (A): same parameters whatever the head count
    assert len({params[a] for a in names if a.startswith("(A)")} | {params[exp.BASE]}) == 1
    assert all(params[a] < params[exp.BASE] for a in names if a.startswith("(B)"))
    assert all(math.isfinite(v) and math.exp(v) > 1 for v in report.metrics["val"].values())
    checks = report.table(la.CHECKS).rows
    assert [r["check"][:3] for r in checks] == ["(A)", "(A)", "(B)", "(B)", "(E)"]
    assert (tmp_path / "heads.png").is_file() and (tmp_path / "rows.png").is_file()
    monkeypatch.setattr(la, "train_job", no_training)
    again = exp.write_up(measured, tmp_path / "again", True)
    assert again.verdict_reason == report.verdict_reason
