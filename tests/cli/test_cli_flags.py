"""Library errors name fields; the CLI adds the flag hint from one table (attnlab.cli.flags).

A Python caller has no flags, so no message raised or warned outside ``attnlab/cli/`` names one
(a whole command quoted in backticks, e.g. `attnlab train --out runs/x`, is a command to run, not
a flag, and may stay). The fields an error blames travel in ``err.fields``; the CLI's printer
turns them into "(on the command line: --flag)".
"""

from __future__ import annotations

import argparse
import ast
import re
import warnings
from pathlib import Path

import pytest

import attnlab
from attnlab.cli import build_parser, format_error, main, plain_warnings
from attnlab.cli.flags import COMMAND_FLAGS, FIELD_FLAGS, TRAIN_FLAGS, flag_for, flag_hint
from attnlab.errors import ConfigError, ConfigValueError, FieldWarning, blamed_fields

SRC = Path(attnlab.__file__).parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
QUOTED_COMMAND = re.compile(r"`[^`]*`")  # a command to run, quoted whole: not a flag hint
# Names a message is assembled in before it is raised (``why = ...; raise X(f"... {why}")``).
MESSAGE_NAMES = {"message", "msg", "why", "problem", "hint", "fix", "reason", "advice"}


def _strings(node: ast.AST):
    """The string pieces under ``node``, in source order."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    for child in ast.iter_child_nodes(node):
        yield from _strings(child)


def _callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Call) and getattr(func.value.func, "id", "") == "super":
            return "super().__init__"
        return func.attr
    return getattr(func, "id", "")


def _messages(tree: ast.AST):
    """(line, text) of every raised, warned or error-building message in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            yield node.lineno, "".join(_strings(node.exc))
        elif isinstance(node, ast.Call):
            name = _callee(node)
            if name in ("warn", "super().__init__", "_bad") or name.endswith(
                ("Error", "Warning", "Exception")
            ):
                yield node.lineno, "".join(_strings(node))
        elif isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) in MESSAGE_NAMES for t in node.targets
        ):
            yield node.lineno, "".join(_strings(node.value))


def test_no_library_message_names_a_flag():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).parts[0] == "cli":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, text in _messages(tree):
            flags = FLAG.findall(QUOTED_COMMAND.sub("", text))
            if flags:
                found.append(f"{path.relative_to(SRC)}:{line}: {flags}")
    assert not found, "library messages name CLI flags (name the field instead):\n" + "\n".join(
        found
    )


def test_the_scan_sees_flags_in_messages_and_not_in_quoted_commands():
    """The scan itself: it finds a flag in a raised f-string, a warning and a helper's message,
    and lets a whole quoted command and docstrings pass."""
    tree = ast.parse(
        '"""Run ``attnlab train --out X``."""\n'
        "def f(n):\n"
        '    """--steps in a docstring."""\n'
        '    warnings.warn(f"lower --lr below {n}")\n'
        '    raise ConfigError(f"pass --overwrite or run `attnlab train --out {n}`")\n'
    )
    flags = [FLAG.findall(QUOTED_COMMAND.sub("", text)) for _, text in _messages(tree)]
    assert {tuple(f) for f in flags if f} == {("--lr",), ("--overwrite",)}


def _options() -> set[str]:
    """Every option string of every subcommand of ``attnlab``."""
    seen: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        seen.update(parser._option_string_actions)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)

    walk(build_parser())
    return seen


def test_every_flag_in_the_table_exists():
    options = _options()
    rows = [*FIELD_FLAGS.values(), *(f for own in COMMAND_FLAGS.values() for f in own.values())]
    named = {flag for row in rows for flag in FLAG.findall(row)}
    assert named and not named - options, f"the table names flags no command has: {named - options}"
    assert set(TRAIN_FLAGS) <= options


def test_hint_uses_the_command_and_set_for_fields_without_a_flag_of_their_own():
    assert flag_hint(["warmup_steps", "steps"]) == "(on the command line: --warmup-steps, --steps)"
    assert flag_hint(["train.steps", "steps"]) == "(on the command line: --steps)"
    assert flag_hint(["no_such_field"]) == ""
    assert flag_for("num_beams", "generate") == "--beams"
    assert flag_for("text", "plot") == "--input" and flag_for("text", "train") == "--text"
    assert flag_for("ffn_mult", "train") == "--set ffn_mult=VALUE"
    assert flag_for("ffn_mult", "generate") is None


def test_format_error_appends_the_hint_only_for_named_fields():
    err = ConfigError("num_beams=0 must be >= 1", fields=("num_beams",))
    assert "num_beams=0 must be >= 1 (on the command line: --beams)" in format_error(
        err, "generate"
    )
    assert "on the command line" not in format_error(ConfigError("no fields here"), "generate")
    assert "on the command line" not in format_error(ValueError("a plain ValueError"), "train")


def test_warnings_through_the_cli_carry_the_hint(capsys):
    with plain_warnings("train"):
        warnings.warn(FieldWarning("dtype='bf16' is slow here", fields=("dtype",)), stacklevel=1)
    err = capsys.readouterr().err
    assert "attnlab: warning: dtype='bf16' is slow here (on the command line: --dtype)" in err


# The same mistakes through Python (fields, no flags) and through the CLI (the flag added) ------
def test_warmup_longer_than_training_python_and_cli(capsys, tmp_path):
    from attnlab.train.run_config import TrainConfig

    with pytest.raises(ConfigValueError) as caught:
        TrainConfig(steps=20, warmup_steps=100)
    text = str(caught.value)
    assert "warmup_steps=100 must not exceed steps=20; lower warmup_steps (e.g. to 2)" in text
    assert "--" not in text and blamed_fields(caught.value) == ("warmup_steps", "steps")

    code = main(["train", "--preset", "dates", "--steps", "20", "--out", str(tmp_path)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "lower warmup_steps (e.g. to 2)" in err
    assert "(on the command line: --warmup-steps, --steps)" in err


@pytest.mark.parametrize(
    ("setting", "flags", "flag"),
    [
        ({"top_k": -1}, ["--top-k", "-1"], "--top-k"),
        ({"num_beams": 0}, ["--beams", "0"], "--beams"),
        (
            {"compile": True, "use_cache": False},
            ["--compile", "--no-cache"],
            "--compile, --no-cache",
        ),
    ],
)
def test_generation_settings_python_and_cli(capsys, tmp_path, setting, flags, flag):
    from attnlab.generate import GenerationConfig

    with pytest.raises(ValueError) as caught:  # still a ValueError to Python callers
        GenerationConfig(**setting)
    assert "--" not in str(caught.value) and set(caught.value.fields) >= set(setting)

    argv = ["generate", "--checkpoint", str(tmp_path / "none"), "--prompt", "a", *flags]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and str(caught.value) in " ".join(err.split())
    assert f"(on the command line: {flag})" in " ".join(err.split())


def test_a_model_field_without_a_flag_gets_the_set_hint(capsys, tmp_path):
    code = main(["train", "--task", "reverse", "--set", "ffn_mult=nan", "--out", str(tmp_path)])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and "ffn_mult=nan must be a finite number" in err
    assert "(on the command line: --set ffn_mult=VALUE)" in err


def test_export_target_python_and_cli(tmp_path):
    from attnlab.interop.export import check_export_target

    taken = tmp_path / "model.safetensors"
    taken.write_text("mine")
    with pytest.raises(ConfigError) as caught:
        check_export_target(taken, force=False)
    assert "pass force=True to replace it" in str(caught.value) and "--" not in str(caught.value)
    shown = " ".join(format_error(caught.value, "export").split())
    assert "(on the command line: --force, --out)" in shown
