"""An experiment's report: the claim, the setup, result tables, figures and an honest verdict.

Every experiment returns a :class:`Report`; the runner (:mod:`attnlab.lab.kit.runner`) fills in the
command that produced it, the wall time and the machine, then :meth:`Report.write` renders

    OUT/README.md     the human-readable report (GitHub renders it in docs/experiments/NAME/)
    OUT/report.json   the same content as data (tables, headline metrics, verdict, provenance)

next to the PNG figures the experiment saved into OUT. A quick (CI-sized) report refuses to
overwrite a full-size one, so a ``--quick`` run can never clobber the committed results.

The verdict a report carries is drawn by :mod:`attnlab.lab.kit.verdict` (the verdict words and the
competence gate); a report refuses a verdict the gate would not allow.
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

from attnlab.checkpoint.atomic import atomic_write_text
from attnlab.errors import UserError
from attnlab.lab.kit.timing import device_name, find_gpu
from attnlab.lab.kit.verdict import VERDICTS, Competence, missed
from attnlab.runtime import cpu_model, load_average

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
class Threshold:
    """A number a verdict is judged by, with the paper or note it is taken from."""

    what: str  # e.g. "share of heads removable at <= 1 BLEU loss"
    value: str  # e.g. ">= 20 % (WMT), >= 40 % (BERT)"
    source: str  # e.g. "Michel et al. 2019, Fig. 1 and section 3.2"


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
    competence: list[Competence] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)  # every seed the numbers come from
    per_seed: dict[str, Any] = field(default_factory=dict)  # headline numbers, one per seed
    arms: list[str] = field(default_factory=list)  # the compared arms (the gate covers each)
    thresholds: list[Threshold] = field(default_factory=list)  # what the verdict is judged by
    quick: bool = False
    seed: int = 0
    command: str = ""
    wall_time_s: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)
    code_hash: str = ""  # provenance.code_hash of the code that ran (the runner fills it)
    code_modules: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} must be one of {list(VERDICTS)}")
        self.thresholds = [
            t if isinstance(t, Threshold) else Threshold(**t) for t in self.thresholds
        ]
        self.competence = [
            c if isinstance(c, Competence) else Competence.from_record(c) for c in self.competence
        ]
        failed = missed(self.competence)
        if failed and self.verdict != "inconclusive":
            raise ValueError(
                f"verdict {self.verdict!r} drawn while arm(s) "
                f"{', '.join(c.arm for c in failed)} missed their competence criterion; "
                "the verdict must be 'inconclusive' (use attnlab.lab.kit.verdict.gate)"
            )

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
        if self.thresholds:
            out += ["Thresholds the verdict is judged by, with their source:", ""]
            out += [f"- {t.what}: {t.value} ({t.source})" for t in self.thresholds] + [""]
        if len(self.seeds) > 1:
            seeds = ", ".join(str(s) for s in self.seeds)
            out += [
                f"Seeds: {seeds}; numbers are the mean over seeds with the (min-max) range "
                "unless a table says otherwise.",
                "",
            ]
        elif self.seeds:
            out += [f"One seed ({self.seeds[0]}): no spread is measured.", ""]
        out += ["## Competence", ""]
        if self.competence:
            out += [
                "Each arm must learn its own training distribution before it is compared; "
                "an arm that misses makes the verdict inconclusive.",
                "",
            ]
            rows = [
                {
                    "arm": c.arm,
                    "criterion": c.criterion,
                    "threshold": (">= " if c.higher_is_better else "<= ") + f"{c.threshold:g}",
                    "per seed": ", ".join(f"{v:.4g}" for v in c.values),
                    "learning rate": c.lr.describe() if c.lr is not None else "-",
                    "step doubling": c.doubling.describe() if c.doubling is not None else "-",
                    "passed": c.passed,
                    "in verdict": c.in_verdict,
                }
                for c in self.competence
            ]
            out += [Table("competence", rows).to_markdown(), ""]
        else:
            out += ["(no trained arm is compared in this experiment)", ""]
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
            + (f"GPU {m['gpu']} present, " if m.get("gpu") else "")
            + f"{m.get('threads', '?')} torch thread{'' if m.get('threads') == 1 else 's'}, "
            f"torch {m.get('torch', '?')}, "
            f"Python {m.get('python', '?')}.{_load_note(m)}",
            "",
        ]
        if self.code_hash:
            out += [
                f"Code hash `{self.code_hash}` over {len(self.code_modules)} modules (the "
                "experiment, the lab kit and the attnlab modules they import; see "
                "`attnlab.lab.kit.provenance`).",
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
        raise UserError(
            f"out={str(out)!r} is a file; give a directory for the report", fields=("out",)
        )
    data = out / DATA_FILE
    if not quick or not data.is_file():
        return
    try:
        previous_quick = bool(json.loads(data.read_text(encoding="utf-8")).get("quick", True))
    except (OSError, ValueError, AttributeError):
        return  # unreadable: not a report we need to protect
    if not previous_quick:
        raise UserError(
            f"{str(out)!r} holds a full-size report; a quick run will not overwrite it. "
            "Give another out directory (or leave out unset to use a temporary one)",
            fields=("out",),
        )


def machine_info() -> dict[str, Any]:
    """Where the numbers come from: CPU model, logical cores, the GPU if any, torch threads and
    versions."""
    return {
        "cpu_model": cpu_model(),
        "gpu": device_name(gpu) if (gpu := find_gpu()) is not None else None,
        "logical_cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": load_average(),
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


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot store {type(obj).__name__} in report.json")
