"""loss.png's figure: the loss curves (train, validation) and the task metric, as PNG bytes.

This file imports nothing of attnlab, and matplotlib only when it draws, so that a plain Python
process can run it as a script and draw a training run's plots beside it, on another core and
without the training process's interpreter lock (:class:`attnlab.train.report.LossPlotter`)::

    python .../attnlab/train/loss_figure.py

reads one JSON object per line on stdin, ``{"records": [...], "title": "..."}``, and answers each
on stdout with a header line ``ok N`` (or ``error N``) and N bytes: the PNG (or the error).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Iterable
from typing import Any, BinaryIO

TASK_METRICS = ("exact_match", "accuracy", "bleu", "chrf")


def loss_figure_png(records: Iterable[dict[str, Any]], title: str | None = None) -> bytes:
    """Loss curves (train, validation; log scale when positive) and the task metric, as PNG."""
    import matplotlib  # heavy: only when drawing

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure  # heavy: only when drawing

    records = list(records)
    metric_keys = sorted(
        {k for r in records for k in r if k.startswith("val_") and k[4:] in TASK_METRICS}
    )
    fig = Figure(figsize=(10 if metric_keys else 6, 4), layout="constrained")
    axes = fig.subplots(1, 2 if metric_keys else 1, squeeze=False)[0]
    for key, style in (("train_loss", "-"), ("val_loss", "o-")):
        pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        if pts:
            axes[0].plot(*zip(*pts), style, label=key.replace("_", " "), markersize=3)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("loss (nats per target)")
    if any(isinstance(r.get("train_loss"), (int, float)) and r["train_loss"] > 0 for r in records):
        axes[0].set_yscale("log")
    axes[0].grid(alpha=0.3)
    axes[0].legend()
    if metric_keys:
        for key in metric_keys:
            pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
            axes[1].plot(*zip(*pts), "o-", label=key.replace("_", " "), markersize=3)
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("validation metric")
        axes[1].grid(alpha=0.3)
        axes[1].legend()
    if title:
        fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """Answer every request line of ``requests`` (see module docstring) until it closes."""
    for line in requests:
        try:
            asked = json.loads(line)
            body, status = loss_figure_png(asked["records"], asked.get("title")), b"ok"
        except Exception as err:  # reported to the training process, which raises it
            body, status = f"{type(err).__name__}: {err}".encode(), b"error"
        answers.write(status + b" %d\n" % len(body) + body)
        answers.flush()


if __name__ == "__main__":
    # ready before the first request (the run's first evaluation); if matplotlib is missing,
    # the first request is answered with the error
    with contextlib.suppress(ImportError):
        from matplotlib.figure import Figure  # noqa: F401
    serve(sys.stdin.buffer, sys.stdout.buffer)
