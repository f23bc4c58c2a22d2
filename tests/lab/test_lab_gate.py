"""The competence gate: no verdict is drawn while an arm misses its own training criterion.

Reads every committed report (docs/experiments/*/report.json): each states its arms' competence
criteria and per-seed measurements, and a verdict other than "inconclusive" stands only when
every arm passes on every seed and the numbers come from at least three seeds. A report that is
current (its code hash matches the code today) is re-judged under the full rule: every compared
arm has a criterion with a bracketed learning rate and a converged step doubling, and its
thresholds are quoted with their source. The committed index must be the index of today's code,
so a report whose code changed is visibly marked stale there.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attnlab.cli.outputs import files_in, not_ours, recorded
from attnlab.lab.kit.index import INDEX_FILE, index_text, read_reports, staleness
from attnlab.lab.kit.provenance import behaviour_tree, code_hash, reached_modules, uses
from attnlab.lab.kit.registry import discover
from attnlab.lab.kit.report import Report, Table
from attnlab.lab.kit.seeds import overlap, resolved, spread_text
from attnlab.lab.kit.verdict import (
    VERDICTS,
    Competence,
    Doubling,
    LearningRate,
    gate,
    gated_fields,
    ungated,
)

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


def _rejudged(c: dict) -> bool:
    """The threshold on every seed, and (where the report gives them) a bracketed rate and a
    converged doubling, all recomputed from the stored numbers."""
    lr, doubling = c.get("lr"), c.get("doubling")
    bracketed = (
        lr is None or LearningRate(**{k: v for k, v in lr.items() if k != "bracketed"}).bracketed
    )
    converged = (
        doubling is None
        or Doubling(**{k: v for k, v in doubling.items() if k != "converged"}).converged
    )
    return _passes(c) and bracketed and converged


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
        assert c.get("met", c["passed"]) == _passes(c), f"stored 'met' disagrees: {c}"
        assert c["passed"] == _rejudged(c), f"stored 'passed' disagrees with the evidence: {c}"
    failed = [
        c["arm"] for c in data["competence"] if c.get("in_verdict", True) and not _rejudged(c)
    ]
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
    assert reason.startswith(
        "no verdict: 1 arm(s) missed their gate (every criterion in the report) -- missed copy "
        "accuracy on n <= 16: sinusoidal (0.143 (0.1-0.2); threshold 0.99)."
    )
    twice = bad + [Competence("sinusoidal", "loss", 0.1, [0.5, 0.4, 0.6], higher_is_better=False)]
    assert "1 arm(s) missed" in gate("held", "x", twice)[1]
    assert "missed loss: sinusoidal (0.5 (0.4-0.6); threshold 0.1)" in gate("held", "x", twice)[1]
    report = _report(verdict, bad)
    text = report.to_markdown()
    assert "## Competence" in text and "| sinusoidal |" in text and "| no |" in text
    data = json.loads(report.to_json())
    assert data["competence"][0]["passed"] is False and data["competence"][0]["values"][0] == 0.13


def test_a_missed_arm_is_reported_by_what_it_missed_only():
    """An arm that met its threshold but did not converge is listed under the doubling alone:
    its threshold, met, is not named among what it missed."""
    not_converged = Competence(
        "LM",
        "loss below the bigram",
        2.46,
        [1.67, 1.68, 1.66],
        higher_is_better=False,
        doubling=Doubling(1000, [1.67, 1.68, 1.66], [1.56, 1.57, 1.55], 0.05, [0, 1, 2], "loss"),
    )
    verdict, reason = gate("held", "numbers", [not_converged])
    assert verdict == "inconclusive"
    assert reason == (
        "no verdict: 1 arm(s) missed their gate (every criterion in the report) -- not converged "
        "(loss moved more than 0.05 from 1000 to 2000 steps): LM (1.67 -> 1.56, 1.68 -> 1.57, "
        "1.66 -> 1.55). The comparison would have read: numbers"
    )
    assert "bigram" not in reason


def test_gate_keeps_the_verdict_when_all_arms_pass():
    reference = Competence("none", "acc", 0.9, [0.5, 0.5, 0.5], in_verdict=False)
    ok = [Competence("a", "acc", 0.9, [0.95, 0.97, 0.99]), reference]
    assert gate("held", "fine", ok) == ("held", "fine")
    assert _report("held", ok).verdict == "held"


def test_spread_helpers():
    assert spread_text([0.9, 1.0, 0.95]) == "0.95 (0.9-1)"
    assert overlap([0.1, 0.3], [0.25, 0.5]) and not overlap([0.1, 0.2], [0.3, 0.4])


# -- the full rule: bracketed rates, step doubling, every compared arm --------------------------


def _arm(arm: str, lr: LearningRate | None, doubling: Doubling | None) -> Competence:
    return Competence(arm, "acc", 0.9, [0.95, 0.96, 0.97], lr=lr, doubling=doubling)


def _doubling(a: list[float], b: list[float], tol: float = 0.01) -> Doubling:
    return Doubling(100, a, b, tol, seeds=list(range(len(a))), metric="val loss")


def test_a_rate_at_the_grid_edge_is_not_bracketed():
    assert LearningRate(3e-3, [1e-3, 3e-3, 1e-2]).bracketed
    assert not LearningRate(1e-2, [1e-3, 3e-3, 1e-2]).bracketed  # the best may lie above
    assert not LearningRate(1e-3, [1e-3]).bracketed  # no sweep at all
    fixed = LearningRate(1e-3, [1e-3], fixed="the paper's recipe, reproduced")
    assert fixed.bracketed and "fixed" in fixed.describe()
    assert "not bracketed" in LearningRate(1e-2, [1e-3, 1e-2]).describe()


def test_step_doubling_converges_only_when_every_seed_moves_less_than_the_tolerance():
    assert _doubling([1.50, 1.52], [1.495, 1.515]).converged
    assert not _doubling([1.50, 1.52], [1.495, 1.40]).converged  # seed 1 still falling
    assert not _doubling([0.5], [0.9]).converged  # a rising metric (accuracy) moves too
    assert not _doubling([1.5], [1.7]).converged  # as does a loss that rises (overfitting)
    assert _doubling([0.9], [0.905]).converged
    assert not _doubling([1.5], [float("nan")]).converged
    assert not Doubling(100, [1.5, 1.5], [1.5], 0.01, seeds=[0, 1]).converged  # a seed missing


def test_a_criterion_met_at_an_edge_rate_or_before_convergence_is_not_passed():
    good_lr, edge_lr = LearningRate(3e-3, [1e-3, 3e-3, 1e-2]), LearningRate(1e-2, [3e-3, 1e-2])
    flat, falling = _doubling([0.5], [0.505]), _doubling([0.5], [0.3])
    assert _arm("a", good_lr, flat).passed
    assert _arm("a", edge_lr, flat).met and not _arm("a", edge_lr, flat).passed
    assert not _arm("a", good_lr, falling).passed
    verdict, reason = gate("held", "a wins", [_arm("a", good_lr, falling)])
    assert verdict == "inconclusive" and "not converged" in reason and "a wins" in reason


def test_the_gate_covers_every_compared_arm():
    lr, flat = LearningRate(3e-3, [1e-3, 3e-3, 1e-2]), _doubling([0.5], [0.5])
    gated, bare = _arm("winner", lr, flat), _arm("loser", None, None)
    assert ungated(["winner", "loser", "missing"], [gated, bare]) == [
        "loser (no learning-rate sweep with step doubling)",
        "missing (no competence criterion)",
    ]
    verdict, reason = gate("held", "winner wins", [gated, bare], arms=["winner", "loser"])
    assert verdict == "inconclusive" and "loser" in reason and "winner wins" in reason
    assert gate("held", "w", [gated], arms=["winner"]) == ("held", "w")
    # the full rule is for full-size runs; a quick run keeps the thresholds and one seed
    quick = gated_fields("held", "w", [gated, bare], [0], quick=True, arms=["winner", "loser"])
    assert quick["verdict"] == "held" and quick["arms"] == ["winner", "loser"]
    full = gated_fields(
        "held", "w", [gated, bare], [0, 1, 2], quick=False, arms=["winner", "loser"]
    )
    assert full["verdict"] == "inconclusive"


def test_verdict_words_have_one_meaning_each():
    assert "no effect resolved" in VERDICTS and len(set(VERDICTS)) == 5
    assert resolved([0.1, 0.2], [0.3, 0.4]) and not resolved([0.1, 0.3], [0.25, 0.4])
    text = index_text(DOCS)
    for word in VERDICTS:
        assert f"**{word}**" in text  # the index defines every word it may use


def test_the_index_counts_the_reports_by_verdict_and_staleness():
    from attnlab.lab.kit.index import tally

    reports = [{"verdict": "held"}, {"verdict": "inconclusive", "_stale": "x"},
               {"verdict": "held"}, {"verdict": "mixed"}]  # fmt: skip
    assert tally(reports) == (
        "**4 reports:** 2 held, 1 mixed, 1 inconclusive; 1 of them stale (a record until rerun)."
    )
    assert tally(reports[:1]) == "**1 report:** 1 held."
    line = next(x for x in index_text(DOCS).splitlines() if x.endswith(("rerun).", ".")) and
                x.startswith("**") and "reports:**" in x)  # fmt: skip
    counts = line.split(":** ")[1].split(";")[0].rstrip(".").split(", ")
    n = int(line[2:].split(" ")[0])
    assert sum(int(c.split(" ")[0]) for c in counts) == n == len(read_reports(DOCS))


def test_report_round_trips_the_gate_evidence_through_json():
    c = _arm("a", LearningRate(3e-3, [1e-3, 3e-3, 1e-2]), _doubling([0.5], [0.5]))
    report = _report("held", [c])
    again = Report(**{k: v for k, v in json.loads(report.to_json()).items()})
    assert again.competence[0].lr.bracketed and again.competence[0].doubling.converged
    assert "| lr 0.003 of {0.001, 0.003, 0.01} |" in report.to_markdown()


# -- provenance: code hashes and staleness -------------------------------------------------------


def test_the_behaviour_hash_ignores_wording_and_typing_but_not_code():
    typed = (
        '"""Module doc."""\nfrom typing import cast\n\n\ndef f(x: int) -> int:\n'
        '    """Doc."""\n    assert x > 0  # why\n    y: int = cast(int, x)\n    return y * 2\n'
    )
    plain = "from typing import cast\n\n\ndef f(x):\n    y = x\n    return y * 2\n"
    changed = "from typing import cast\n\n\ndef f(x):\n    y = x\n    return y * 3\n"
    assert behaviour_tree(typed) == behaviour_tree(plain)
    assert behaviour_tree(plain) != behaviour_tree(changed)


def test_an_experiment_hash_covers_its_module_and_the_code_it_uses():
    modules = reached_modules("attnlab.lab.experiments.order")
    assert "attnlab.lab.experiments.order" in modules
    assert {"attnlab.lab.kit.report", "attnlab.lab.kit.fit", "attnlab.nn.attention"} <= set(modules)
    # build_model imports its model families by name, on demand: they count
    assert {"attnlab.models.build", "attnlab.models.encoder"} <= set(modules)
    # another experiment (named by the registry to discover it) and code order never uses do not
    others = [m for m in modules if m.startswith("attnlab.lab.experiments.")]
    assert others == ["attnlab.lab.experiments.order"]
    assert not {"attnlab.interop.gemma", "attnlab.train.loop", "attnlab.cli"} & set(modules)
    assert (
        code_hash("attnlab.lab.experiments.order").digest
        != code_hash("attnlab.lab.experiments.heads").digest
    )


def test_a_name_from_a_package_uses_the_module_that_defines_it():
    import ast

    def used(source: str, name: str = "attnlab.lab.kit.example") -> set[str]:
        return uses(name, ast.parse(source), is_package=False)

    assert used("from attnlab.models import build_model") == {"attnlab.models.build"}
    assert used("from attnlab.models import lm") == {"attnlab.models.lm"}  # a submodule
    assert used("import attnlab.nn.masks") == {"attnlab.nn.masks"}
    assert used("from . import charts") == {"attnlab.lab.kit.charts"}  # relative
    assert used("def f():\n    from attnlab.config import ModelConfig") == {"attnlab.config"}
    assert used("M = 'attnlab.models.rnn_lm'") == {"attnlab.models.rnn_lm"}
    assert "attnlab.bench.runner" in used("m = f'attnlab.bench.{name}'")
    assert used("x = 'attnlab is a library'") == set()


def test_staleness_names_why():
    assert staleness({"code_hash": "abc"}, "abc") == ""
    assert "rerun" in staleness({"code_hash": "abc"}, "def")
    assert "before code hashes" in staleness({}, "def")
    assert "registered" in staleness({"code_hash": "abc"}, None)


def test_the_committed_index_marks_every_stale_report():
    """A code change comes with its rerun, or with `attnlab experiment --index`, which marks the
    report stale in the index: either way the committed index is the index of today's code."""
    committed = (DOCS / INDEX_FILE).read_text(encoding="utf-8")
    assert committed == index_text(DOCS), (
        "docs/experiments/README.md is not the index of today's code (a report's code changed, "
        "or a report was added): rerun the experiment, or run `attnlab experiment --index` to "
        "mark it stale"
    )


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.parent.name)
def test_a_report_folder_holds_only_what_its_run_wrote(path):
    """Every file beside a report is one its run wrote, unchanged since (its outputs manifest
    names it with its SHA-256), or the lab's own bookkeeping (``.attnlab-*``): no figure or note
    of an older run sits among today's."""
    folder = path.parent
    assert not_ours(folder) == [], f"{folder.name}: files no run wrote (or edited since)"
    missing = sorted(set(recorded(folder)) - set(files_in(folder)))
    assert missing == [], f"{folder.name}: files its manifest lists are gone"


