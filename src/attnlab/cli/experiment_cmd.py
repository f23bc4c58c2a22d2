"""``attnlab experiment``: run one of the lab's experiments and write its report.

attnlab experiment --list
attnlab experiment order                  # full size, writes docs/experiments/order/
attnlab experiment order --quick          # CI-sized, writes a temporary directory
attnlab experiment scaling --out runs/scaling --seed 1
attnlab experiment char_lm --data ~/datasets     # its tinyshakespeare.txt (or any .txt file)
attnlab experiment --index                # rewrite docs/experiments/README.md (stale marks)
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from collections.abc import Callable
from pathlib import Path

from attnlab.cli.outputs import outputs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="run an experiment that tests a claim of the notes and write its report",
        description="Train what the experiment needs, write OUT/README.md (results table, "
        "figures, verdict) and OUT/report.json. See --list for the experiments.",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="the experiment to run (see --list)")
    p.add_argument(
        "--list",
        action="store_true",
        help="list the experiments and their claims (with NAME: that one only)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a CI-sized run in seconds (default output: a temporary directory)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="report directory (default: docs/experiments/NAME for full runs)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--data",
        metavar="DIR",
        default=os.environ.get("ATTNLAB_DATA") or None,
        help="folder of real datasets (tinyshakespeare.txt, multi30k/); default $ATTNLAB_DATA; "
        "without it the text experiments train on generated text",
    )
    p.add_argument(
        "--index",
        action="store_true",
        help="rewrite the index of the committed reports (docs/experiments in an attnlab "
        "checkout), marking those whose code changed since they ran as stale (runs nothing)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.lab import discover, run_experiment

    if args.list:
        found = discover()
        if args.name and args.name not in found:
            raise ValueError(f"no experiment {args.name!r}; choose one of {', '.join(found)}")
        for name, exp in found.items():
            if args.name and name != args.name:
                continue
            print(f"{name:14s} {exp.notes}")
            print(
                textwrap.fill(
                    exp.claim, width=96, initial_indent=" " * 15, subsequent_indent=" " * 15
                )
            )
        return 0
    if args.index:
        from attnlab.lab.kit.index import write_index
        from attnlab.lab.kit.runner import DOCS_DIR

        if not DOCS_DIR.is_dir():
            raise ValueError(
                f"no {DOCS_DIR}/ here: run `attnlab experiment --index` from the root of an "
                "attnlab checkout (where the committed reports are)"
            )
        print(f"wrote {write_index(DOCS_DIR)}")
        return 0
    if not args.name:
        raise ValueError(
            "name an experiment to run, e.g. `attnlab experiment order --quick`, "
            "or list them with `attnlab experiment --list`"
        )
    if args.seed < 0:
        raise ValueError(f"--seed must be a non-negative integer, got {args.seed}")
    from attnlab.lab.kit.runner import default_out_dir

    if args.out is None and args.quick:  # a fresh temporary directory: nothing to protect
        report, path = run_experiment(args.name, quick=True, seed=args.seed, data=args.data)
    else:
        out = Path(args.out) if args.out else default_out_dir(args.name, False)
        with outputs(out, f"attnlab experiment {args.name}", earlier_ours=_report_of(args.name)):
            report, path = run_experiment(
                args.name, quick=args.quick, out_dir=args.out, seed=args.seed, data=args.data
            )
    print(f"{report.title}\nverdict: {report.verdict}. {report.verdict_reason}")
    print(f"wrote {path} ({report.wall_time_s:.1f} s)")
    return 0


def _report_of(name: str) -> Callable[[Path], bool]:
    """Whether a directory holds an earlier report of experiment ``name`` (written before the
    outputs manifest existed, e.g. the committed docs/experiments/NAME/)."""

    def check(root: Path) -> bool:
        try:
            data = json.loads((root / "report.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("name") == name

    return check
