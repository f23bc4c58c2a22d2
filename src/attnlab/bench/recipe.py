"""Suite ``recipe``: wall time for two training presets to reach the same validation loss.

``attnlab bench --suite recipe --text FILE`` trains preset ``baseline-char`` (the classic small
character-level recipe: 4 layers, 4 heads, width 128, context 64, batch 12, AdamW 1e-3, beta2
0.99, 100 warm-up steps, cosine to 1e-4 over 2000 steps, no dropout, 90/10 split) and
``fast-char`` (tuned for time-to-quality on this CPU) on the same text, in this process,
through the training loop users run (``attnlab.train.train``), after a few untimed warm-up
steps of each preset (so neither run pays the process's one-off costs: imports, kernels first
built for its shapes). Each run appends evaluations to ``run_dir/metrics.jsonl`` (``step``,
``val_loss``, ``elapsed_s``, ...). Within one round, with

    L* = the baseline's final validation loss,
    t(p) = elapsed_s of the first evaluation of preset p with val_loss <= L*,

we report t(baseline) (= its last evaluation's time), t(fast-char) and the ratio t(fast)/t(base)
(target <= 0.2). ``elapsed_s`` is the loop's wall clock at that step (earlier evaluations
included), so time is resolved to each preset's ``eval_every``. The losses are only comparable
when both presets evaluate alike (same tokenizer, validation split, context length and number
of validation windows: evaluation reads the first ``eval_batches x batch_size`` windows of the
split in order, so 20 batches of 12 and 5 of 48 are the same 240 windows); the
result says ``comparable: false`` and the target carries a note otherwise. A preset that never
reaches L* reports ``reached: false``.

Each run is one long run, so the host's speed while it runs matters (it drifts by ~25 % between
minutes on the 2-core machine): ``settings.rounds`` rounds are run, round r training both
presets with seed + r, the order alternating, and the reported ratio is the median over rounds
with its min and max (:func:`summary`); the load average before and after each run is recorded.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from attnlab.bench.harness import target_entry
from attnlab.errors import DataError
from attnlab.runtime import load_average
from attnlab.train import RunConfig, train
from attnlab.train.presets import RUN_PRESETS, preset_tables
from attnlab.train.report import METRICS_FILE, read_metrics

TARGET = 0.2  # fast-char time-to-baseline-loss <= 0.2x the baseline's (issue 37)


def evaluations(path: Path) -> list[dict[str, Any]]:
    """The evaluation rows (those with a ``val_loss``) of a metrics.jsonl file, in order."""
    return [row for row in read_metrics(path) if row.get("val_loss") is not None]


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
    """(train, preset): the loop and ``preset(name) -> RunConfig``, or ImportError saying why.

    Presets are the tables of ``attnlab.train.presets.RUN_PRESETS`` (``attnlab train --preset``).
    """

    def preset(name: str) -> RunConfig:
        if name not in RUN_PRESETS:
            raise ImportError(
                f"training preset {name!r} is not defined yet in attnlab.train.presets "
                f"(defined: {', '.join(sorted(RUN_PRESETS))})"
            )
        return RunConfig.from_dict(preset_tables(name), source=f"preset {name!r}")

    return train, preset


def configure(run_config, text: str):
    """The preset's RunConfig on ``text``, quiet, with nothing else changed."""
    return RunConfig(run_config.model, run_config.train.replace(data=text, progress=False))


def protocol(run_config) -> dict[str, Any]:
    """The evaluation settings that make two presets' validation losses comparable (or not)."""
    t = run_config.train
    return {
        "context_len": t.context_len,
        "val_fraction": t.val_fraction,
        "eval_batches": t.eval_batches,
        "batch_size": t.batch_size,
        "val_windows": t.eval_batches * t.batch_size,  # the first this many, in order
        "tokenizer": t.tokenizer,
        "eval_every": t.eval_every,
    }


