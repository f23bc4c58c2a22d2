"""The lab framework: registry, report rendering and protection, runner, fit helper, CLI."""

from __future__ import annotations

import json
import tempfile

import pytest
import torch

from attnlab.cli import main
from attnlab.config import ModelConfig
from attnlab.errors import UserError
from attnlab.lab import EXPERIMENTS, Report, Table, experiment, get_experiment, run_experiment
from attnlab.lab.kit.charts import bar_chart, save_chart
from attnlab.lab.kit.fit import FitConfig, accuracy, classification_loss, fit
from attnlab.models import build_model


def _report(quick: bool = True, **kw) -> Report:
    return Report(
        name="dummy",
        title="A dummy experiment",
        claim="Things hold.",
        source="000, 'Basics'",
        setup=["nothing trained"],
        tables=[Table("numbers", [{"a": 1, "b": 0.123456}, {"a": 2}])],
        verdict="held",
        verdict_reason="1 < 2.",
        quick=quick,
        **kw,
    )


@pytest.fixture
def dummy_experiment():
    @experiment("dummy-test", notes="000")
    def run(quick, out_dir, seed, data=None):
        """a claim
        over two lines."""
        fig = bar_chart({"x": 1.0, "y": 2.0}, ylabel="v", title="t", reference=0.5)
        report = _report(quick)
        report.figures.append(save_chart(fig, out_dir, "bars.png", "two bars"))
        report.metrics["seed_seen"] = seed
        return report

    yield "dummy-test"
    EXPERIMENTS.pop("dummy-test", None)


def test_markdown_has_claim_verdict_table_and_provenance():
    text = _report(command="attnlab experiment dummy --quick --seed 0").to_markdown()
    assert "> Things hold." in text and "000, 'Basics'" in text
    assert "**Verdict: held.** 1 < 2." in text
    assert "| a | b |" in text and "| 1 | 0.1235 |" in text and "| 2 |  |" in text
    assert "attnlab experiment dummy --quick --seed 0" in text


def test_bad_verdict_is_rejected():
    with pytest.raises(ValueError, match="verdict"):
        _report().__class__(**{**_report().__dict__, "verdict": "sort of"})


def test_run_writes_report_json_and_figure(tmp_path, dummy_experiment):
    report, path = run_experiment(dummy_experiment, quick=True, out_dir=tmp_path, seed=3)
    assert path == tmp_path / "README.md" and (tmp_path / "bars.png").stat().st_size > 1000
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["quick"] is True and data["seed"] == 3 and data["metrics"]["seed_seen"] == 3
    assert data["machine"]["torch"] == torch.__version__ and data["wall_time_s"] >= 0
    assert report.command == f"attnlab experiment dummy-test --quick --seed 3 --out {tmp_path}"
    assert "![two bars](bars.png)" in path.read_text()


def test_quick_run_never_overwrites_a_full_report(tmp_path, dummy_experiment):
    _report(quick=False).write(tmp_path)
    with pytest.raises(UserError, match="full-size report"):
        run_experiment(dummy_experiment, quick=True, out_dir=tmp_path)
    run_experiment(dummy_experiment, quick=False, out_dir=tmp_path)  # full over full is fine


