"""Figure plumbing shared by every plot: Agg figures, atomic saving, readable token tick labels.

Figures are built with ``matplotlib.figure.Figure`` on an Agg canvas and never touch ``pyplot``:
no global figure registry to leak, no GUI backend, no ``plt.show``. Callers save them with
:func:`save_figure` (or display them in a notebook, where a Figure renders itself).
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from attnlab.checkpoint.atomic import atomic_write_bytes

MAX_INCHES = 22.0  # no figure grows beyond this on either side, however long the sequence
SAVE_FORMATS = ("png", "pdf", "svg")
MAX_TICKS = 48  # more tokens than this on an axis: label every k-th one
MAX_LABEL_CHARS = 12


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout Figure on an Agg canvas, both sides capped at MAX_INCHES (keeping the
    aspect ratio)."""
    scale = min(1.0, MAX_INCHES / max(width, height))
    fig = Figure(figsize=(width * scale, height * scale), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: str | os.PathLike, *, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` (.png, .pdf or .svg) atomically: the image is rendered in memory,
    written to a temporary file in the same directory and renamed into place, so a reader (or a
    crash) never leaves a half-written image. Parent directories are created."""
    out = Path(path)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in SAVE_FORMATS:
        raise ValueError(
            f"cannot save a figure as {out.name!r}: use a file name ending in "
            f"{', '.join('.' + f for f in SAVE_FORMATS)}"
        )
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=dpi)
    atomic_write_bytes(out, buffer.getvalue())  # temp file + fsync + os.replace
    return out


def save_figures(figures: Mapping[str, Figure], out_dir: str | os.PathLike) -> list[Path]:
    """Save ``{file name: figure}`` into ``out_dir``; returns the paths written."""
    return [save_figure(fig, Path(out_dir) / name) for name, fig in figures.items()]


def as_array(x: Any, name: str) -> np.ndarray:
    """A tensor, array or nested list as a float64 NumPy array, rejecting NaN/inf."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {arr.shape}); there is nothing to plot")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf values; check the model and its inputs")
    return arr


def check_tokens(tokens: Sequence[str] | None, n: int, name: str) -> list[str] | None:
    """Token labels must match the axis length; they become short, mathtext-safe strings."""
    if tokens is None:
        return None
    tokens = [str(t) for t in tokens]
    if len(tokens) != n:
        raise ValueError(f"{name} has {len(tokens)} labels but the weights have {n} positions")
    return [_short(t) for t in tokens]


def _short(label: str) -> str:
    if not label.strip():  # a whitespace token would be an invisible label
        label = label.replace(" ", "\u2423").replace("\n", "\\n").replace("\t", "\\t")
    if len(label) > MAX_LABEL_CHARS:
        label = label[: MAX_LABEL_CHARS - 1] + "\u2026"
    return label.replace("$", r"\$") or "\u2205"  # '$' would start matplotlib mathtext


def label_axis(ax: Axes, axis: str, tokens: list[str] | None, n: int) -> None:
    """Put token labels on the x or y axis of a heatmap with ``n`` cells. The font shrinks as the
    count grows, down to 5 pt where that makes every label fit; only when even that does not fit
    the axes (or there are more than MAX_TICKS) is every k-th labelled. Long x labels are
    rotated."""
    if tokens is None:
        return
    box = ax.get_position()  # the axes' share of the figure, before layout adjustments
    fig = ax.get_figure()
    assert isinstance(fig, Figure)  # attnlab's axes sit on a Figure (new_figure), no SubFigure
    width, height = fig.get_size_inches()
    room = (box.width * width if axis == "x" else box.height * height) * 72  # points
    # the font shrinks (to 5 pt at the least) before any label is left out
    size = max(5.0, min(9.0, 11.0 - n / 8, room / (1.6 * n)))
    fits = max(2, int(room / (1.6 * size) + 1e-9))  # one label per ~1.6 font heights
    step = max(1, math.ceil(n / min(MAX_TICKS, fits)))
    ticks = list(range(0, n, step))
    if axis == "x":
        widest = max(len(tokens[i].replace("\\", "")) for i in ticks)
        rotation = 90 if widest > 2 or widest * len(ticks) > 48 else 0
        ax.set_xticks(ticks, [tokens[i] for i in ticks], rotation=rotation, fontsize=size)
    else:
        ax.set_yticks(ticks, [tokens[i] for i in ticks], fontsize=size)


def heatmap_inches(rows: int, cols: int) -> tuple[float, float]:
    """Width and height of one heatmap panel so that cells stay roughly square and readable."""
    return min(6.0, max(1.8, 0.22 * cols + 0.7)), min(6.0, max(1.8, 0.22 * rows + 0.7))
