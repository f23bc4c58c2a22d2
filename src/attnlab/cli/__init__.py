"""The ``attnlab`` command: argparse subcommands mapped to plain library functions.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module adds a
parser and sets ``func`` to a function taking the parsed ``argparse.Namespace`` and returning an
exit code. This file only dispatches and turns errors into one-paragraph messages.

Every command module is imported to build the parser, so a command imports the packages it runs
(``bench``, ``explore``, ``lab``, ``train``, ``viz``, ``interop``) inside its functions: one
command does not pay for another's matplotlib, starlette or training stack.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import textwrap
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnlab.cli.flags import flag_hint
from attnlab.errors import CheckpointError, UserError, blamed_fields

# Subcommand modules, in the order --help lists them. A module that is missing is skipped.
SUBCOMMANDS = (
    "demo",
    "train",
    "evaluate",
    "generate",
    "plot",
    "explore",
    "bench",
    "experiment",
    "export",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnlab",
        description="Self-attention and Transformers from first principles: train, evaluate, "
        "generate, plot, benchmark and run the notes' experiments.",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"attnlab.cli.{name}_cmd")
        except ModuleNotFoundError as err:
            if err.name == f"attnlab.cli.{name}_cmd":
                continue
            raise
        module.register(sub)
    _debug_everywhere(parser)
    return parser


DEBUG_HELP = "show full tracebacks on errors"


def _debug_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--debug`` also after the subcommand (``attnlab train ... --debug``): every subparser
    takes it, leaving the value alone when absent (``SUPPRESS``) so the top-level flag counts."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                if "--debug" not in child._option_string_actions:
                    child.add_argument(
                        "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
                    )
                _debug_everywhere(child)


# Options that name files or directories: ``~`` and ``$VARS`` expand in them (also when the shell
# did not, e.g. ``--out=~/runs/x`` or a quoted "$SCRATCH/data").
PATH_OPTIONS = (
    "checkpoint",
    "init_from",
    "path",
    "out",
    "text",
    "pairs",
    "labels",
    "src_file",
    "tgt_file",
    "source_file",
    "val_data",
    "config",
    "dump_config",
    "run",
    "from_json",
    "notes",
    "report",
)


def expand_paths(args: argparse.Namespace) -> argparse.Namespace:
    """``~`` and environment variables expanded in every path option of ``args``."""
    for name in PATH_OPTIONS:
        value = getattr(args, name, None)
        if isinstance(value, str):
            setattr(args, name, os.path.expandvars(os.path.expanduser(value)))
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the command of ``argv`` (default: the process's own arguments); its exit code.

    As the program itself (console script, ``python -m attnlab``: no ``argv``) it freezes the
    garbage collector twice: after the imports, whose objects live as long as the process, so
    that the collector's full passes during the command skip them (1-4 s over a CPU training
    run, most of it while torch._dynamo is imported); and before returning, so that Python's
    exit skips a last pass over every object torch made (1-2 s).
    """
    program = argv is None
    code = _main(argv, program)
    if program:
        gc.freeze()
    return code


def _main(argv: list[str] | None, program: bool = False) -> int:
    try:  # the subcommands import torch: a Ctrl-C may come before any command runs
        parser = build_parser()
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    if program:
        gc.freeze()
    args = expand_paths(parser.parse_args(argv))
    args.program = program  # the process's own command line: the process's start is the command's
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        with plain_warnings(args.command):
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except (UserError, ValueError, TypeError, FileNotFoundError, PermissionError, OSError) as err:
        if args.debug:
            raise
        rank, world = os.environ.get("RANK", "0"), int(os.environ.get("WORLD_SIZE", "1") or 1)
        if rank == "0":  # under torchrun every process meets the error: say it once
            print(format_error(err, args.command), file=sys.stderr)
            if world > 1:
                print(
                    "  (torchrun's ChildFailedError report below is about this error; check "
                    "flags without torchrun first: attnlab train ... --dump-config run.toml)",
                    file=sys.stderr,
                )
        return getattr(err, "exit_code", 2)


def local_model_path(path: str, *, revision: str | None = None) -> Path:
    """The local directory or file ``path`` names (a hub id fetched into the cache). A local
    path that does not exist is an error here, in the user's spelling and with the forms a
    command accepts."""
    from attnlab.interop.hub import resolve_model_path

    local = resolve_model_path(path, revision=revision)
    if not local.exists():
        raise CheckpointError(
            f"no checkpoint at {path!r}: the path does not exist; pass a run directory (with "
            "checkpoints/ inside), a checkpoint directory, a Hugging Face model directory or a "
            "hub id"
        )
    return local


def load_checkpoint_lazily(path: str, *, revision: str | None = None, device: str = "cpu"):
    """``attnlab.interop.load_checkpoint``, imported only when a command needs it:
    ``path`` is a run or checkpoint directory, a Hugging Face model directory or a hub id (at
    ``revision``), loaded onto ``device`` ("auto", "cpu", "cuda", ...)."""
    from attnlab.train.distributed import resolve_device

    local = local_model_path(path, revision=revision)
    try:
        from attnlab.interop.loading import load_checkpoint
    except ModuleNotFoundError as err:
        if err.name and err.name.startswith("attnlab"):
            raise UserError(
                "checkpoint loading (attnlab.interop.loading) is not available in "
                "this installation; reinstall attnlab"
            ) from None
        raise
    return load_checkpoint(local, map_location=resolve_device(device))


@contextmanager
def plain_warnings(command: str | None = None) -> Iterator[None]:
    """Library warnings (a resume fallback, changed settings, a cropped prompt) as one plain
    ``attnlab: warning: ...`` line on stderr, without Python's file and line, with the flags of
    ``command`` that set the fields it names."""

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001
        hint = flag_hint(blamed_fields(message), command) if isinstance(message, Warning) else ""
        print(
            f"attnlab: warning: {message}{' ' + hint if hint else ''}", file=sys.stderr, flush=True
        )

    with warnings.catch_warnings():  # restores the filters and showwarning on exit
        warnings.simplefilter("always", UserWarning)
        warnings.showwarning = show
        yield


def format_error(err: BaseException, command: str | None = None) -> str:
    """One readable paragraph: what went wrong, from the error's own message, and the flags
    of ``command`` that set the fields it names (the library's messages name fields, not
    flags; :mod:`attnlab.cli.flags` holds the table)."""
    kind = "error" if isinstance(err, UserError) else type(err).__name__
    text = str(err) or repr(err)
    hint = flag_hint(blamed_fields(err), command)
    if hint:
        text = f"{text} {hint}"
    body = textwrap.fill(
        f"attnlab: {kind}: {text}",
        width=100,
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    return body + "\n  (run with --debug for the full traceback)"
