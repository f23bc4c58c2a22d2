"""``attnlab export``: write a trained run as a Hugging Face directory or a safetensors file.

attnlab export --checkpoint runs/x --out hf-export/                  (the model's own HF family)
attnlab export --checkpoint runs/x --format hf-gpt2 --out gpt2-export/
attnlab export --checkpoint runs/x --format safetensors --out model.safetensors
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.cli import load_checkpoint_lazily
from attnlab.cli.options import HF_FAMILIES, add_checkpoint, add_device
from attnlab.cli.outputs import outputs, remove_earlier
from attnlab.errors import ConfigError
from attnlab.interop.export import FORMATS, check_export_target, export_as


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a trained model as a Hugging Face directory or a safetensors file",
        description="Export a trained model. hf (the default) writes the Hugging Face directory "
        "(config.json, model.safetensors, the tokenizer) of the family that holds the model "
        "exactly, which transformers' from_pretrained loads with equal outputs; hf-gpt2 insists "
        "on GPT-2; safetensors writes one file with attnlab names, config and tokenizer. A model "
        "a family cannot hold exactly is refused, naming every setting that does not fit.",
    )
    add_checkpoint(p)
    add_device(p, default="cpu")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="hf",
        help=f"hf: a Hugging Face directory in the family that holds the model exactly (one of "
        f"{HF_FAMILIES}); hf-gpt2: GPT-2 only; safetensors: one .safetensors file (default: "
        "%(default)s)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="output directory (hf, hf-gpt2) or .safetensors file (safetensors)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier export at --out (its files, as its manifest lists them; never "
        "a run or checkpoint directory, never files attnlab did not write)",
    )
    p.set_defaults(func=run)


RUN_MARKERS = ("checkpoints", "config.toml", "metrics.jsonl")  # what a training run holds


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    one_file = args.format == "safetensors"
    root, names = (out.parent, {out.name}) if one_file else (out, None)
    if one_file and out.suffix != ".safetensors":
        raise ConfigError(
            f"--out {args.out!r}: --format safetensors writes one .safetensors file, and loaders "
            f"judge a file by its suffix (a .bin is taken for a pickle); name it "
            f"{str(out.with_suffix('.safetensors'))!r}"
        )
    marks = [m for m in RUN_MARKERS if (out / m).exists()] if not one_file else []
    if marks:
        raise ConfigError(
            f"--out {args.out!r} looks like a training run directory (it holds "
            f"{', '.join(marks)}); an export never writes into one (its files would be mixed "
            f"with the export): choose a new --out"
        )
    if args.force:
        check_export_target(out, force=True)  # never inside a checkpoint
        if not one_file and out.is_dir():
            remove_earlier(out, "export")  # its own earlier files, nothing else
    ckpt = load_checkpoint_lazily(args.checkpoint, revision=args.revision, device=args.device)
    # without --force export_as refuses any existing target; with it, only attnlab's are replaced
    with outputs(root, "attnlab export", names=names, check=args.force):
        path = export_as(
            ckpt.model,
            args.format,
            args.out,
            config=ckpt.config,
            tokenizer=ckpt.tokenizer,
            labels=getattr(ckpt, "labels", None),
            force=args.force,
        )
    print(f"exported {args.checkpoint} as {args.format} to {path}")
    return 0
