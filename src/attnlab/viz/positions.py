"""The position-encoding matrix as a picture (004 eq. 16; Vaswani et al. 2017, §3.5).

PE(n, 2i) = sin(n / 10000^(2i/D)), PE(n, 2i+1) = cos(n / 10000^(2i/D)): each pair of columns is a
sinusoid whose wavelength grows geometrically with i, from 2*pi to 10000 * 2*pi. The heatmap shows
fast stripes on the left and slow ones on the right; the side panel plots a few columns against n
so the frequencies can be read off. A learned table (000, ``LearnedPositions.table``) can be drawn
the same way, and so can any position scheme's own description (``scheme.describe(positions)``,
``attnlab.nn.positional``): its table (rotary angles, ALiBi's bias of head 0, ...) with its
column labels; nothing here re-derives a scheme's maths.

Shapes: N positions, D model width.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from attnlab.nn.positional import PositionDescription
from attnlab.viz.figure import as_array, new_figure


def plot_position_encoding(
    table: Any, title: str | None = "sinusoidal position encoding", *, n_curves: int = 4
) -> Figure:
    """Heatmap of a position table (N, D) plus line plots of ``n_curves`` of its columns.

    The colour scale is symmetric around 0. Build the sinusoid table with
    ``attnlab.nn.sinusoidal_table(torch.arange(N), D)``, or pass a scheme's
    :class:`~attnlab.nn.positional.PositionDescription` (its values, titled by its kind).
    """
    if isinstance(table, PositionDescription):
        if table.values is None:
            raise ValueError(f"the {table.kind!r} position scheme has no table to draw")
        title = f"{table.kind} positions: {table.equation}" if title is not None else None
        table = table.values
    pe = as_array(table, "position table")
    if pe.ndim != 2:
        raise ValueError(f"a position table must be (N, D), got shape {pe.shape}")
    n, d = pe.shape
    fig = new_figure(min(14.0, 6.0 + d / 16), min(8.0, 3.5 + n / 40))
    heat, curves = fig.subplots(1, 2, width_ratios=[3, 2])
    limit = max(float(abs(pe).max()), 1e-12)
    image = heat.imshow(
        pe, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest"
    )
    heat.set_xlabel("dimension i")
    heat.set_ylabel("position n")
    fig.colorbar(image, ax=heat, label="PE(n, i)")
    columns = sorted({min(d - 1, (k * d) // (2 * max(n_curves, 1)) * 2) for k in range(n_curves)})
    for col in columns:  # even columns: the sine of each frequency, fastest first
        curves.plot(range(n), pe[:, col], label=f"i = {col}", linewidth=1.2)
    curves.set_xlabel("position n")
    curves.set_title("selected columns i", fontsize=10)
    curves.legend(fontsize=8, loc="lower left")
    curves.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig
