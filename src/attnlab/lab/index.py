"""The index of committed experiment reports: ``docs/experiments/README.md``.

Built from every ``*/report.json`` under the docs directory, so it always lists what is actually
there: the experiment, its verdict with the one-sentence reason, the wall time and the command.
The runner rewrites it after every default full-size run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnlab.lab.report import DATA_FILE, format_cell
from attnlab.train.atomic import atomic_write_text

INDEX_FILE = "README.md"


def read_reports(root: str | os.PathLike) -> list[dict]:
    """The full-size report.json files under ``root``, sorted by experiment name."""
    reports = []
    for path in sorted(Path(root).glob(f"*/{DATA_FILE}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a half-written or foreign file is not a report
        if isinstance(data, dict) and not data.get("quick", True):
            data["_dir"] = path.parent.name
            reports.append(data)
    return reports


def render_index(reports: list[dict]) -> str:
    lines = [
        "# Experiments",
        "",
        "Each experiment tests a claim of the lecture notes on a CPU in minutes. The reports below "
        "come from full-size runs (`attnlab experiment NAME`); rerun one with its command, or a "
        "CI-sized version with `--quick`. `attnlab experiment --list` lists them all.",
        "",
        "A verdict is drawn only when every arm passed its competence criterion on its own "
        "training distribution (the *competence* column); otherwise it reads **inconclusive**. "
        "*Seeds* is how many seeds each headline number comes from (the reports give mean and "
        "min-max).",
        "",
        "| experiment | notes | verdict | competence | seeds | why | wall time | command |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        link = f"[{r.get('title', r['_dir'])}]({r['_dir']}/README.md)"
        cells = [link, r.get("source", ""), f"**{r.get('verdict', '?')}**",
                 competence_cell(r.get("competence")), str(len(r.get("seeds") or [r.get("seed")])),
                 r.get("verdict_reason", ""), f"{float(r.get('wall_time_s', 0)):.0f} s",
                 f"`{r.get('command', '')}`"]  # fmt: skip
        lines.append("| " + " | ".join(format_cell(c) if i else c for i, c in enumerate(cells))
                     + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def competence_cell(competence: list[dict] | None) -> str:
    """'all N arms pass', 'missed: a, b' or 'not stated' (a report from before the gate)."""
    if competence is None:
        return "not stated"
    if not competence:
        return "no trained arms"
    failed = [c["arm"] for c in competence if c.get("in_verdict", True) and not c.get("passed")]
    if failed:
        return (
            f"missed: {', '.join(failed)} ({len(competence) - len(failed)}/{len(competence)} pass)"
        )
    return f"all {len(competence)} arms pass"


def write_index(root: str | os.PathLike) -> Path:
    """Rewrite ``root/README.md`` from the reports found under ``root``."""
    return atomic_write_text(Path(root) / INDEX_FILE, render_index(read_reports(root)))
