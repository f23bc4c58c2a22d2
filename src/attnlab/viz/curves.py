"""Training curves from a run's JSONL metrics log: every loss against the step, lr on a twin axis.

A metrics log has one JSON object per line, e.g.
``{"step": 100, "train_loss": 2.31, "lr": 0.0003}`` and now and then
``{"step": 500, "val_loss": 2.40}``. Every numeric key ending in ``loss`` becomes a curve. After a
resume the same step can appear twice; the later record wins. A half-written last line (the run
is still writing) is ignored; a malformed line anywhere else is an error naming the line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from attnlab.errors import DataError
from attnlab.train.report import METRICS_FILE
from attnlab.train.report import read_metrics as read_metrics_file
from attnlab.viz.figure import new_figure, save_figure


def find_metrics_file(run: str | os.PathLike) -> Path:
    """``run`` itself if it is a file, else ``run/metrics.jsonl`` or the run's only ``*.jsonl``."""
    p = Path(run)
    if p.is_file():
        return p
    if not p.is_dir():
        raise DataError(f"no run directory or metrics file at {str(p)!r}")
    if (p / METRICS_FILE).is_file():
        return p / METRICS_FILE
    found = sorted(p.glob("*.jsonl")) or sorted(p.glob("*/*.jsonl"))
    if len(found) == 1:
        return found[0]
    raise DataError(
        f"cannot find the metrics log of run {str(p)!r}: expected {METRICS_FILE}"
        + (f", found several candidates {[str(f) for f in found]}; pass one" if found else "")
    )


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a JSONL metrics file (or run directory), in file order, read strictly by
    the format's one reader (:func:`attnlab.train.report.read_metrics`)."""
    return read_metrics_file(find_metrics_file(path), strict=True)


def _series(records: Iterable[dict[str, Any]]) -> dict[str, dict[float, float]]:
    """{key: {step: value}} for the loss keys and lr; records without a step use their index."""
    series: dict[str, dict[float, float]] = {}
    for index, record in enumerate(records):
        step = record.get("step", index)
        if not _is_number(step):
            continue
        for key, value in record.items():
            if (key.endswith("loss") or key == "lr") and _is_number(value):
                series.setdefault(key, {})[float(step)] = float(value)
    return series


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def plot_loss_curves(
    metrics: str | os.PathLike | Iterable[dict[str, Any]],
    out_png: str | os.PathLike | None = None,
    *,
    title: str | None = None,
    log_y: bool = False,
) -> Figure:
    """Loss curves (train, val, ...) against the step, with the learning rate on a twin axis.

    ``metrics``: a JSONL file, a run directory, or a list of dicts. Saved to ``out_png`` if given.
    """
    records = read_metrics(metrics) if isinstance(metrics, (str, os.PathLike)) else list(metrics)
    series = _series(records)
    losses = sorted((k for k in series if k != "lr"), key=lambda k: (k != "train_loss", k))
    if not losses:
        raise DataError(
            "no loss values to plot: expected records with a numeric 'train_loss' or 'val_loss' "
            f"(keys seen: {sorted({k for r in records for k in r})[:12]})"
        )
    fig = new_figure(8.0, 4.5)
    ax = fig.subplots()
    for key in losses:
        steps = sorted(series[key])
        values = [series[key][s] for s in steps]
        sparse = len(steps) < 0.5 * max(len(series[k]) for k in losses)
        ax.plot(
            steps,
            values,
            label=key.replace("_", " "),
            linewidth=1.4,
            marker="o" if sparse or len(steps) < 30 else None,
            markersize=3,
        )
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)" if not log_y else "loss (log scale)")
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if "lr" in series:
        lr_ax = ax.twinx()
        steps = sorted(series["lr"])
        lr_ax.plot(
            steps,
            [series["lr"][s] for s in steps],
            color="0.5",
            linestyle="--",
            linewidth=1.0,
            label="learning rate",
        )
        lr_ax.set_ylabel("learning rate")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        more = lr_ax.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize=9)
    if title:
        fig.suptitle(title)
    if out_png is not None:
        save_figure(fig, out_png)
    return fig
