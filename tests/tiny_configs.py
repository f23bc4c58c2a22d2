"""Small model configs shared by the tests.

TINY, the smallest useful one, for tests that need a model of the right kind but not of any
particular size (checkpoints, resume, export, CLI hints, training-loop plumbing): D 16, 2 heads,
1 layer, F 32, 16 positions. SMALL, for tests that decode or compare numbers (generation, caches):
D 32, 4 heads, 2 layers, F 64."""

from __future__ import annotations

from attnlab.config import ModelConfig

TINY = dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=16)
SMALL = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64)


def tiny_config(kind: str = "decoder_lm", **overrides) -> ModelConfig:
    """``ModelConfig(kind=kind, **TINY)`` with ``overrides`` replacing or adding fields."""
    return ModelConfig(kind=kind, **{**TINY, **overrides})


def small_config(kind: str, vocab_size: int, **overrides) -> ModelConfig:
    """``ModelConfig(kind=kind, vocab_size=vocab_size, **SMALL)`` with ``overrides``."""
    return ModelConfig(kind=kind, vocab_size=vocab_size, **{**SMALL, **overrides})
