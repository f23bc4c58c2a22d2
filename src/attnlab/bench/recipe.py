"""Suite ``recipe``: wall time for two training presets to reach the same validation loss.

``attnlab bench --suite recipe --text FILE`` trains preset ``baseline-char`` (the classic small
character-level recipe: 4 layers, 4 heads, width 128, context 64, batch 12, AdamW 1e-3, beta2
0.99, 100 warm-up steps, cosine to 1e-4 over 2000 steps, no dropout, 90/10 split) and then
``fast-char`` (tuned for time-to-quality on this CPU) on the same text, one after the other in
this process, through the training loop users run (``attnlab.train.train``). Each run appends
evaluations to ``run_dir/metrics.jsonl`` (``step``, ``val_loss``, ``elapsed_s``, ...). With

    L* = the baseline's final validation loss,
    t(p) = elapsed_s of the first evaluation of preset p with val_loss <= L*,

we report t(baseline) (= its last evaluation's time), t(fast-char) and the ratio t(fast)/t(base)
(target <= 0.5). Evaluation time counts, as it does for a user; a preset that never reaches L*
reports ``reached: false``. The runs are not interleaved (each is one long run), so the machine's
load matters more here: the load average before and after each run is recorded.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from attnlab.bench.harness import target_entry
from attnlab.bench.machine import load_average
from attnlab.errors import DataError

TARGET = 0.5  # fast-char time-to-baseline-loss <= 0.5x the baseline's


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The evaluation rows (those with a ``val_loss``) of a metrics.jsonl file, in order."""
    rows = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                row = json.loads(line)
                if row.get("val_loss") is not None:
                    rows.append(row)
    return rows


def time_to_reach(rows: list[dict[str, Any]], loss: float) -> dict[str, Any]:
    """The first evaluation with val_loss <= loss: elapsed_s, step (``reached`` False if none)."""
    for row in rows:
        if row["val_loss"] <= loss:
            return {
                "reached": True,
                "seconds": row["elapsed_s"],
                "step": row["step"],
                "val_loss": row["val_loss"],
            }
    last = rows[-1] if rows else {}
    return {
        "reached": False,
        "seconds": None,
        "step": last.get("step"),
        "val_loss": last.get("val_loss"),
        "best_val_loss": min((r["val_loss"] for r in rows), default=None),
    }


def compare(baseline_rows: list[dict], fast_rows: list[dict]) -> dict[str, Any]:
    """The suite's numbers from two metrics histories (see the module docstring)."""
    if not baseline_rows:
        raise ValueError("the baseline run recorded no validation loss; nothing to compare to")
    target_loss = baseline_rows[-1]["val_loss"]
    base = {
        "reached": True,
        "seconds": baseline_rows[-1]["elapsed_s"],
        "step": baseline_rows[-1]["step"],
        "val_loss": target_loss,
    }
    fast = time_to_reach(fast_rows, target_loss)
    value = fast["seconds"] / base["seconds"] if fast["reached"] and base["seconds"] else None
    return {
        "target_val_loss": target_loss,
        "baseline": base,
        "fast": fast,
        "time_ratio_fast_vs_baseline": value,
    }


def _train_api():
    """attnlab.train.train and a preset resolver, or ImportError naming what is missing."""
    import attnlab.train as train_pkg

    train = getattr(train_pkg, "train", None)
    if train is None:
        raise ImportError("attnlab.train.train (the training loop) has not landed yet")
    resolve = getattr(train_pkg, "preset_run_config", None)
    if resolve is None:
        raise ImportError(
            "attnlab.train.preset_run_config(name, text=...) -> RunConfig is not available; the "
            "recipe suite needs it to build the baseline-char / fast-char runs"
        )
    return train, resolve


def run(settings, ctx) -> dict[str, Any]:
    text = Path(settings.text)
    if not text.is_file():
        raise DataError(
            f"--text {str(text)!r} is not a file; give a plain-text training corpus "
            "(e.g. ../shared/data/tinyshakespeare.txt)"
        )
    train, resolve = _train_api()
    base_name, fast_name = settings.recipe_presets
    histories, runs = {}, {}
    with tempfile.TemporaryDirectory(prefix="attnlab-recipe-") as tmp:
        for name in (base_name, fast_name):
            run_dir = Path(tmp) / name
            cfg = resolve(name, text=os.fspath(text))
            ctx.say(f"recipe: training {name} on {text.name}")
            load_before, t0 = load_average(), time.perf_counter()
            train(cfg, run_dir=run_dir, progress=False)
            runs[name] = {
                "preset": name,
                "wall_seconds": time.perf_counter() - t0,
                "load_average_before": load_before,
                "load_average_after": load_average(),
            }
            histories[name] = read_metrics(run_dir / "metrics.jsonl")
            runs[name]["evaluations"] = histories[name]
    result = compare(histories[base_name], histories[fast_name])
    ctx.say(
        f"  target val loss {result['target_val_loss']:.4f}: {base_name} "
        f"{result['baseline']['seconds']:.0f} s, {fast_name} {result['fast']['seconds']} s"
    )
    return {
        "status": "ok",
        "text": os.fspath(text),
        "presets": [base_name, fast_name],
        **result,
        "runs": runs,
        "targets": [
            target_entry(
                "recipe_fast_vs_baseline",
                f"wall time of {fast_name} to reach {base_name}'s final "
                "validation loss / the baseline's time (lower is better)",
                result["time_ratio_fast_vs_baseline"],
                TARGET,
                higher_is_better=False,
                note="" if result["fast"]["reached"] else f"{fast_name} never reached the loss",
            )
        ],
    }
