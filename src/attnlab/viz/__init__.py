"""Pictures: attention maps, alignments, position encodings and loss curves (matplotlib, Agg).

Every ``plot_*`` function returns a ``matplotlib.figure.Figure``; :func:`save_figure` writes it
atomically. Nothing here opens a window.
"""

from attnlab.viz.attention import plot_alignment, plot_attention
from attnlab.viz.curves import find_metrics_file, plot_loss_curves, read_metrics
from attnlab.viz.figure import save_figure, save_figures
from attnlab.viz.model_maps import AttentionMaps, attention_maps, model_attention_figures
from attnlab.viz.positions import plot_position_encoding

__all__ = [
    "AttentionMaps",
    "attention_maps",
    "find_metrics_file",
    "model_attention_figures",
    "plot_alignment",
    "plot_attention",
    "plot_loss_curves",
    "plot_position_encoding",
    "read_metrics",
    "save_figure",
    "save_figures",
]
