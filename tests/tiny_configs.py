"""The smallest useful model config, shared by the tests that need a model of the right kind but
not of any particular size (checkpoints, resume, export, CLI hints, training-loop plumbing):
D 16, 2 heads, 1 layer, F 32, 16 positions."""

from __future__ import annotations

from attnlab.config import ModelConfig

TINY = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16)


def tiny_config(kind: str = "decoder_lm", **overrides) -> ModelConfig:
    """``ModelConfig(kind=kind, **TINY)`` with ``overrides`` replacing or adding fields."""
    return ModelConfig(kind=kind, **{**TINY, **overrides})
