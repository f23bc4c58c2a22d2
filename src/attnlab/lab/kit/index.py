"""The index of committed experiment reports: ``docs/experiments/README.md``.

Built from every ``*/report.json`` under the docs directory, so it always lists what is actually
there: the experiment, its verdict with the reason (for an inconclusive one, the missed gates
grouped; the report lists every criterion), the wall time and the command. A report whose
recorded code hash differs from the hash of the code today (:mod:`attnlab.lab.kit.provenance`)
is marked **stale** in the verdict column: its numbers came from code that has changed since.
The runner rewrites the index after every default full-size run; ``attnlab experiment --index``
rewrites it alone (after a code change, so the change shows).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from attnlab.checkpoint.atomic import atomic_write_text
from attnlab.lab.kit.report import DATA_FILE, format_cell
from attnlab.lab.kit.verdict import COMPARISON, VERDICT_MEANINGS, Competence, missed, missed_text

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


def render_index(reports: list[dict], pending: Sequence[tuple[str, str, str]] = ()) -> str:
    """The index page; ``pending`` = (name, notes, claim) of registered experiments without a
    full-size report yet."""
    lines = [
        "# Experiments",
        "",
        "Each experiment tests a claim of the lecture notes on a CPU in minutes. The reports below "
        "come from full-size runs (`attnlab experiment NAME`); rerun one with its command, or a "
        "CI-sized version with `--quick`. `attnlab experiment --list` lists them all.",
        "",
        "The standard every current report meets (checked by `tests/lab/test_lab_gate.py` on "
        "the committed reports; a report marked **stale** was made by older code, and its row, "
        "verdict and wall time included, is a record until it is rerun):",
        "",
        "- **The gate covers every compared arm.** Each report names the arms its verdict "
        "compares and states, per arm, a criterion on the arm's own training distribution (e.g. "
        ">= 0.99 per-token accuracy on the training lengths), measured on every seed. An arm is "
        "competent when it meets the criterion on every seed, **at a learning rate bracketed by "
        "its sweep** (a tried rate on each side of the chosen one; a choice at a grid edge "
        "extends the grid) and **converged by step doubling** (doubling the training steps "
        "changes its metric by less than the tolerance the report states). An arm whose failure "
        "is the claim gets the same sweep and doubling as the winner, and is held to having "
        "learned its training setup, never to the outcome the claim predicts for it. A compared "
        "arm that misses, or whose sweep or doubling could not be afforded, makes the verdict "
        "**inconclusive**, and the report says which arm and why. Reference arms (shown, not "
        "compared) are marked as such. The competence column counts every compared arm.",
        "- **Verdict words, one meaning each:** "
        + "; ".join(f"**{word}**: {meaning}" for word, meaning in VERDICT_MEANINGS.items())
        + ". Each report quotes the thresholds it judges by, with the paper or note they come "
        "from.",
        "- **Seeds and spread.** Full-size numbers come from at least 3 seeds (timing "
        "experiments: 3 measurement rounds), reported as mean (min-max); figures carry bands or "
        "error bars, and a difference inside the spread is called so. Fewer than 3 seeds: "
        "inconclusive.",
        "- **Provenance.** Each report records its command, seeds, machine, load, wall time and a "
        "hash of the code it ran (its experiment module and every attnlab module it uses, of the "
        "lab kit and the library, found through its imports; wording and typing aside). A report "
        "whose code changed since is marked **stale** below until it is rerun. A run that "
        "keeps its finished jobs (`translation`, `long_range`) may be made in pieces, all under "
        "one code hash; its wall time is the sum over the pieces. `--quick` runs the same code "
        "CI-sized (one seed, never a verdict to rely on).",
        "",
        tally(reports),
        "",
        "| experiment | notes | verdict | competence | seeds | why | wall time | command |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        link = f"[{r.get('title', r['_dir'])}]({r['_dir']}/README.md)"
        verdict = f"**{r.get('verdict', '?')}**"
        if r.get("_stale"):
            verdict += f" (**stale**: {r['_stale']})"
        cells = [
            link,
            r.get("source", ""),
            verdict,
            competence_cell(r.get("competence"), r.get("arms")),
            str(len(r.get("seeds") or [r.get("seed")])),
            why_cell(r),
            wall_cell(r),
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


def tally(reports: list[dict]) -> str:
    """One line counting the reports by verdict word (in the order the words are defined) and
    the stale ones among them."""
    words = [r.get("verdict", "?") for r in reports]
    counts = [f"{words.count(w)} {w}" for w in VERDICT_MEANINGS if w in words]
    counts += [f"{words.count(w)} {w}" for w in dict.fromkeys(words) if w not in VERDICT_MEANINGS]
    stale = sum(1 for r in reports if r.get("_stale"))
    return f"**{len(reports)} report{'' if len(reports) == 1 else 's'}:** {', '.join(counts)}" + (
        f"; {stale} of them stale (a record until rerun)." if stale else "."
    )


def wall_cell(report: dict) -> str:
    """The run's wall time; for a run made in pieces (:mod:`attnlab.lab.kit.pieces`) the sum over
    its pieces, and how many."""
    pieces = (report.get("machine") or {}).get("pieces") or []
    made = f" in {len(pieces)} pieces" if len(pieces) > 1 else ""
    return f"{float(report.get('wall_time_s', 0)):.0f} s{made}"


def why_cell(report: dict) -> str:
    """The report's one-sentence reason; for an inconclusive report whose arms missed their gate,
    the shortfalls as verdict.missed_text groups them (a report made before that grouping listed
    every criterion of a missed arm), then what the comparison would have read."""
    reason = str(report.get("verdict_reason", ""))
    criteria = [Competence.from_record(c) for c in report.get("competence") or []]
    failed = missed(criteria)
    if report.get("verdict") != "inconclusive" or not failed or COMPARISON not in reason:
        return reason
    return missed_text(failed, reason[reason.index(COMPARISON) + len(COMPARISON) :].strip())


def arms_of(criteria: list[dict]) -> dict[str, bool]:
    """{arm: whether it met every one of its criteria}, in the order the arms first appear (an
    arm may be held to several criteria, e.g. a test score and a plateau)."""
    arms: dict[str, bool] = {}
    for c in criteria:
        arms[c["arm"]] = arms.get(c["arm"], True) and bool(c.get("passed"))
    return arms


def arm_list(arms: Sequence[str]) -> str:
    """Arm names joined by commas, a name that holds a comma itself in quotes (e.g. 'plain LSTM,
    source reversed, reversal T = 16'), so that the list reads as the arms it names."""
    return ", ".join(f"'{arm}'" if "," in arm else arm for arm in arms)


def competence_cell(competence: list[dict] | None, arms: list[str] | None = None) -> str:
    """How the compared arms fared ('all 3 compared arms pass', 'missed: a, b (1/3 pass)'),
    counting every compared arm the report names (``arms``), also those without a criterion or
    without a learning-rate sweep and step doubling ('2 of 5 compared arms not gated: ...'),
    plus reference arms that missed; 'not stated' for a report from before the gate."""
    if competence is None:
        return "not stated"
    compared = arms_of([c for c in competence if c.get("in_verdict", True)])
    named = list(arms or [])
    for arm in compared:
        if arm not in named:
            named.append(arm)
    if not named:
        return "no trained arms"
    gated = {c["arm"] for c in competence if c.get("lr") and c.get("doubling")}
    no_gate = [a for a in named if a not in compared or a not in gated]
    compared = {a: compared.get(a, False) for a in named}
    failed = [arm for arm, ok in compared.items() if not ok]
    if failed:
        passing = len(compared) - len(failed)
        text = f"missed: {arm_list(failed)} ({passing}/{len(compared)} pass)"
    else:
        text = f"all {len(compared)} compared arms pass"
    if no_gate:
        text += (
            f"; {len(no_gate)} of {len(compared)} compared arms not gated by a learning-rate "
            f"sweep and step doubling: {arm_list(no_gate)}"
        )
    references = arms_of([c for c in competence if not c.get("in_verdict", True)])
    ref_missed = [arm for arm, ok in references.items() if not ok]
    if ref_missed:
        text += f"; reference arms that missed: {arm_list(ref_missed)}"
    return text


def staleness(report: dict, current: str | None) -> str:
    """Why a committed report no longer describes today's code ('' when it does): no recorded
    code hash, a hash that differs from ``current``, or no registered experiment of its name."""
    if current is None:
        return "no experiment of this name is registered any more"
    recorded = report.get("code_hash")
    if not recorded:
        return "run before code hashes were recorded; rerun to refresh"
    if recorded != current:
        return f"the code it ran changed since (hash {recorded} then, {current} now); rerun"
    return ""


def index_text(root: str | os.PathLike) -> str:
    """The index for the reports under ``root`` as the code stands now (stale ones marked)."""
    from attnlab.lab.kit.provenance import code_hash
    from attnlab.lab.kit.registry import discover  # imports every experiment module

    reports = read_reports(root)
    experiments = discover()
    for r in reports:
        exp = experiments.get(r.get("name", r["_dir"]))
        r["_stale"] = staleness(r, code_hash(exp.run.__module__).digest if exp else None)
    done = {r.get("name", r["_dir"]) for r in reports}
    pending = [(e.name, e.notes, e.claim) for e in experiments.values() if e.name not in done]
    return render_index(reports, pending)


def write_index(root: str | os.PathLike) -> Path:
    """Rewrite ``root/README.md`` from the reports found under ``root``."""
    return atomic_write_text(Path(root) / INDEX_FILE, index_text(root))
