"""``attnlab demo``: a short tour of the library (replaced by the real main job in the README)."""

from __future__ import annotations

import argparse

import torch

from attnlab.config import ModelConfig
from attnlab.models import build_model
from attnlab.nn import basic_self_attention


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="a one-minute tour: attention on a toy sentence, a tiny model")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    words = ["the", "oven", "cooked", "the", "bread", "so"]
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    x = torch.randn(len(vocab), 8)[torch.tensor([vocab[w] for w in words])]
    y = basic_self_attention(x)
    perm = torch.tensor([0, 4, 2, 3, 1, 5])  # "the bread cooked the oven so"
    same = torch.allclose(basic_self_attention(x[perm]), y[perm], atol=1e-6)
    print(f"basic self-attention is permutation equivariant on {' '.join(words)!r}: {same}")
    cfg = ModelConfig(kind="decoder_lm", vocab_size=len(vocab), d_model=32, n_heads=4)
    model = build_model(cfg)
    n = sum(p.numel() for p in model.parameters())
    print(f"built a decoder-only LM with {n:,} parameters: {cfg}")
    return 0
