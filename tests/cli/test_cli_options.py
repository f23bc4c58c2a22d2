"""Options every command shares: --debug before or after the subcommand, --device and --revision
wherever a model runs, --help that points at the documentation online (a pip install has no docs/),
and the run logs: metrics.csv beside metrics.jsonl, plain progress lines outside a terminal,
Weights & Biases in offline mode."""

from __future__ import annotations

import csv
import json
import re

import pytest

from attnlab.cli import build_parser, main
from attnlab.train import RunConfig, TrainConfig, train
from attnlab.train.report import ProgressLines
from tiny_configs import tiny_config

MODEL_COMMANDS = (
    ["generate"],
    ["evaluate"],
    ["plot", "attention"],
    ["export"],
    ["explore"],
)


def subparser(parser, *names):
    for name in names:
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("command", MODEL_COMMANDS, ids=" ".join)
def test_every_command_that_runs_a_model_takes_device_and_revision(command):
    options = subparser(build_parser(), *command)._option_string_actions
    assert "--device" in options and "--revision" in options and "--debug" in options


def test_debug_is_accepted_after_the_subcommand(tmp_path, capsys):
    argv = ["generate", "--checkpoint", str(tmp_path / "none"), "--prompt", "a"]
    assert main(argv) == 2
    assert "run with --debug" in capsys.readouterr().err
    for where in (["--debug", *argv], [*argv, "--debug"]):
        with pytest.raises(Exception, match="no checkpoint at"):
            main(where)
    args = build_parser().parse_args(
        ["plot", "attention", "--checkpoint", "x", "--input", "a", "--out", "p"]
    )
    assert args.debug is False  # absent after the subcommand: the top-level default stands


def all_help(parser) -> str:
    """Every description and help text, unwrapped (argparse's wrapping splits URLs)."""
    text = f"{parser.description or ''} {parser.epilog or ''}"
    for action in parser._actions:
        text += f" {action.help or ''}"
        if action.__class__.__name__ == "_SubParsersAction":
            for child in action.choices.values():
                text += all_help(child)
    return text


def test_help_never_points_at_repository_files():
    text = all_help(build_parser())
    local = re.findall(r"(?<!blob/main/)\b(?:docs|benchmarks)/[\w./-]*\.md", text)
    assert not local, local
    assert "https://github.com/attnlab/attnlab/blob/main/docs/fast.md" in text


def test_every_command_that_loads_a_model_names_every_model_type_the_importers_read():
    """The lists come from the importers and the family registry: a family added there shows
    in --help without anyone editing a help string."""
    from attnlab.interop.family import REGISTRY
    from attnlab.interop.pretrained import MODEL_TYPES

    parser = build_parser()
    subcommands = next(a for a in parser._actions if getattr(a, "choices", None)).choices
    for name in ("generate", "evaluate", "export", "explore"):
        text = " ".join(subcommands[name].format_help().split())
        assert f"model_type {', '.join(MODEL_TYPES)}" in text, name
    export = " ".join(subcommands["export"].format_help().split())
    assert all(family.name in export for family in REGISTRY.values())
    assert "(default: hf)" in export


def test_paths_expand_home_and_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RUNS", str(tmp_path / "runs"))
    from attnlab.cli import expand_paths

    args = build_parser().parse_args(["export", "--checkpoint", "~/x", "--out", "$RUNS/y"])
    expand_paths(args)
    assert args.checkpoint == str(tmp_path / "x") and args.out == str(tmp_path / "runs" / "y")


def tiny_run(tmp_path, **train_settings) -> RunConfig:
    settings = dict(task="seq2seq", data="reverse", n_train=64, n_val=8, steps=6, batch_size=8,
                    warmup_steps=1, eval_every=3, eval_batches=1, save_every=0, log_every=1,
                    out=str(tmp_path / "run"))  # fmt: skip
    return RunConfig(
        tiny_config("encoder_decoder", max_len=24), TrainConfig(**{**settings, **train_settings})
    )


def test_metrics_csv_holds_the_jsonl_records_and_survives_a_resume(tmp_path):
    run = tiny_run(tmp_path, progress=False)
    train(run, stop_at=4)
    train(run, resume=True)
    jsonl = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [r["step"] for r in jsonl] == [1, 2, 3, 4, 5, 6]
    for row, record in zip(rows, jsonl):
        for key, value in record.items():
            assert float(row[key]) == pytest.approx(value, rel=1e-12), key
    assert rows[0]["val_loss"] == "" and rows[2]["val_loss"] != ""  # evaluated at 3 and 6


def test_progress_lines_outside_a_terminal(capsys):
    bar = ProgressLines(total=40, initial=0, lines=4)
    with bar:
        for step in range(40):
            bar.set_postfix(loss=f"{1 / (step + 1):.3f}")  # the loop sets it, then updates
            bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[1] for line in lines] == ["10/40", "20/40", "30/40", "40/40"]
    assert "loss 0.050" in lines[1] and "eta" in lines[0] and "eta" not in lines[-1]
    assert not any("(at step" in line for line in lines)  # every line's loss is its own step's


def test_progress_lines_fall_on_logged_steps_and_name_an_older_loss(capsys):
    """60 steps logged every 10: a line every 3 steps would repeat one loss three times, so the
    lines fall on the logged steps; the last one, between logs, says where its loss is from."""
    bar = ProgressLines(total=65, initial=0, log_every=10)
    with bar:
        for step in range(1, 66):
            if step % 10 == 0:
                bar.set_postfix(loss=f"{1 / step:.4f}")
            bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[1] for line in lines] == [f"{s}/65" for s in (10, 20, 30, 40, 50, 60, 65)]
    assert "loss 0.0500" in lines[1] and "(at step" not in lines[1]
    assert "loss 0.0167  (at step 60)" in lines[-1]


def test_weights_and_biases_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_PROJECT", "attnlab-test")
    train(tiny_run(tmp_path, wandb=True, progress=False, steps=3, eval_every=0))
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    run_id = (tmp_path / "run" / "wandb" / "run_id").read_text()
    assert runs[0].name.endswith(run_id)
