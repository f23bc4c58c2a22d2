"""The ``attnlab`` command: argparse subcommands mapped to plain library functions.

Each subcommand lives in its own module exposing ``register(subparsers)``; the module adds a
parser and sets ``func`` to a function taking the parsed ``argparse.Namespace`` and returning an
exit code. This file only dispatches and turns errors into one-paragraph messages.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from attnlab.errors import UserError

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
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"attnlab.cli.{name}_cmd")
        except ModuleNotFoundError as err:
            if err.name == f"attnlab.cli.{name}_cmd":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:  # the subcommands import torch: a Ctrl-C may come before any command runs
        parser = build_parser()
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        with plain_warnings():
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130
    except (UserError, ValueError, TypeError, FileNotFoundError, PermissionError, OSError) as err:
        if args.debug:
            raise
        rank, world = os.environ.get("RANK", "0"), int(os.environ.get("WORLD_SIZE", "1") or 1)
        if rank == "0":  # under torchrun every process meets the error: say it once
            print(format_error(err), file=sys.stderr)
            if world > 1:
                print(
                    "  (torchrun's ChildFailedError report below is about this error; check "
                    "flags without torchrun first: attnlab train ... --dump-config run.toml)",
                    file=sys.stderr,
                )
        return getattr(err, "exit_code", 2)


def load_checkpoint_lazily(path: str):
    """``attnlab.train.checkpoint.load_checkpoint``, imported only when a command needs it."""
    try:
        from attnlab.train.checkpoint import load_checkpoint
    except ModuleNotFoundError as err:
        if err.name and err.name.startswith("attnlab"):
            raise UserError(
                "checkpoint loading (attnlab.train.checkpoint) is not available in "
                "this installation; reinstall attnlab"
            ) from None
        raise
    return load_checkpoint(path)


@contextmanager
def plain_warnings() -> Iterator[None]:
    """Library warnings (a resume fallback, changed settings, a cropped prompt) as one plain
    ``attnlab: warning: ...`` line on stderr, without Python's file and line."""

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001
        print(f"attnlab: warning: {message}", file=sys.stderr, flush=True)

    with warnings.catch_warnings():  # restores the filters and showwarning on exit
        warnings.simplefilter("always", UserWarning)
        warnings.showwarning = show
        yield


def format_error(err: BaseException) -> str:
    """One readable paragraph: what went wrong, from the error's own message."""
    kind = "error" if isinstance(err, UserError) else type(err).__name__
    text = str(err) or repr(err)
    body = textwrap.fill(
        f"attnlab: {kind}: {text}",
        width=100,
        subsequent_indent="  ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    return body + "\n  (run with --debug for the full traceback)"
