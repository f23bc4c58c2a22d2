"""``attnlab plot``: attention maps of a trained model, position encodings, loss curves.

attnlab plot attention --checkpoint runs/x --input "the cat sat" --out plots/
attnlab plot attention --checkpoint runs/mt --input "hello" --target "bonjour" --out plots/
attnlab plot positions --d-model 128 --max-len 100 --out pe.png
attnlab plot loss --run runs/x --out loss.png
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

import torch

from attnlab.budget import check_allocation
from attnlab.cli import load_checkpoint_lazily
from attnlab.cli.options import add_checkpoint, add_device
from attnlab.cli.outputs import outputs
from attnlab.data.unknown import unknown_characters
from attnlab.errors import CheckpointError, UserError
from attnlab.nn import sinusoidal_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw attention maps, position encodings or loss curves",
        description="Draw figures as PNG/PDF/SVG files (no window is opened).",
    )
    kinds = p.add_subparsers(dest="plot", metavar="WHAT", required=True)

    a = kinds.add_parser("attention", help="every layer and head of a trained model on one input")
    add_checkpoint(a, metavar="RUN")
    add_device(a, default="cpu")
    a.add_argument(
        "--input",
        required=True,
        metavar="TEXT",
        help="the text to run (the source, for a seq2seq model)",
    )
    a.add_argument(
        "--target",
        metavar="TEXT",
        default=None,
        help="seq2seq only: the target to teacher-force (default: the model's greedy output)",
    )
    a.add_argument("--out", required=True, metavar="DIR", help="directory for the PNG files")
    a.set_defaults(func=run_attention)

    pos = kinds.add_parser("positions", help="the sinusoidal position-encoding matrix (004 eq. 16)")
    pos.add_argument("--d-model", type=int, default=128, help="encoding width D (default 128)")
    pos.add_argument("--max-len", type=int, default=100, help="number of positions N (default 100)")
    pos.add_argument(
        "--base",
        type=float,
        default=10000.0,
        help="wavelength base of the sinusoids (default 10000)",
    )
    pos.add_argument("--out", required=True, metavar="FILE", help="image file (.png/.pdf/.svg)")
    pos.set_defaults(func=run_positions)

    loss = kinds.add_parser("loss", help="train/val loss and learning rate against the step")
    loss.add_argument(
        "--run",
        required=True,
        metavar="RUN_DIR",
        help="run directory (with metrics.jsonl) or a metrics JSONL file",
    )
    loss.add_argument("--out", required=True, metavar="FILE", help="image file (.png/.pdf/.svg)")
    loss.add_argument("--log-y", action="store_true", help="logarithmic loss axis")
    loss.set_defaults(func=run_loss)


def run_attention(args: argparse.Namespace) -> int:
    from attnlab.viz import model_attention_figures, save_figures

    ckpt = load_checkpoint_lazily(args.checkpoint, revision=args.revision, device=args.device)
    if ckpt.tokenizer is None:
        raise CheckpointError(
            f"checkpoint {str(ckpt.path)!r} has no tokenizer.json, so the "
            "input text cannot be encoded; train with a tokenizer"
        )
    for flag, text in (("--input", args.input), ("--target", args.target)):
        warn_unknown(ckpt.tokenizer, text, flag)
    figures = model_attention_figures(ckpt.model, ckpt.tokenizer, args.input, args.target)
    with outputs(Path(args.out), "attnlab plot attention", names=set(figures)):
        paths = save_figures(figures, args.out)
    for path in paths:
        print(f"wrote {path}")
    return 0


def figure_file(out: str) -> Path:
    """``--out`` of a one-figure plot: a file name (a directory there is an error, not a write
    into a temporary name inside it)."""
    if Path(out).is_dir():
        raise UserError(
            f"--out {out!r} is a directory; give the figure's file name, e.g. "
            f"{str(Path(out) / 'figure.png')!r}"
        )
    return Path(out)


def warn_unknown(tokenizer: Any, text: str | None, flag: str) -> None:
    """Name the characters of ``text`` the tokenizer maps to <unk>: the maps would label them
    all <unk>, and the model reads them as one token it rarely saw."""
    unknown = unknown_characters(tokenizer, text or "")
    if unknown:
        warnings.warn(
            f"{flag} has characters the tokenizer does not know: "
            f"{', '.join(repr(c) for c in unknown[:10])}; the maps show each as <unk>, so "
            "write the text in the alphabet the model was trained on",
            UserWarning,
            stacklevel=2,
        )


def run_positions(args: argparse.Namespace) -> int:
    from attnlab.viz import plot_position_encoding, save_figure

    for flag, value in (("--d-model", args.d_model), ("--max-len", args.max_len)):
        if value < 1:
            raise ValueError(f"{flag} must be a positive integer, got {value}")
    if not 1.0 < args.base < float("inf"):
        raise ValueError(f"--base must be a finite number > 1, got {args.base}")
    check_allocation(  # the fp32 table, its angles and the figure's copy of it
        16 * args.d_model * args.max_len,
        f"a position-encoding plot of {args.max_len:,} x {args.d_model:,} values",
        "lower --d-model or --max-len (the figure shows a few hundred of each well)",
    )
    table = sinusoidal_table(torch.arange(args.max_len), args.d_model, args.base)  # (N, D)
    title = f"sinusoidal position encoding, D={args.d_model}, N={args.max_len}"
    out = figure_file(args.out)
    with outputs(out.parent, "attnlab plot positions", names={out.name}):
        print(f"wrote {save_figure(plot_position_encoding(table, title), out)}")
    return 0


def run_loss(args: argparse.Namespace) -> int:
    from attnlab.viz import find_metrics_file, plot_loss_curves

    out = figure_file(args.out)
    metrics = find_metrics_file(args.run)
    with outputs(out.parent, "attnlab plot loss", names={out.name}):
        plot_loss_curves(metrics, out, title=str(args.run), log_y=args.log_y)
    print(f"wrote {args.out} from {metrics}")
    return 0