def test_quick_run_defaults_to_a_temporary_directory(dummy_experiment, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _, path = run_experiment(dummy_experiment, quick=True)
    assert "attnlab-dummy-test-quick-" in str(path) and path.is_file()


def test_unknown_experiment_names_the_choices(dummy_experiment):
    with pytest.raises(
        ValueError, match="unknown experiment 'dummy-tst'.*Did you mean 'dummy-test'"
    ):
        get_experiment("dummy-tst")


def test_the_claim_is_the_run_docstring_in_one_line(dummy_experiment):
    assert get_experiment("dummy-test").claim == "a claim over two lines."
    with pytest.raises(ValueError, match="docstring stating the claim"):
        experiment("dummy-nodoc", notes="000")(lambda quick, out_dir, seed, data=None: None)

    def old(quick, out_dir, seed):
        """a claim."""

    with pytest.raises(ValueError, match=r"run\(quick, out_dir, seed, data=None\)"):
        experiment("dummy-old", notes="000")(old)


def test_cli_list_and_errors(capsys, tmp_path, dummy_experiment):
    assert main(["experiment", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "dummy-test" in listed and "a claim" in listed and "order" in listed
    assert main(["experiment", "order", "--list"]) == 0  # one experiment's entry
    one = capsys.readouterr().out
    assert one.startswith("order") and "dummy-test" not in one
    assert main(["experiment"]) == 2
    assert "name an experiment" in capsys.readouterr().err
    assert main(["experiment", "nope"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    assert main(["experiment", dummy_experiment, "--quick", "--out", str(tmp_path)]) == 0
    assert "verdict: held. 1 < 2." in capsys.readouterr().out


def test_fit_learns_a_tiny_classification_task():
    torch.manual_seed(0)
    ids = torch.randint(1, 6, (256, 4))
    labels = (ids[:, 0] > 3).long()  # the first token decides the class
    cfg = ModelConfig(kind="classifier", vocab_size=6, n_classes=2, d_model=16, n_heads=2,
                      n_layers=1, max_len=8, pooling="mean")  # fmt: skip
    model = build_model(cfg)
    result = fit(
        model,
        (ids, labels),
        classification_loss,
        FitConfig(steps=40, lr=1e-2),
        evaluate=lambda m: accuracy(m, ids, labels),
        eval_at=(5, 40),
    )
    assert len(result.losses) == 40 and not result.diverged
    assert [step for step, _ in result.evals] == [5, 40] and result.evals[-1][1] > 0.9
    assert result.final_loss(10) < result.losses[0] and accuracy(model, ids, labels) > 0.9


def test_fit_rejects_mismatched_data():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="first dim"):
        fit(model, (torch.zeros(3, 2), torch.zeros(4)), classification_loss, FitConfig(steps=1))


def test_index_lists_full_reports_only(tmp_path):
    from attnlab.lab.kit.index import write_index

    full = _report(quick=False, command="attnlab experiment dummy --seed 0")
    full.wall_time_s = 12.0
    full.write(tmp_path / "dummy")
    _report(quick=True).write(tmp_path / "quicky")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "report.json").write_text("{not json")
    text = write_index(tmp_path).read_text()
    assert "[A dummy experiment](dummy/README.md)" in text and "**held**" in text
    assert "12 s" in text and "`attnlab experiment dummy --seed 0`" in text
    assert "quicky" not in text and "broken" not in text


def test_index_counts_arms_not_criteria():
    from attnlab.lab.kit.index import competence_cell

    def crit(arm, passed, in_verdict=True, gated=True):
        evidence = {"lr": {"chosen": 1}, "doubling": {"steps": 1}} if gated else {}
        return {"arm": arm, "passed": passed, "in_verdict": in_verdict, **evidence}

    two_each = [crit("a", True), crit("a", True), crit("b", True), crit("b", False)]
    assert competence_cell(two_each) == "missed: b (1/2 pass)"  # b missed one of its two
    assert competence_cell(two_each[:3]) == "all 2 compared arms pass"
    refs = [crit("a", True), crit("r", False, False), crit("r", False, False)]
    assert competence_cell(refs) == "all 1 compared arms pass; reference arms that missed: r"
    assert competence_cell(None) == "not stated" and competence_cell([]) == "no trained arms"
    # every compared arm counts: one without a criterion, one without sweep and doubling
    cell = competence_cell([crit("a", True), crit("b", True, gated=False)], ["a", "b", "c"])
    assert cell == (
        "missed: c (2/3 pass); 2 of 3 compared arms not gated by a learning-rate sweep and "
        "step doubling: b, c"
    )
    commas = [crit("LSTM, reversed", False), crit("LSTM, as written", True), crit("x", False)]
    assert competence_cell(commas) == "missed: 'LSTM, reversed', x (1/3 pass)"


def test_index_why_groups_an_inconclusive_reports_missed_gates():
    import dataclasses

    from attnlab.lab.kit.index import why_cell
    from attnlab.lab.kit.verdict import Competence, Doubling, LearningRate, gate

    def arm(name, values, lr=0.01, moves=(1.7, 1.6)):
        doubling = Doubling(100, [moves[0]], [moves[1]], 0.05, [0], "validation loss")
        rate = LearningRate(lr, [0.003, 0.01, 0.03])
        return Competence(name, "loss at most 3", 3.0, values, False, lr=rate, doubling=doubling)

    arms = [arm("a", [1.7, 1.8]), arm("b", [1.7, 3.5], moves=(1.7, 1.69)), arm("c", [1.7], 0.03)]
    verdict, reason = gate("held", "a beats b by 0.1", arms)
    report = {
        "verdict": verdict,
        "verdict_reason": reason,
        "competence": [dataclasses.asdict(c) for c in arms],  # as report.json holds them
    }
    assert verdict == "inconclusive"
    assert why_cell(report) == (
        "no verdict: 3 arm(s) missed their gate (every criterion in the report) -- not "
        "converged (validation loss moved more than 0.05 from 100 to 200 steps): a (1.7 -> "
        "1.6), c (1.7 -> 1.6); missed loss at most 3: b (2.6 (1.7-3.5); threshold 3); "
        "learning rate at its grid's edge: c (lr 0.03 of {0.003, 0.01, 0.03} (at the grid's "
        "edge: not bracketed)). The comparison would have read: a beats b by 0.1"
    )
    assert why_cell(report) == reason  # the index reads the report's own grouping
    legacy = {
        **report,
        "verdict_reason": "no verdict: (every criterion of a missed arm). "
        + ("The comparison would have read: a beats b by 0.1"),
    }
    assert why_cell(legacy) == reason  # a report made before the grouping is regrouped
    held = {**report, "verdict": "held", "verdict_reason": "a beats b", "competence": []}
    assert why_cell(held) == "a beats b"  # any other verdict: the report's own reason


def test_cli_index_rewrites_the_index_and_needs_the_reports(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", "--index"]) == 2
    assert "from the root of an" in capsys.readouterr().err
    (tmp_path / "docs" / "experiments").mkdir(parents=True)
    assert main(["experiment", "--index"]) == 0
    index = (tmp_path / "docs" / "experiments" / "README.md").read_text(encoding="utf-8")
    assert "Not yet run at full size" in index and "| order |" in index


def test_a_run_records_the_hash_of_the_code_it_ran(tmp_path):
    from attnlab.lab.kit.provenance import code_hash

    # complexity: the experiment whose quick form runs fastest (no training)
    report, _ = run_experiment("complexity", quick=True, out_dir=tmp_path, seed=0)
    assert report.code_hash == code_hash("attnlab.lab.experiments.complexity").digest
    assert "attnlab.lab.experiments.complexity" in report.code_modules
    data = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert data["code_hash"] == report.code_hash


@pytest.fixture
def pieces_experiment(monkeypatch):
    """A full-size experiment of resumable code (its code hash reaches attnlab.lab.kit.resume)
    whose first two pieces are interrupted; the third writes the report."""
    from attnlab.lab.kit import runner
    from attnlab.lab.kit.pieces import RESUME_MODULE
    from attnlab.lab.kit.provenance import CodeHash

    pieces: list[int] = []

    @experiment("dummy-pieces", notes="000")
    def run(quick, out_dir, seed, data=None):
        """a claim made in pieces."""
        pieces.append(1)
        if len(pieces) < 3:
            raise KeyboardInterrupt  # what `timeout -s INT` brings
        return _report(quick)

    code = {"digest": "d1", "modules": (RESUME_MODULE,)}
    monkeypatch.setattr(
        runner, "code_hash", lambda module: CodeHash(code["digest"], (module, *code["modules"]))
    )
    yield code
    EXPERIMENTS.pop("dummy-pieces", None)


def test_a_run_made_in_pieces_reports_the_wall_time_of_all(tmp_path, capsys, pieces_experiment):
    from attnlab.lab.kit.index import wall_cell
    from attnlab.lab.kit.pieces import LEDGER

    out = tmp_path / "out"
    for _ in range(2):  # through the CLI: the ledger is attnlab's, never a file of the user's
        assert main(["experiment", "dummy-pieces", "--out", str(out)]) == 130
    ledger = json.loads((out / LEDGER).read_text(encoding="utf-8"))
    assert list(ledger) == ["d1"] and len(ledger["d1"]) == 2
    ledger["d1"][0]["seconds"], ledger["d1"][1]["seconds"] = 1000.0, 2000.0  # two long pieces
    ledger["d0"] = [{"started": "2026-01-01T00:00:00+00:00", "seconds": 5.0}]  # other code's
    (out / LEDGER).write_text(json.dumps(ledger), encoding="utf-8")
    assert main(["experiment", "dummy-pieces", "--out", str(out)]) == 0
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    pieces = data["machine"]["pieces"]
    assert [p["seconds"] for p in pieces[:2]] == [1000.0, 2000.0] and len(pieces) == 3
    assert data["wall_time_s"] == pytest.approx(3000.0 + pieces[2]["seconds"])
    assert data["setup"][-1].startswith("Run made in 3 pieces")
    assert "Run made in 3 pieces" in (out / "README.md").read_text(encoding="utf-8")
    assert json.loads((out / LEDGER).read_text(encoding="utf-8")) == {"d0": ledger["d0"]}
    assert wall_cell(data) == f"{data['wall_time_s']:.0f} s in 3 pieces"


def test_a_run_in_one_piece_or_of_code_that_does_not_resume_keeps_no_ledger(
    tmp_path, pieces_experiment
):
    from attnlab.lab.kit.pieces import LEDGER, RESUME_MODULE

    with pytest.raises(KeyboardInterrupt):
        run_experiment("dummy-pieces", quick=True, out_dir=tmp_path / "quick")
    assert not (tmp_path / "quick" / LEDGER).exists()  # a quick run is never made in pieces
    pieces_experiment["modules"] = ()  # code that does not resume: an interrupt loses the piece
    with pytest.raises(KeyboardInterrupt):
        run_experiment("dummy-pieces", out_dir=tmp_path)
    assert not (tmp_path / LEDGER).exists()
    pieces_experiment["modules"] = (RESUME_MODULE,)
    report, _ = run_experiment("dummy-pieces", out_dir=tmp_path)  # one piece, all of the run
    assert "pieces" not in report.machine and not (tmp_path / LEDGER).exists()
    assert not any(line.startswith("Run made in") for line in report.setup)


def test_a_full_run_without_data_never_replaces_a_report_made_on_real_data(tmp_path, capsys):
    """Without --data an experiment trains on its generated stand-in: it may not overwrite a
    full-size report whose command named a data folder (the CLI says so in one line)."""
    out = tmp_path / "order"
    out.mkdir()
    made = {"quick": False, "command": "attnlab experiment order --seed 0 --data ../shared/data"}
    (out / "report.json").write_text(json.dumps(made), encoding="utf-8")
    with pytest.raises(UserError, match="data in '../shared/data'.*Give the data folder"):
        run_experiment("order", out_dir=out)
    from attnlab.cli.outputs import record

    record(out, {})  # an earlier run's output (the CLI replaces only those)
    assert main(["experiment", "order", "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "generated stand-in" in err and "--data, --out" in err and "Traceback" not in err
    assert json.loads((out / "report.json").read_text(encoding="utf-8")) == made  # kept
