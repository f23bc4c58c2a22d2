"""Attention heatmaps: every layer and head of a Transformer, and Bahdanau alignments.

Row i of a map is query i, column j is key j, and the cell is alpha_ij = softmax_j(q_i^T k_j /
sqrt(d_k)) (004 eq. 9), so every row sums to one (or to zero for a fully masked query).
Self-attention maps are (T, T), cross-attention maps (T, S): target positions over the source.

Shapes: L layers, H heads, T queries, S keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnlab.viz.figure import as_array, check_tokens, heatmap_inches, label_axis, new_figure

MAX_ROW_INCHES = 16.0  # a row of head panels wider than this wraps onto the next row


def plot_attention(
    weights: Any,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str | None = None,
    *,
    cmap: str = "viridis",
    first_layer: int = 1,
) -> Figure:
    """A grid of heatmaps, one row per layer and one column per head (a layer's heads wrap onto
    more rows when a row would be wider than MAX_ROW_INCHES), with one shared colorbar.

    weights: (T, S), (H, T, S) or (L, H, T, S), a tensor or an array. Token labels go on the left
    column (queries) and the bottom row (keys); the colour scale runs from 0 to the largest weight.
    Panels are titled "layer l, head h" counting layers from ``first_layer`` (pass the layer's
    number when plotting a slice, e.g. the last of 3 layers: ``first_layer=3``).
    """
    w = as_array(weights, "attention weights")
    if w.ndim not in (2, 3, 4):
        raise ValueError(
            f"attention weights must be (T, S), (H, T, S) or (L, H, T, S), got shape {w.shape}"
        )
    w = np.expand_dims(w, tuple(range(4 - w.ndim)))  # (L, H, T, S): leading axes of size 1
    n_layers, n_heads, t, s = w.shape
    queries = check_tokens(query_tokens, t, "query_tokens")
    keys = check_tokens(key_tokens, s, "key_tokens")
    panel_w, panel_h = heatmap_inches(t, s)
    # a layer's heads wrap onto several rows of at most `per_row` panels when one row would be
    # wider than MAX_ROW_INCHES (new_figure would otherwise shrink every panel to fit)
    per_row = max(1, min(n_heads, int(MAX_ROW_INCHES // panel_w)))
    rows_per_layer = math.ceil(n_heads / per_row)
    fig = new_figure(per_row * panel_w + 1.6, n_layers * rows_per_layer * panel_h + 1.0)
    grid = fig.subplots(n_layers * rows_per_layer, per_row, squeeze=False, sharex=True, sharey=True)
    vmax = max(float(w.max()), 1e-12)
    image = None
    panels = []  # (row, column, axes) of every layer and head
    for layer in range(n_layers):
        for head in range(n_heads):
            row, col = layer * rows_per_layer + head // per_row, head % per_row
            ax = grid[row, col]
            panels.append((row, col, ax))
            image = ax.imshow(
                w[layer, head],
                cmap=cmap,
                vmin=0.0,
                vmax=vmax,
                aspect="auto",
                interpolation="nearest",
            )
            if n_layers * n_heads > 1:
                ax.set_title(f"layer {first_layer + layer}, head {head + 1}", fontsize=8)
            ax.tick_params(length=2, labelsize=7)
    for row, col, ax in panels:
        if col == 0:
            label_axis(ax, "y", queries, t)
        if row == max(r for r, c, _ in panels if c == col):  # the column's lowest panel
            ax.tick_params(labelbottom=True)
            label_axis(ax, "x", keys, s)
    axes = [ax for _, _, ax in panels]
    for ax in set(grid.flat) - set(axes):
        ax.remove()  # a wrapped layer's last row: no panels past its last head
    assert image is not None  # L, H >= 1: every grid has a panel
    width = fig.get_size_inches()[0]  # keep the bar ~0.25 in wide however large the grid
    fig.colorbar(
        image,
        ax=axes,
        fraction=min(0.15, 1.0 / width),
        pad=0.01,
        aspect=30,
        shrink=0.8 if grid.shape[0] > 1 else 1.0,
        label="attention weight",
    )
    fig.supxlabel("key position (attended to)", fontsize=9)
    fig.supylabel("query position (attending)", fontsize=9)
    if title:
        fig.suptitle(title)
    return fig


def plot_alignment(
    weights: Any,
    src_tokens: Sequence[str] | None = None,
    tgt_tokens: Sequence[str] | None = None,
    title: str | None = "alignment",
) -> Figure:
    """A Bahdanau-style alignment: row t = the target word produced at step t, column j = source
    word j, brightness = alpha_tj (004 eq. 6-8; Bahdanau et al. 2015, Fig. 3: white is 1).

    weights: (T, S), or (1, T, S) / (1, 1, T, S) as returned by a one-head attention decoder.
    """
    w = as_array(weights, "alignment weights")
    while w.ndim > 2 and w.shape[0] == 1:
        w = w[0]
    if w.ndim != 2:
        raise ValueError(f"alignment weights must be (T, S) (one head), got shape {w.shape}")
    t, s = w.shape
    targets = check_tokens(tgt_tokens, t, "tgt_tokens")
    sources = check_tokens(src_tokens, s, "src_tokens")
    panel_w, panel_h = heatmap_inches(t, s)
    fig = new_figure(panel_w * 1.3 + 1.4, panel_h * 1.3 + 0.8)
    ax = fig.subplots()
    image = ax.imshow(w, cmap="gray", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.xaxis.tick_top()  # source along the top, as in the Bahdanau paper
    ax.xaxis.set_label_position("top")
    label_axis(ax, "x", sources, s)
    label_axis(ax, "y", targets, t)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    fig.colorbar(image, ax=ax, label="alignment weight")
    if title:
        fig.suptitle(title)
    return fig