def protocol_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The settings of two :func:`protocol` s that make their validation losses incomparable
    (batch size and count alone do not: only the windows they read)."""
    keys = ("context_len", "val_fraction", "val_windows", "tokenizer")
    return [k for k in keys if a[k] != b[k]]


def run(settings, ctx) -> dict[str, Any]:
    text = Path(settings.text)
    if not text.is_file():
        raise DataError(
            f"text={str(text)!r} is not a file; give a plain-text training corpus "
            "(e.g. ../shared/data/tinyshakespeare.txt)",
            fields=("text",),
        )
    train, resolve = _train_api()
    protocols = {
        name: protocol(configure(resolve(name), os.fspath(text)))
        for name in settings.recipe_presets
    }
    base_name, fast_name = settings.recipe_presets
    with tempfile.TemporaryDirectory(prefix="attnlab-recipe-") as tmp:
        ctx.say("recipe: warm-up (a few untimed steps of each, so neither run pays one-off costs)")
        for name in (base_name, fast_name):
            warm_up(train, configure(resolve(name), os.fspath(text)), Path(tmp) / f"warm-{name}")
        rounds = []
        for r in range(settings.rounds):
            order = (base_name, fast_name) if r % 2 == 0 else (fast_name, base_name)
            runs = {}
            for name in order:
                cfg = configure(resolve(name), os.fspath(text))
                cfg = type(cfg)(cfg.model, cfg.train.replace(seed=cfg.train.seed + r))
                ctx.say(f"recipe: round {r + 1}/{settings.rounds}, training {name} on {text.name}")
                runs[name] = timed_run(train, cfg, Path(tmp) / f"round{r}-{name}")
                runs[name]["eval_protocol"] = protocols[name]
            histories = {name: runs[name]["evaluations"] for name in runs}
            rounds.append(
                {
                    "round": r,
                    "order": list(order),
                    **compare(histories[base_name], histories[fast_name]),
                    "runs": runs,
                }
            )
            say_round(ctx, rounds[-1], base_name, fast_name)
    return summary(rounds, base_name, fast_name, protocols, os.fspath(text))


def warm_up(train, run_config, run_dir: Path) -> None:
    """A few untimed steps of ``run_config`` (the process's and the shapes' one-off costs)."""
    t = run_config.train
    short = t.replace(
        steps=min(t.steps, 10), eval_every=0, warmup_steps=min(t.warmup_steps, 10), save_every=0
    )
    train(type(run_config)(run_config.model, short), run_dir=run_dir, progress=False)


def timed_run(train, run_config, run_dir: Path) -> dict[str, Any]:
    """Train ``run_config``: its wall time, the load around it and its evaluations."""
    load_before, t0 = load_average(), time.perf_counter()
    train(run_config, run_dir=run_dir, progress=False)
    return {
        "preset_seed": run_config.train.seed,
        "wall_seconds": time.perf_counter() - t0,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "evaluations": evaluations(run_dir / METRICS_FILE),
    }


def say_round(ctx, rnd: dict[str, Any], base_name: str, fast_name: str) -> None:
    fast_s = rnd["fast"]["seconds"]
    ratio = rnd["time_ratio_fast_vs_baseline"]
    ctx.say(
        f"  target val loss {rnd['target_val_loss']:.4f}: {base_name} "
        f"{rnd['baseline']['seconds']:.1f} s, {fast_name} "
        + (f"{fast_s:.1f} s (ratio {ratio:.3f})" if fast_s is not None else "never reached it")
    )


def summary(
    rounds: list[dict[str, Any]], base_name: str, fast_name: str, protocols: dict, text: str
) -> dict[str, Any]:
    """The suite's result: the median round's numbers on top, every round under ``rounds``.

    The ratio is the median over rounds (a round whose fast preset never reached the loss
    counts as infinitely slow); ``ratio_min`` / ``ratio_max`` give the spread. With an even
    number of rounds the top-level ``baseline`` / ``fast`` / ``runs`` are the lower middle one's.
    """
    ratios = [r["time_ratio_fast_vs_baseline"] for r in rounds]
    ranked = sorted(ratios, key=lambda v: math.inf if v is None else v)
    middle = rounds[ratios.index(ranked[(len(ranked) - 1) // 2])]
    reached = all(v is not None for v in ratios)
    value = statistics.median(ratios) if reached else None
    differ = protocol_differences(protocols[base_name], protocols[fast_name])
    caveat = (
        f"validation losses are measured differently ({', '.join(differ)} differ), so they are "
        "not directly comparable"
        if differ
        else ""
    )
    missed = sum(v is None for v in ratios)
    never = f"{fast_name} never reached the loss in {missed} round(s)" if missed else ""
    return {
        "status": "ok",
        "text": text,
        "presets": [base_name, fast_name],
        "target_val_loss": middle["target_val_loss"],
        "baseline": middle["baseline"],
        "fast": middle["fast"],
        "time_ratio_fast_vs_baseline": value,
        "ratio_rounds": ratios,
        "ratio_min": ranked[0] if reached else None,
        "ratio_max": ranked[-1] if reached else None,
        "comparable": not differ,
        "runs": middle["runs"],
        "rounds": rounds,
        "targets": [
            target_entry(
                "recipe_fast_vs_baseline",
                f"wall time of {fast_name} to reach {base_name}'s final validation loss / the "
                f"baseline's time, median over {len(rounds)} round(s) (lower is better)",
                value,
                TARGET,
                higher_is_better=False,
                note="; ".join(n for n in (never, caveat) if n),
            )
        ],
    }
