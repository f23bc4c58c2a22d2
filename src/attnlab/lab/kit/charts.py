"""Simple line and bar charts for experiment reports (Agg figures, via ``attnlab.viz``).

Attention maps, alignments, position encodings and single-run loss curves live in
:mod:`attnlab.viz`; these are the comparisons an experiment needs: several runs' curves on one
axis, or one number per variant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from attnlab.lab.kit.report import FigureRef
from attnlab.lab.kit.seeds import bands, spread
from attnlab.viz.figure import as_array, check_tokens, new_figure, save_figure


def line_chart(
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    logx: bool = False,
    logy: bool = False,
    markers: bool = True,
    bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
    hline: float | None = None,
    vline: float | None = None,
) -> Figure:
    """One line per ``label -> (xs, ys)``; ``bands[label] = (lows, highs)`` shades the spread
    over seeds (min-max) around that line. ``hline`` / ``vline`` draw a dashed grey guide at
    that y / x (a baseline, a threshold, the longest training length).

    Series that coincide (several arms at accuracy 1) stay visible: each later series is drawn
    thinner, with a smaller marker of its own shape and its own dash pattern
    (:func:`series_style`), so the earlier ones show around and between it. Integer x values
    (layers, head counts, lengths) get integer ticks only."""
    fig = new_figure(6.4, 4.2)
    ax = fig.subplots()
    for k, (label, (xs, ys)) in enumerate(series.items()):
        dots = markers and len(xs) <= 30
        (line,) = ax.plot(list(xs), list(ys), label=label, **series_style(k, len(series), dots))
        if bands and label in bands:
            lo, hi = bands[label]
            ax.fill_between(
                list(xs), list(lo), list(hi), color=line.get_color(), alpha=0.18, linewidth=0
            )
    if hline is not None:
        ax.axhline(hline, color="gray", linestyle="--", linewidth=1)
    if vline is not None:
        ax.axvline(vline, color="gray", linestyle="--", linewidth=1)
    if logx:
        ax.set_xscale("log", base=2)
    elif all(float(x).is_integer() for xs, _ in series.values() for x in xs):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers, heads, bins: no 2.5
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


LINESTYLES = ("-", (0, (5, 2)), (0, (3, 1, 1, 1)), (0, (1, 1)))  # solid, dash, dash-dot, dot
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def series_style(k: int, n: int, markers: bool) -> dict[str, Any]:
    """Line and marker style of series ``k`` of ``n``: the first drawn widest with the largest
    marker, each later one narrower and smaller, with its own marker shape and dash pattern
    (with markers; long curves stay solid), so coinciding series do not hide each other."""
    shrink = k / max(1, n - 1)  # 0 for the first series, 1 for the last
    style: dict[str, Any] = {"linewidth": 2.6 - 1.4 * shrink}
    if markers:
        style |= {
            "marker": MARKERS[k % len(MARKERS)],
            "markersize": 8.0 - 4.5 * shrink,
            "linestyle": LINESTYLES[k % len(LINESTYLES)],
        }
    return style


def seeds_chart(
    curves: Mapping[str, tuple[Sequence[float], Sequence[Sequence[float]]]], **kwargs
) -> Figure:
    """:func:`line_chart` of runs repeated over seeds: ``label -> (xs, one ys per seed)`` draws
    the mean over seeds, with a band over their min-max when there are several."""
    series, spreads = {}, {}
    for label, (xs, runs) in curves.items():
        mean, lo, hi = bands(runs)
        series[label] = (xs, mean)
        if len(runs) > 1:
            spreads[label] = (lo, hi)
    return line_chart(series, bands=spreads, **kwargs)


def curves_chart(
    curves: Mapping[str, Sequence[float] | Sequence[Sequence[float]]],
    *,
    title: str,
    ylabel: str = "training loss",
    smooth: int = 10,
    logy: bool = False,
) -> Figure:
    """Loss curves of several runs against the step, smoothed by a running mean of ``smooth``.

    A label may map to one curve or to one curve per seed; with several, the line is the mean
    over seeds and a band shades their min-max (:func:`seeds_chart`)."""
    smoothed = {}
    for label, ys in curves.items():
        runs: list[list[float]] = (
            [list(cast(Sequence[float], r)) for r in ys]
            if ys and isinstance(ys[0], Sequence)
            else [list(cast(Sequence[float], ys))]
        )
        length = min(len(r) for r in runs)
        smoothed[label] = (range(length), [_running_mean(r[:length], smooth) for r in runs])
    return seeds_chart(
        smoothed, xlabel="step", ylabel=ylabel, title=title, logy=logy, markers=False
    )


def _running_mean(ys: list[float], smooth: int) -> list[float]:
    k = max(1, min(smooth, len(ys)))
    return [
        sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1])
        for i in range(len(ys))
    ]


def seeds_bars(per_seed: Mapping[str, Sequence[float]], **options: Any) -> Figure:
    """:func:`bar_chart` of per-seed values: each bar the mean over seeds, its error bar the
    seeds' min-max range; ``options`` are bar_chart's (ylabel, title, reference, ...)."""
    means = {k: spread(list(v))["mean"] for k, v in per_seed.items()}
    return bar_chart(means, errors={k: (min(v), max(v)) for k, v in per_seed.items()}, **options)


def bar_chart(
    values: Mapping[str, float],
    *,
    ylabel: str,
    title: str,
    reference: float | None = None,
    reference_label: str = "chance",
    errors: Mapping[str, tuple[float, float]] | None = None,
    references: Mapping[str, float] | None = None,
) -> Figure:
    """One bar per ``label -> value`` (the mean over seeds), with optional error bars
    ``errors[label] = (min, max)`` over seeds and a dashed reference line (e.g. chance).

    Long or many labels are rotated so they never overprint; the value sits above each bar
    (above its error bar when there is one). ``references[label]`` draws a dashed segment across
    that bar alone (a per-bar chance level, when the bars' tasks have different chance)."""
    labels = list(values)
    long = sum(len(k) for k in labels) > 45 or len(labels) > 6
    fig = new_figure(max(6.4, 0.75 * len(labels) + 2.0), 4.6 if long else 4.0)
    ax = fig.subplots()
    heights = [values[k] for k in labels]
    yerr = None
    if errors and any(lo != hi for lo, hi in errors.values()):  # one seed: no bars to draw
        lo = [max(0.0, values[k] - errors.get(k, (values[k], values[k]))[0]) for k in labels]
        hi = [max(0.0, errors.get(k, (values[k], values[k]))[1] - values[k]) for k in labels]
        yerr = [lo, hi]
    bars = ax.bar(
        range(len(labels)),
        heights,
        color="tab:blue",
        alpha=0.8,
        yerr=yerr,
        capsize=3 if yerr else 0,
        error_kw={"elinewidth": 1},
    )
    tops = heights if yerr is None else [h + e for h, e in zip(heights, yerr[1])]
    for x, (top, h) in enumerate(zip(tops, heights)):
        ax.annotate(
            f"{h:.3g}",
            (x, top),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(
        labels, rotation=30 if long else 0, ha="right" if long else "center", fontsize=8
    )
    ax.margins(y=0.12)
    del bars
    if references:
        for x, k in enumerate(labels):
            if k in references:
                ax.hlines(
                    references[k],
                    x - 0.45,
                    x + 0.45,
                    colors="tab:red",
                    linestyles="--",
                    linewidth=1,
                    label=reference_label if x == 0 else "_nolegend_",
                )
        ax.legend(fontsize=8, loc="lower right")
    if reference is not None:
        ax.axhline(reference, color="tab:red", linestyle="--", linewidth=1, label=reference_label)
        ax.legend(fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    return fig


def heatmap_panels(
    panels: Sequence[tuple[object, Sequence[str], Sequence[str], str]],
    *,
    title: str,
    cmap: str = "viridis",
) -> Figure:
    """Side-by-side heatmaps, each ``(weights (T, S), query tokens, key tokens, panel title)``,
    on one colour scale from 0 to the largest weight (e.g. attention on two sentences).

    Every row and column is labelled (none thinned out): the panels grow with the token count
    (about 0.15 inch per label), so a reader can name each cell."""
    arrays = [as_array(w, "weights") for w, _, _, _ in panels]
    vmax = max(max(float(a.max()) for a in arrays), 1e-12)
    cols_max = max(a.shape[1] for a in arrays)
    rows_max = max(a.shape[0] for a in arrays)
    fig = new_figure(
        max(3.6, 0.15 * cols_max + 1.0) * len(panels) + 1.2, max(3.9, 0.15 * rows_max + 1.4)
    )
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    image = None
    for ax, a, (_, rows, cols, sub) in zip(axes, arrays, panels):
        image = ax.imshow(a, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
        _label_every(ax, check_tokens(rows, a.shape[0], "query tokens"), "y")
        _label_every(ax, check_tokens(cols, a.shape[1], "key tokens"), "x")
        ax.set_title(sub, fontsize=9)
    assert image is not None  # panels is not empty
    fig.colorbar(image, ax=list(axes), label="attention weight", shrink=0.9)
    fig.suptitle(title, fontsize=10)
    return fig


def _label_every(ax: Axes, tokens: list[str] | None, axis: str) -> None:
    """A tick label on every cell of a heatmap axis (x labels longer than 2 characters turned
    upright); the font shrinks gently as the count grows."""
    if tokens is None:
        return
    size = max(5.0, min(9.0, 11.0 - len(tokens) / 8))
    if axis == "x":
        upright = max(len(t) for t in tokens) > 2 or len(tokens) > 24
        ax.set_xticks(range(len(tokens)), tokens, rotation=90 if upright else 0, fontsize=size)
    else:
        ax.set_yticks(range(len(tokens)), tokens, fontsize=size)


def dodged(xs: Sequence[float], k: int, n: int, share: float = 0.012) -> list[float]:
    """``xs`` shifted sideways for series ``k`` of ``n`` (by ``share`` of the x range per
    series), so that series lying on top of each other (e.g. several arms at accuracy 1) stay
    visible; say so in the caption."""
    width = share * (max(xs) - min(xs))
    return [x + width * (k - (n - 1) / 2) for x in xs]


def integer_xticks(fig: Figure, xs: Sequence[int], most: int = 16) -> Figure:
    """Ticks at the integer x values themselves (lengths, positions, bins), at most ``most``."""
    fig.axes[0].set_xticks(list(xs)[:: max(1, math.ceil(len(xs) / most))])
    return fig


def save_chart(fig: Figure, out_dir: Path, file: str, caption: str) -> FigureRef:
    """Save ``fig`` as ``out_dir/file`` and return the reference the report embeds."""
    save_figure(fig, Path(out_dir) / file)
    return FigureRef(file, caption)