def _current_reports() -> list[Path]:
    experiments = discover()
    current = []
    for path in REPORTS:
        data = json.loads(path.read_text(encoding="utf-8"))
        exp = experiments.get(data.get("name", path.parent.name))
        if exp and data.get("code_hash") == code_hash(exp.run.__module__).digest:
            current.append(path)
    return current


def test_current_reports_meet_the_full_rule():
    """Every committed report whose code is current is re-judged under the full rule."""
    for path in _current_reports():
        data = json.loads(path.read_text(encoding="utf-8"))
        report = Report(**data)  # re-derives met / bracketed / converged / passed
        name = path.parent.name
        if report.verdict == "inconclusive":
            continue  # it says why; nothing to re-judge
        trained = report.arms or [c.arm for c in report.competence if c.in_verdict]
        assert not ungated(trained, report.competence), (
            f"{name}: {ungated(trained, report.competence)}"
        )
        assert all(c.passed for c in report.competence if c.in_verdict), name
        assert report.thresholds, f"{name}: no thresholds quoted with their source"


def test_the_sweep_extends_its_grid_until_the_choice_is_bracketed():
    from attnlab.lab.kit.gating import bracketed_sweep, train_gated

    def loss(lr):  # validation loss, best at 0.03: beyond the starting grid's top edge
        return abs(math.log(lr / 0.03))

    sweep = bracketed_sweep(lambda lr: lr, [1e-3, 3e-3], loss, chosen_on="toy", max_extra=3)
    assert sweep.learning_rate().bracketed and math.isclose(sweep.chosen, 0.027)
    assert len(sweep.runs) == 5  # + 9e-3, 2.7e-2, 8.1e-2
    diverged = bracketed_sweep(lambda lr: lr, [1.0, 3.0], lambda r: math.nan, chosen_on="toy")
    assert diverged.chosen < 1.0 and not diverged.learning_rate().bracketed  # tried lower
    # the batched form: every arm's grid in one call, extensions only where needed
    runs = train_gated(_toy_job, ["a", "b"], lambda a, lr, steps, seed: (a, lr, steps, seed),
                       lambda r: r, grid=[1e-3, 3e-3, 1e-2], steps=10, seeds=[0, 1, 2],
                       higher_is_better=False, workers=1, chosen_on="toy")  # fmt: skip
    assert runs.lr["a"].chosen == 3e-3 and runs.lr["a"].grid == [1e-3, 3e-3, 1e-2]
    assert runs.lr["b"].bracketed and runs.lr["b"].chosen > 1e-2  # b's best lay past the edge
    assert len(runs.per["a"]) == 3 and runs.double["a"] == _toy_job(("a", 3e-3, 20, 0))
    assert runs.doubling("a", lambda r: r, 0.01, "toy loss").steps == 10


def _toy_job(job):
    arm, lr, steps, seed = job
    best = 3e-3 if arm == "a" else 0.05
    return abs(math.log(lr / best)) + 1.0 / steps
