"""Re-derive committed reports under the competence gate from their stored numbers (no re-run).

Reports written before the gate (docs/experiments/*/report.json without ``competence``) state
no criterion per arm and come from one seed. This module reads the numbers each one stored,
applies the criterion its experiment now states (the same as the code's, where the stored data
has the measure; a stated proxy where it does not), and rewrites README.md and report.json with
the gate's verdict. One seed cannot carry a verdict (the gate wants three), so every re-derived
report is "inconclusive" until its experiment is re-run; the text keeps what the numbers read.

    PYTHONPATH=src python -m attnlab.lab._rederive docs/experiments NAME [NAME ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnlab.lab.index import write_index
from attnlab.lab.report import DATA_FILE, Competence, FigureRef, Report, Table, gate

NOTE = (
    "Re-derived under the competence gate from the numbers this run stored (not re-run): one "
    "seed, so no verdict is drawn until the experiment is re-run on three or more seeds."
)


def _rows(data: dict, caption_start: str) -> list[dict]:
    for t in data["tables"]:
        if t["caption"].startswith(caption_start):
            return t["rows"]
    raise KeyError(caption_start)


def _acc_rule(arm: str, what: str, value: float, threshold: float = 0.99) -> Competence:
    return Competence(arm, what, threshold, [value])


def competence_of(name: str, data: dict) -> list[Competence]:
    """The criteria per arm, measured from the stored tables (test sets share the training
    distribution, so test accuracy stands in for accuracy on it where no training accuracy was
    stored; the criterion text says which)."""
    if name == "attention":
        rows = [r for r in _rows(data, "test accuracy") if r["attention"].startswith("soft")]
        return [
            _acc_rule(
                f"soft, {r['model']}, {r['task']}",
                "test accuracy (training distribution)",
                r["test accuracy"],
            )
            for r in rows
        ]
    if name == "char_lm":
        bigram = _rows(data, "validation")[1]["val bits/char"]
        tf = _rows(data, "validation")[2]["val bits/char"]
        return [
            Competence(
                "Transformer LM",
                "validation bits/char below the bigram baseline",
                bigram,
                [tf],
                higher_is_better=False,
            )
        ]
    if name == "extrapolation":
        inside = data["metrics"]["inside"]
        return [
            _acc_rule(k, "per-token copy accuracy on the training lengths", v)
            for k, v in inside.items()
        ]
    if name == "heads":
        return [
            _acc_rule(
                f"{r['model']}, {r['heads']} head(s)",
                "all three roles right (test, training distribution)",
                r["all three"],
            )
            for r in _rows(data, "(b)")
        ]
    if name == "long_range":
        out = []
        for r in _rows(data, "reversal: per-token"):
            for arm in ("LSTM + Bahdanau attention", "Transformer encoder-decoder"):
                out.append(
                    _acc_rule(
                        f"{arm}, reversal T = {r['length']}",
                        "per-token accuracy at its training length",
                        r[arm],
                    )
                )
        for r in _rows(data, "dates"):
            out.append(
                _acc_rule(
                    f"{r['model']}, dates",
                    "per-token accuracy (training distribution)",
                    r["token accuracy"],
                )
            )
        return out
    if name == "nonlinearity":
        return [
            _acc_rule(
                f"{r['model']}, {r['task']}",
                "test accuracy (training distribution)",
                r["test accuracy"],
            )
            for r in _rows(data, "(b)")
            if "with FFN" in r["model"]
        ]
    if name == "norm":
        rows = [
            r
            for r in _rows(data, "(b)")
            if r["peak lr"] == min(x["peak lr"] for x in _rows(data, "(b)"))
        ]
        best = min(r["final loss"] for r in _rows(data, "(b)"))
        return [
            Competence(
                f"{r['norm']}-norm, warm-up {r['warm-up steps']}, lr {r['peak lr']:g}",
                "final training loss within 0.1 of the best run",
                best + 0.1,
                [r["final loss"]],
                higher_is_better=False,
            )
            for r in rows
        ]
    if name == "order":
        return [
            _acc_rule(
                r["positions"],
                "test accuracy (swap-closed, training distribution)",
                r["test accuracy (swap-closed)"],
            )
            for r in _rows(data, "accuracy")
            if r["positions"] != "none"
        ]
    if name == "sampling":
        human = [r for r in _rows(data, "decoding") if r["strategy"].startswith("validation")][0]
        return [
            Competence(
                "character LM",
                "validation bits/char below the bigram baseline "
                "(3.58 on this text, char_lm report)",
                3.58,
                [human["own NLL (bits/char)"]],
                higher_is_better=False,
            )
        ]
    if name == "scaling":
        return [
            _acc_rule(
                f"scaled logits, W_q, W_k init {r['W_q, W_k init']}",
                "test accuracy (training distribution)",
                r["test accuracy"],
            )
            for r in _rows(data, "training")
            if r["scale_logits"]
        ]
    if name == "translation":
        out = []
        for r in _rows(data, "test scores"):
            out.append(
                Competence(
                    r["model"],
                    "lower-cased beam BLEU >= 0.9 x the public "
                    f"tutorial's {r['tutorial lc BLEU']:g} on the same data (a "
                    "level its recipe is known to reach)",
                    round(0.9 * r["tutorial lc BLEU"], 2),
                    [r["lc BLEU beam 5"]],
                )
            )
        return out
    if name == "parallelism":
        return []
    raise KeyError(f"no re-derivation rule for {name!r}")


def rederive(root: Path, name: str) -> Report:
    path = root / name / DATA_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    if "competence" in data:
        raise ValueError(f"{path} already states its competence; re-run it instead")
    competence = competence_of(name, data)
    reason = data["verdict_reason"]
    old = data["verdict"]
    verdict, why = gate(old, reason, competence, n_seeds=1)
    keep = {
        k: data[k]
        for k in (
            "name",
            "title",
            "claim",
            "source",
            "setup",
            "metrics",
            "quick",
            "seed",
            "command",
            "wall_time_s",
            "machine",
        )
    }
    report = Report(
        **keep,
        tables=[Table(t["caption"], t["rows"]) for t in data["tables"]],
        figures=[FigureRef(f["file"], f["caption"]) for f in data["figures"]],
        findings=[NOTE + f" The verdict before the gate was {old!r}."] + data["findings"],
        verdict=verdict,
        verdict_reason=why,
        competence=competence,
        seeds=[data["seed"]],
        per_seed={},
    )
    report.write(root / name)
    return report


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for name in sys.argv[2:]:
        r = rederive(root, name)
        print(name, r.verdict, [(c.arm, c.passed) for c in r.competence])
    write_index(root)
