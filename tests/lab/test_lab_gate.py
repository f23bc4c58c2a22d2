"""The competence gate: no verdict is drawn while an arm misses its own training criterion.

Reads every committed report (docs/experiments/*/report.json): each states its arms' competence
criteria and per-seed measurements, and a verdict other than "inconclusive" stands only when
every arm passes on every seed and the numbers come from at least three seeds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attnlab.lab.kit.report import VERDICTS, Competence, Report, Table, gate, overlap, spread_text

DOCS = Path(__file__).resolve().parents[2] / "docs" / "experiments"
REPORTS = sorted(DOCS.glob("*/report.json"))
MIN_SEEDS = 3


def _passes(c: dict) -> bool:
    """Recomputed from the stored values and threshold (the stored flag is not trusted)."""
    values = c["values"]
    ok = [
        math.isfinite(v) and (v >= c["threshold"] if c["higher_is_better"] else v <= c["threshold"])
        for v in values
    ]
    return bool(ok) and all(ok)


def test_there_are_committed_reports():
    assert len(REPORTS) >= 10


@pytest.mark.parametrize("path", REPORTS, ids=[p.parent.name for p in REPORTS])
def test_committed_report_verdict_follows_competence(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["verdict"] in VERDICTS
    assert "competence" in data, f"{path.parent.name}: no competence criteria stated"
    assert isinstance(data.get("seeds"), list) and data["seeds"], "seeds not recorded"
    assert data.get("command") and data.get("machine") and data.get("wall_time_s", 0) > 0
    for c in data["competence"]:
        assert c["criterion"] and c["arm"] and len(c["values"]) == len(data["seeds"]), c
        assert c["passed"] == _passes(c), f"stored 'passed' disagrees with the values: {c}"
    failed = [c["arm"] for c in data["competence"] if c.get("in_verdict", True) and not _passes(c)]
    if failed or len(data["seeds"]) < MIN_SEEDS:
        assert data["verdict"] == "inconclusive", (
            f"{path.parent.name}: verdict {data['verdict']!r} drawn while "
            + (
                f"arms {failed} missed their criterion"
                if failed
                else f"only {len(data['seeds'])} seed(s) back it"
            )
        )


def _report(verdict: str, competence: list[Competence]) -> Report:
    return Report(
        name="d",
        title="t",
        claim="c",
        source="000",
        setup=[],
        tables=[Table("x", [])],
        verdict=verdict,
        verdict_reason="r",
        competence=competence,
    )


def test_competence_passes_only_when_every_seed_does():
    assert Competence("a", "acc", 0.99, [0.995, 1.0, 0.99]).passed
    assert not Competence("a", "acc", 0.99, [0.995, 0.98, 1.0]).passed
    assert not Competence("a", "acc", 0.99, []).passed
    assert not Competence("a", "acc", 0.99, [float("nan")]).passed
    assert Competence("a", "loss", 0.1, [0.05, 0.09], higher_is_better=False).passed


def test_report_refuses_a_verdict_while_an_arm_misses():
    bad = [Competence("sinusoidal", "copy accuracy on n <= 16", 0.99, [0.13, 0.2, 0.1])]
    with pytest.raises(ValueError, match="sinusoidal.*inconclusive"):
        _report("held", bad)
    verdict, reason = gate("held", "sinusoids win", bad)
    assert verdict == "inconclusive" and "sinusoidal" in reason and "sinusoids win" in reason
    assert reason.startswith("no verdict: 1 arm(s) missed 1 competence criterion")
    twice = bad + [Competence("sinusoidal", "loss", 0.1, [0.5, 0.4, 0.6], higher_is_better=False)]
    assert gate("held", "x", twice)[1].startswith(
        "no verdict: 1 arm(s) missed 2 competence criteria"
    )
    report = _report(verdict, bad)
    text = report.to_markdown()
    assert "## Competence" in text and "| sinusoidal |" in text and "| no |" in text
    data = json.loads(report.to_json())
    assert data["competence"][0]["passed"] is False and data["competence"][0]["values"][0] == 0.13


def test_gate_keeps_the_verdict_when_all_arms_pass():
    reference = Competence("none", "acc", 0.9, [0.5, 0.5, 0.5], in_verdict=False)
    ok = [Competence("a", "acc", 0.9, [0.95, 0.97, 0.99]), reference]
    assert gate("held", "fine", ok) == ("held", "fine")
    assert _report("held", ok).verdict == "held"


def test_spread_helpers():
    assert spread_text([0.9, 1.0, 0.95]) == "0.95 (0.9-1)"
    assert overlap([0.1, 0.3], [0.25, 0.5]) and not overlap([0.1, 0.2], [0.3, 0.4])
