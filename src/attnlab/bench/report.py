"""Benchmark results as text: the stdout summary and benchmarks/RESULTS.md.

Both render the JSON-ready result of :func:`attnlab.bench.runner.run_bench` (per-suite tables come
from :mod:`attnlab.bench.tables`); nothing here measures. The Markdown report starts with the
command that regenerates it, describes the machine, then lists every target (met / not met and by
how much), the analysis notes, the per-suite tables and the plots.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from attnlab.bench.tables import fmt_num, md_table, suite_tables, threads


def status_text(t: dict[str, Any]) -> str:
    """'met (+12%)', 'NOT met (at 56% of target)', 'NOT met (4.9x over the limit)', ..."""
    if t["met"] is None:
        return "not measured"
    value, target = t["value"], t["target"]
    if t["higher_is_better"]:
        if t["met"]:
            return f"met (+{(value / target - 1) * 100:.0f}%)"
        return f"NOT met (at {value / target:.0%} of target)"
    if t["met"]:
        return f"met (at {value / target:.0%} of the limit)"
    return f"NOT met ({value / target:.1f}x over the limit)"


def targets_table(result: dict[str, Any]) -> list[str]:
    rows = [
        [
            t["description"],
            fmt_num(t["value"]),
            ("<= " if not t["higher_is_better"] else ">= ") + fmt_num(t["target"]),
            status_text(t) + (f"; {t['note']}" if t.get("note") else ""),
        ]
        for t in result.get("targets", [])
    ]
    return md_table(["target", "measured", "wanted", "status"], rows)


def machine_lines(result: dict[str, Any]) -> list[str]:
    m = result["machine"]
    mem = f"{m['memory_bytes'] / 2**30:.0f} GiB RAM" if m.get("memory_bytes") else ""
    return [
        f"- CPU: {m['cpu_model']} ({m['logical_cores']} logical cores, {m.get('cpu_capability')}"
        f"), {mem}; {m['platform']}",
        f"- torch {m['torch']} with **{threads(m['threads'])}**, flush denormals on; "
        f"transformers {m.get('transformers')}; Python {m['python']}",
        f"- load average (1/5/15 min) at start {m.get('load_average_start')}, at end "
        f"{m.get('load_average_end')}",
        f"- started {result['started_at']}, mode **{result['mode']}**, wall time "
        f"{result.get('wall_seconds', 0):.0f} s",
    ]


def format_text(result: dict[str, Any]) -> str:
    """The stdout summary: targets, then per-suite tables (Markdown reads fine as text)."""
    lines = [
        f"attnlab bench ({result['mode']}), {threads(result['machine']['threads'])}, "
        f"load {result['machine'].get('load_average_start')}",
        "",
    ]
    lines += targets_table(result)
    lines += suite_tables(result)
    return "\n".join(lines) + "\n"


REPORT_TITLE = "# attnlab benchmark results"  # the first line of every report: how one is told


def write_markdown(
    result: dict[str, Any], path: Path, plots: list[Path], notes: str | None = None
) -> Path:
    """Write RESULTS.md: command, machine, targets, analysis notes, tables, plots."""
    path = Path(path)
    lines = [
        REPORT_TITLE,
        "",
        "Regenerate this file (and the JSON and plots next to it) with:",
        "",
        f"    {result['command']}",
        "",
        "Every number comes from one process run; contenders are timed in interleaved "
        "rounds and the median round is reported (spread = (max - min) / median). See "
        "`benchmarks/README.md` for the method and the JSON fields.",
        "",
        "## Machine",
        "",
    ]
    lines += machine_lines(result)
    lines += ["", "## Targets (issues 6 and 22)", ""] + targets_table(result)
    if notes:
        lines += ["", "## Analysis", "", notes.strip()]
    lines += ["", "## Results"] + suite_tables(result)
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{p.stem}]({Path(os.path.relpath(p, path.parent)).as_posix()})" for p in plots]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
