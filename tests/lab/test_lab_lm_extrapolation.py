"""Experiment ``lm_extrapolation`` (quick form): every position kind gated (a learning-rate
sweep and a step doubling), scored at 1x-8x the training length; measure() and write_up()
separate."""

from __future__ import annotations

import math

from attnlab.lab.experiments import lm_extrapolation as exp
from attnlab.lab.kit import lm_arms as la
from lab_write_up import no_training


def test_lm_extrapolation_quick_report(tmp_path, monkeypatch):
    measured = exp.measure(True, 0, None)
    report = exp.write_up(measured, tmp_path, True)
    assert report.arms == list(exp.KINDS) == [c.arm for c in report.competence]
    for c in report.competence:  # every kind, the ones whose failure is the claim too
        assert c.lr is not None and len(c.lr.grid) >= 2 and c.lr.chosen in c.lr.grid
        assert c.doubling is not None and c.doubling.seeds == [0]
        assert c.doubling.steps == la.SIZE[True].steps
    assert len(report.thresholds) == 3 and all(t.source for t in report.thresholds)
    lengths = report.metrics["lengths"]
    assert lengths == [m * la.SIZE[True].context for m in exp.MULTIPLES]
    for kind in exp.KINDS:  # scored at every length: a perplexity, finite and above 1
        loss = report.metrics["loss"][kind]
        assert len(loss) == len(lengths) and all(math.isfinite(v) and math.exp(v) > 1 for v in loss)
    checks = report.table(la.CHECKS).rows
    assert len(checks) == 4 * (len(exp.MULTIPLES) - 1)
    assert (tmp_path / "extrapolation.png").is_file()
    # write_up re-renders the measured numbers without training anything
    monkeypatch.setattr(la, "train_job", no_training)
    again = exp.write_up(measured, tmp_path / "again", True)
    assert again.verdict_reason == report.verdict_reason
    assert again.tables[0].rows == report.tables[0].rows
