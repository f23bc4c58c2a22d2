"""Run one experiment: seed, time, record the machine, write the report.

Default output directories: a full-size run writes ``docs/experiments/NAME/`` (the committed
results, relative to the working directory) and refreshes the index ``docs/experiments/README.md``;
a ``--quick`` run writes a fresh temporary directory, so it never replaces the full-size report.
A full-size run of an experiment that resumes across pieces reports the wall time of all its
pieces (:mod:`attnlab.lab.kit.pieces`).
"""

from __future__ import annotations

import json
import os
import random
import shlex
import tempfile
import time
from pathlib import Path

import torch

from attnlab.checkpoint.atomic import ensure_writable_dir
from attnlab.errors import UserError
from attnlab.lab.kit.index import write_index
from attnlab.lab.kit.pieces import Pieces, describe
from attnlab.lab.kit.provenance import code_hash
from attnlab.lab.kit.registry import get_experiment
from attnlab.lab.kit.report import DATA_FILE, Report, check_may_write, machine_info

DOCS_DIR = Path("docs") / "experiments"


def default_out_dir(name: str, quick: bool) -> Path:
    """``docs/experiments/NAME`` for full runs, a new temporary directory for quick ones."""
    if quick:
        return Path(tempfile.mkdtemp(prefix=f"attnlab-{name}-quick-"))
    return DOCS_DIR / name


def command_line(
    name: str, quick: bool, seed: int, out_dir: Path | None, data: str | os.PathLike | None = None
) -> str:
    """The ``attnlab experiment`` command that reproduces a run."""
    parts = ["attnlab", "experiment", name]
    if quick:
        parts.append("--quick")
    parts += ["--seed", str(seed)]
    if data is not None:
        parts += ["--data", str(data)]
    if out_dir is not None:
        parts += ["--out", str(out_dir)]
    return shlex.join(parts)


def check_same_data(out: Path, data: str | os.PathLike | None) -> None:
    """A full-size run without a data folder must not replace a full-size report made on real
    data (its command names ``--data``): without one, an experiment trains on its generated
    stand-in (a play-like text, synthetic sentence pairs), and its report would silently answer
    on other data than the one it replaces."""
    try:
        before = json.loads((out / DATA_FILE).read_text(encoding="utf-8"))
        args = shlex.split(str(before.get("command", "")))
        quick = bool(before.get("quick", True))
    except (OSError, ValueError, AttributeError):
        return  # no readable report: nothing to protect
    if data is not None or quick or "--data" not in args[:-1]:
        return
    folder = args[args.index("--data") + 1]
    raise UserError(
        f"{str(out)!r} holds a full-size report made on the data in {folder!r} (its command: "
        f"{shlex.join(args)}); this run has no data folder, so it would train on the generated "
        "stand-in and replace that report. Give the data folder (or set ATTNLAB_DATA), or "
        "another out directory",
        fields=("data", "out"),
    )


def run_experiment(
    name: str,
    *,
    quick: bool = False,
    out_dir: str | os.PathLike | None = None,
    seed: int = 0,
    data: str | os.PathLike | None = None,
) -> tuple[Report, Path]:
    """Run experiment ``name`` and write its report; returns (report, path of README.md).
    ``data`` is the folder of real datasets (:mod:`attnlab.lab.kit.datasets`), or None."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative integer")
    exp = get_experiment(name)
    given = Path(out_dir) if out_dir is not None else None
    out = given if given is not None else default_out_dir(name, quick)
    check_may_write(out, quick)  # before minutes of training, not after
    if not quick:
        check_same_data(out, data)
    ensure_writable_dir(out)
    code = code_hash(exp.run.__module__)  # the code about to run, hashed before it runs
    pieces = Pieces.of(out, code, quick)  # a resumable run's earlier pieces, if any
    random.seed(seed)
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    start = time.perf_counter()
    try:
        report = exp.run(quick, out, seed, Path(data).expanduser() if data is not None else None)
        machine = machine_info()  # after the run: records the thread count it used
    except BaseException:  # interrupted (a piece of a run made in pieces) or failed
        if pieces is not None:
            pieces.record(time.perf_counter() - start)
        raise
    finally:
        torch.set_num_threads(threads)  # experiments may vary the thread count
    if not isinstance(report, Report):
        raise TypeError(f"experiment {name!r} returned {type(report).__name__}, not a Report")
    report.wall_time_s = time.perf_counter() - start
    report.quick, report.seed, report.machine = quick, seed, machine
    every = pieces.every(report.wall_time_s) if pieces is not None else []
    if len(every) > 1:  # the whole run's wall time, not the last piece's
        machine["pieces"] = every
        report.wall_time_s = sum(p["seconds"] for p in every)
        report.setup.append(describe(every))
    report.command = command_line(name, quick, seed, given, data)
    report.code_hash, report.code_modules = code.digest, list(code.modules)
    readme = report.write(out)
    if pieces is not None:
        pieces.forget()
    if given is None and not quick:
        write_index(DOCS_DIR)  # the committed results' table of contents
    return report, readme
