"""The index of committed experiment reports: ``docs/experiments/README.md``.

Built from every ``*/report.json`` under the docs directory, so it always lists what is actually
there: the experiment, its verdict with the one-sentence reason, the wall time and the command.
The runner rewrites it after every default full-size run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from attnlab.checkpoint.atomic import atomic_write_text
from attnlab.lab.kit.report import DATA_FILE, format_cell

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


def render_index(reports: list[dict], pending: list[tuple[str, str, str]] = ()) -> str:
    """The index page; ``pending`` = (name, notes, claim) of registered experiments without a
    full-size report yet."""
    lines = [
        "# Experiments",
        "",
        "Each experiment tests a claim of the lecture notes on a CPU in minutes. The reports below "
        "come from full-size runs (`attnlab experiment NAME`); rerun one with its command, or a "
        "CI-sized version with `--quick`. `attnlab experiment --list` lists them all.",
        "",
        "The standard every report meets (checked by `tests/test_lab_gate.py` on the committed "
        "reports):",
        "",
        "- **Competence gate.** Each experiment states, per arm, a criterion on the arm's own "
        "training distribution (e.g. >= 0.99 per-token accuracy on the training lengths) and "
        "measures it on every seed; an arm the verdict compares that misses it makes the verdict "
        "**inconclusive**, and the report says which arm missed and by how much. Reference arms "
        "(shown, not compared) are marked as such. An arm whose failure is the claim (one head "
        "on a task that needs two) is held to having learned its training setup -- its training "
        "converged (doubling the steps barely lowers its loss) -- never to the outcome the claim "
        "predicts for it.",
        "- **Seeds and spread.** Full-size numbers come from at least 3 seeds (timing "
        "experiments: 3 measurement rounds), reported as mean (min-max); figures carry bands or "
        "error bars, and a difference inside the spread is called so. Fewer than 3 seeds: "
        "inconclusive.",
        "- **Provenance.** Each report records its command, seeds, machine, load and wall time; "
        "`--quick` runs the same code CI-sized (one seed, never a verdict to rely on).",
        "",
        "| experiment | notes | verdict | competence | seeds | why | wall time | command |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        link = f"[{r.get('title', r['_dir'])}]({r['_dir']}/README.md)"
        rederived = (r.get("findings") or [""])[0].startswith("Re-derived")
        verdict = f"**{r.get('verdict', '?')}**" + (" (re-derived)" if rederived else "")
        cells = [
            link,
            r.get("source", ""),
            verdict,
            competence_cell(r.get("competence")),
            str(len(r.get("seeds") or [r.get("seed")])),
            r.get("verdict_reason", ""),
            f"{float(r.get('wall_time_s', 0)):.0f} s",
            f"`{r.get('command', '')}`",
        ]
        lines.append(
            "| " + " | ".join(format_cell(c) if i else c for i, c in enumerate(cells)) + " |"
        )
    if pending:
        lines += [
            "",
            "## Not yet run at full size",
            "",
            "Registered, tested in their `--quick` form, no committed full-size report yet:",
            "",
            "| experiment | notes | claim | command |",
            "|---|---|---|---|",
        ]
        for n, notes, claim in pending:
            command = f"`attnlab experiment {n} --seed 0`"
            lines.append(f"| {n} | {format_cell(notes)} | {format_cell(claim)} | {command} |")
    return "\n".join(lines) + "\n"


def arms_of(criteria: list[dict]) -> dict[str, bool]:
    """{arm: whether it met every one of its criteria}, in the order the arms first appear (an
    arm may be held to several criteria, e.g. a test score and a plateau)."""
    arms: dict[str, bool] = {}
    for c in criteria:
        arms[c["arm"]] = arms.get(c["arm"], True) and bool(c.get("passed"))
    return arms


def competence_cell(competence: list[dict] | None) -> str:
    """How the compared arms fared ('all 3 compared arms pass', 'missed: a, b (1/3 pass)'),
    plus reference arms that missed; 'not stated' for a report from before the gate."""
    if competence is None:
        return "not stated"
    if not competence:
        return "no trained arms"
    compared = arms_of([c for c in competence if c.get("in_verdict", True)])
    failed = [arm for arm, ok in compared.items() if not ok]
    if failed:
        passing = len(compared) - len(failed)
        text = f"missed: {', '.join(failed)} ({passing}/{len(compared)} pass)"
    else:
        text = f"all {len(compared)} compared arms pass"
    references = arms_of([c for c in competence if not c.get("in_verdict", True)])
    ref_missed = [arm for arm, ok in references.items() if not ok]
    if ref_missed:
        text += f"; reference arms that missed: {', '.join(ref_missed)}"
    return text


def write_index(root: str | os.PathLike) -> Path:
    """Rewrite ``root/README.md`` from the reports found under ``root``."""
    from attnlab.lab.kit.registry import discover  # the registry imports every experiment module

    reports = read_reports(root)
    done = {r.get("name", r["_dir"]) for r in reports}
    pending = [(e.name, e.notes, e.claim) for e in discover().values() if e.name not in done]
    return atomic_write_text(Path(root) / INDEX_FILE, render_index(reports, pending))
