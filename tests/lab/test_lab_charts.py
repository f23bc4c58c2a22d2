"""kit/charts: coinciding series stay visible (each its own width, marker and dashes) and
multi-panel attention maps label every row and column, however many tokens."""

from __future__ import annotations

import torch

from attnlab.lab.kit.charts import heatmap_panels, line_chart, series_style


def test_coinciding_series_are_drawn_distinguishably():
    xs = [8, 16, 32, 48]
    fig = line_chart(
        {name: (xs, [1.0] * 4) for name in ("a", "b", "c", "d")},
        xlabel="T", ylabel="accuracy", title="four arms at accuracy 1",
    )  # fmt: skip
    lines = fig.axes[0].get_lines()
    styles = [(ln.get_marker(), str(ln.get_linestyle()), ln.get_linewidth()) for ln in lines]
    assert len({s[0] for s in styles}) == 4 and len({s[2] for s in styles}) == 4
    widths = [ln.get_linewidth() for ln in lines]
    sizes = [ln.get_markersize() for ln in lines]
    assert widths == sorted(widths, reverse=True) and sizes == sorted(sizes, reverse=True)
    # the earlier (wider, larger) series shows around a later one drawn on top
    assert series_style(0, 2, True)["markersize"] > series_style(1, 2, True)["markersize"]
    assert "marker" not in series_style(0, 2, False)  # long curves: width only


def test_heatmap_panels_label_every_row_and_column():
    n = 60  # more than viz's thinning limit (48)
    tokens = [f"t{i}" for i in range(n)]
    w = torch.rand(n, n).softmax(-1)
    fig = heatmap_panels([(w, tokens, tokens, "a"), (w.T, tokens, tokens, "b")], title="x")
    for ax in fig.axes[:2]:
        assert [t.get_text() for t in ax.get_xticklabels()] == tokens
        assert [t.get_text() for t in ax.get_yticklabels()] == tokens


def test_integer_x_values_get_integer_ticks():
    fig = line_chart({"a": ([1, 2, 3], [0.5, 0.4, 0.3])}, xlabel="layer", ylabel="y", title="t")
    fig.canvas.draw()
    ticks = [t for t in fig.axes[0].get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
