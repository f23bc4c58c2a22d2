"""An experiment's report: the claim, the setup, result tables, figures and an honest verdict.

Every experiment returns a :class:`Report`; the runner (:mod:`attnlab.lab.runner`) fills in the
command that produced it, the wall time and the machine, then :meth:`Report.write` renders

    OUT/README.md     the human-readable report (GitHub renders it in docs/experiments/NAME/)
    OUT/report.json   the same content as data (tables, headline metrics, verdict, provenance)

next to the PNG figures the experiment saved into OUT. A quick (CI-sized) report refuses to
overwrite a full-size one, so a ``--quick`` run can never clobber the committed results.
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.errors import UserError
from attnlab.train.atomic import atomic_write_text

VERDICTS = ("held", "did not hold", "mixed")
REPORT_FILE = "README.md"
DATA_FILE = "report.json"


@dataclass
class Table:
    """A results table: one dict per row; columns are the keys in first-seen order."""

    caption: str
    rows: list[dict[str, Any]]

    def columns(self) -> list[str]:
        cols: list[str] = []
        for row in self.rows:
            cols.extend(k for k in row if k not in cols)
        return cols

    def to_markdown(self) -> str:
        cols = self.columns()
        if not cols:
            return "(no rows)"
        header = "| " + " | ".join(format_cell(c) for c in cols) + " |"
        lines = [header, "|" + "|".join("---" for _ in cols) + "|"]
        for row in self.rows:
            lines.append("| " + " | ".join(format_cell(row.get(c, "")) for c in cols) + " |")
        return "\n".join(lines)


@dataclass
class FigureRef:
    """A figure the experiment saved into the output directory (``file`` is relative to it)."""

    file: str
    caption: str


@dataclass
class Report:
    """What an experiment found, ready to render as markdown."""

    name: str
    title: str
    claim: str  # quoted from the note
    source: str  # where the claim is, e.g. "000, 'Position representations'; 004 eq. 14"
    setup: list[str]
    tables: list[Table]
    verdict: str  # one of VERDICTS
    verdict_reason: str  # one honest sentence with the numbers
    figures: list[FigureRef] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)  # headline numbers, also for tests
    quick: bool = False
    seed: int = 0
    command: str = ""
    wall_time_s: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} must be one of {list(VERDICTS)}")

    def table(self, caption: str) -> Table:
        """The table with this caption (tests and later experiments look results up by name)."""
        for t in self.tables:
            if t.caption == caption:
                return t
        raise KeyError(f"no table {caption!r}; tables are {[t.caption for t in self.tables]}")

    def to_markdown(self) -> str:
        size = "quick (CI-sized)" if self.quick else "full-size"
        out = [f"# {self.title}", ""]
        out += [f"> {line}" for line in self.claim.strip().splitlines()]
        out += [">", f"> -- {self.source}", ""]
        out += [f"**Verdict: {self.verdict}.** {self.verdict_reason}", ""]
        if self.quick:
            out += ["*This is a quick, CI-sized run: the numbers are indicative only.*", ""]
        out += ["## Setup", ""] + [f"- {s}" for s in self.setup] + [""]
        out += ["## Results", ""]
        for t in self.tables:
            out += [f"**{t.caption}**", "", t.to_markdown(), ""]
        for f in self.figures:
            out += [f"![{f.caption}]({f.file})", "", f"*{f.caption}*", ""]
        if self.findings:
            out += ["## What we saw", ""] + [f"- {s}" for s in self.findings] + [""]
        m = self.machine
        out += ["## Reproduce", "", "```", self.command, "```", ""]
        out += [
            f"{size} run, seed {self.seed}, wall time {self.wall_time_s:.1f} s on "
            f"{m.get('logical_cores', '?')} logical cores ({m.get('cpu_model', '?')}), "
            f"{m.get('threads', '?')} torch thread{'' if m.get('threads') == 1 else 's'}, "
            f"torch {m.get('torch', '?')}, "
            f"Python {m.get('python', '?')}.{_load_note(m)}",
            "",
        ]
        return "\n".join(out)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=_json_default, allow_nan=True)

    def write(self, out_dir: str | os.PathLike) -> Path:
        """Write README.md and report.json into ``out_dir``; returns the README path."""
        out = Path(out_dir)
        check_may_write(out, self.quick)
        atomic_write_text(out / DATA_FILE, self.to_json())
        return atomic_write_text(out / REPORT_FILE, self.to_markdown())


def check_may_write(out: Path, quick: bool) -> None:
    """A quick run must not replace a full-size report (the committed results)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file; give a directory for the report")
    data = out / DATA_FILE
    if not quick or not data.is_file():
        return
    try:
        previous_quick = bool(json.loads(data.read_text(encoding="utf-8")).get("quick", True))
    except (OSError, ValueError, AttributeError):
        return  # unreadable: not a report we need to protect
    if not previous_quick:
        raise UserError(
            f"{str(out)!r} holds a full-size report; a --quick run will not overwrite it. "
            "Pass another --out directory (or omit --out to use a temporary one)"
        )


def machine_info() -> dict[str, Any]:
    """Where the numbers come from: CPU model, logical cores, torch threads and versions."""
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": _load_average(),
    }


def _load_note(machine: dict[str, Any]) -> str:
    load, cores = machine.get("load_average"), machine.get("logical_cores")
    if not load or not cores:
        return ""
    note = f" Load average at the end: {', '.join(f'{x:g}' for x in load)}"
    if load[0] > cores:
        return (
            note + " (above the core count: other processes shared the CPU, so times are inflated)."
        )
    return note + "."


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def format_cell(value: Any) -> str:
    """Markdown cell text: floats to 4 significant digits, NaN shown as 'nan', pipes escaped."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot store {type(obj).__name__} in report.json")
