"""Tiny models for the explorer tests (test_explore_*.py): built in-process, nothing downloaded."""

from __future__ import annotations

import torch

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer
from attnlab.explore import Session
from attnlab.models import build_model

TOK = CharTokenizer.train(["abcdefghij klmnop"])
TINY = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=24)


def tiny_model(kind: str = "decoder_lm", seed: int = 0, **changes) -> torch.nn.Module:
    """A random-weight model of ``kind`` over TOK's vocabulary (eval mode)."""
    torch.manual_seed(seed)
    cfg = ModelConfig(kind=kind, vocab_size=TOK.vocab_size, **{**TINY, **changes})
    return build_model(cfg).eval()


def tiny_session(kind: str = "decoder_lm", **changes) -> Session:
    return Session(tiny_model(kind, **changes), TOK, name=f"tiny {kind}")
