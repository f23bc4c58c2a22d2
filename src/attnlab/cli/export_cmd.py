"""``attnlab export``: write a trained run as a Hugging Face directory or a safetensors file.

attnlab export --checkpoint runs/x --format hf --out hf-export/      (GPT-2, Llama or BERT)
attnlab export --checkpoint runs/x --format hf-gpt2 --out gpt2-export/
attnlab export --checkpoint runs/x --format safetensors --out model.safetensors
"""

from __future__ import annotations

import argparse

from attnlab.cli import load_checkpoint_lazily
from attnlab.cli.options import add_checkpoint, add_device
from attnlab.interop.export import FORMATS, export_as


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a trained model as a Hugging Face GPT-2 directory or a safetensors file",
        description="Export a trained model. hf-gpt2 (decoder-only LMs with learned positions) "
        "writes config.json + model.safetensors that transformers.GPT2LMHeadModel."
        "from_pretrained loads; safetensors writes one file with attnlab names, config and "
        "tokenizer.",
    )
    add_checkpoint(p)
    add_device(p, default="cpu")
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="hf-gpt2",
        help="hf: a Hugging Face directory in the model's family (Llama for rotary RMSNorm "
        "SwiGLU decoders, GPT-2 for learned positions, BERT for encoders); hf-gpt2: GPT-2 "
        "only; safetensors: one .safetensors file (default: %(default)s)",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="output directory (hf-gpt2) or .safetensors file (safetensors)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing --out (never one inside a checkpoint directory)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    ckpt = load_checkpoint_lazily(args.checkpoint, revision=args.revision, device=args.device)
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
