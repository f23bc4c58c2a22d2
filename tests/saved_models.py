"""Tiny saved checkpoints (random weights made peaked, so greedy output has no near-ties),
shared by the tests of attnlab.generate and the KV-cache option."""

from __future__ import annotations

import torch

from attnlab.checkpoint import save_checkpoint
from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer
from attnlab.models import build_model

TOK = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")


def save(tmp_path, kind: str, name: str, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(
        kind=kind,
        vocab_size=TOK.vocab_size,
        d_model=32,
        n_heads=4,
        n_layers=1,
        d_ff=64,
        max_len=32,
        **kw,
    )
    model = build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    save_checkpoint(tmp_path / name, model=model, config=cfg, tokenizer=TOK, step=1)
    return str(tmp_path / name), model
