"""The README's main job end to end, plain vs ``--fast``, and optionally an older source tree.

    python benchmarks/main_job_ab.py --rounds 3 --out benchmarks/main_job_ab.md
    python benchmarks/main_job_ab.py --before /path/to/old/checkout/src   # adds "before"

Each round runs ``attnlab train --preset dates`` once per contender, in a fresh process, in an
order rotated every round (so load drifts hit all alike), and reads the run's own
``time: X s of training`` line and final exact match, and the CPU seconds the process used
(user + system, from ``getrusage``): on a machine shared with other jobs, wall time swings with
their load while CPU time mostly does not, so both are reported. ``--threads 1`` keeps idle
threads from spinning into the CPU figure. Contenders:

  plain    the default model (the notes' plain forms), this tree
  fast     the same run with ``--fast`` (attnlab.fast's engine), this tree
  before   ``--before SRC``: another checkout's src/ (e.g. the commit before the engine was split
           out, when its paths were always on), run with the same command

Issue 23 item 6 asks that the main job not get slower with the engine on than it was before the
split, and that the plain path's cost be reported: this script measures both in one run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SRC = Path(__file__).resolve().parents[1] / "src"
TIME = re.compile(r"time: ([0-9.]+) s of training")
EXACT = re.compile(r"final exact match: ([0-9.]+)%")


def cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(src: Path, extra: list[str]) -> tuple[float, float, float]:
    """(seconds of training, CPU seconds, final exact match in %) of one run from ``src``."""
    cpu0 = cpu_seconds_of_children()
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "attnlab", "train", "--preset", "dates", "--out", out]
        env = {**os.environ, "PYTHONPATH": str(src)}
        text = subprocess.run(
            cmd + extra, env=env, capture_output=True, text=True, check=True
        ).stdout
    cpu = cpu_seconds_of_children() - cpu0
    seconds, exact = TIME.search(text), EXACT.search(text)
    if seconds is None or exact is None:
        raise RuntimeError(f"could not read the timing/exact match from the run's output:\n{text}")
    return float(seconds.group(1)), cpu, float(exact.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--before", type=Path, help="src/ of another checkout to compare")
    parser.add_argument("--threads", type=int, default=0, help="--threads of the runs (0: theirs)")
    parser.add_argument("--out", help="also write the table (markdown) to this file")
    args = parser.parse_args(argv)

    common = ["--threads", str(args.threads)] if args.threads else []
    contenders = {"plain": (SRC, common), "fast": (SRC, common + ["--fast"])}
    if args.before is not None:
        contenders["before"] = (args.before.resolve(), common)
    names = list(contenders)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    exact: dict[str, list[float]] = {n: [] for n in names}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            s, c, e = run_once(*contenders[name])
            seconds[name].append(s)
            cpu[name].append(c)
            exact[name].append(e)
            loads.append(os.getloadavg()[0])
            print(
                f"round {r + 1}: {name:6s} {s:7.1f} s of training, {c:7.1f} CPU s, "
                f"exact match {e:.2f}%",
                flush=True,
            )

    def cell(values: list[float], base: list[float]) -> str:
        med = statistics.median(values)
        return (
            f"{med:.1f} ({min(values):.1f}-{max(values):.1f}) | {med / statistics.median(base):.3f}"
        )

    rows = [
        "| contender | s of training, median (min-max) | vs plain | CPU s of the process, median "
        "(min-max) | vs plain | exact match % |",
        "|---|---|---|---|---|---|",
    ]
    for n in names:
        rows.append(
            f"| {n} | {cell(seconds[n], seconds['plain'])} | {cell(cpu[n], cpu['plain'])} "
            f"| {', '.join(f'{e:.2f}' for e in exact[n])} |"
        )
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"Measured {when}, torch {torch.__version__}, {args.rounds} interleaved rounds, "
        f"{os.cpu_count()} logical cores, 1-minute load average {min(loads):.1f} to "
        f"{max(loads):.1f} (sampled after each run); command: `python benchmarks/main_job_ab.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`"
    )
    table = head + "\n\n" + "\n".join(rows) + "\n"
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
