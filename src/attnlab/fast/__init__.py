"""attnlab's engine: the CPU fast paths, kept apart from the plain forms of ``attnlab.nn``.

The plain modules are what every model runs by default and what a reader of the notes studies.
The engine is opt-in by one switch -- ``build_model(cfg, fast=True)``, ``ModelConfig(fast=True)``
or ``attnlab train --fast`` -- and replaces modules by drop-in subclasses that own the same
parameters and hook points and compute the same function (tested in value and gradient,
tests/test_fast_*.py). Each path is kept only while it earns its place on a real workload
(``benchmarks/fast_ab.py``; the table is in benchmarks/ANALYSIS.md, "Fast paths"):

* packed teacher forcing with attention on row groups (:mod:`attnlab.fast.packing`,
  :mod:`attnlab.fast.models`): encoder and encoder-decoder training on padded batches;
* the compiled decode step called without dynamo once its inputs are known
  (:mod:`attnlab.fast.replay`): ``generate(compile=True)`` on a fast model.

A fast module runs its plain form whenever one of its hook points is active, so
``attnlab.inspect`` reads the same values on both. The engine plugs in from above: nothing below
it imports this package. ``build_model`` reaches :func:`accelerate` through the slot this package
fills (:func:`attnlab.models.build.plug_engine`), and a fast model carries its own compiled decode
step (``decode_step``, :mod:`attnlab.fast.replay`), which ``attnlab.generate`` asks it for.
"""

from __future__ import annotations

from torch import nn

from attnlab.fast.attention import FastCrossAttention, FastSelfAttention
from attnlab.fast.models import (
    FAST_CLASSES,
    FastDecoderLM,
    FastTransformerEncoder,
    FastTransformerEncoderDecoder,
)
from attnlab.models.build import plug_engine
from attnlab.nn.multihead import CrossAttention, SelfAttention

ENGINE: dict[type, type] = {
    SelfAttention: FastSelfAttention,
    CrossAttention: FastCrossAttention,
    **FAST_CLASSES,
}


def accelerate(model: nn.Module) -> nn.Module:
    """Put ``model`` on the engine, in place, and return it.

    Every module whose class has a fast form (exactly that class: a subclass someone wrote is
    left alone) becomes an instance of it; parameters, buffers and hooks stay as they are.
    """
    for module in model.modules():
        fast = ENGINE.get(type(module))
        if fast is not None:
            module.__class__ = fast
    return model


def is_fast(model: nn.Module) -> bool:
    """True when ``model`` (or a module inside it) runs on the engine (see :func:`accelerate`)."""
    fast = set(ENGINE.values())
    return any(type(m) in fast for m in model.modules())


plug_engine(accelerate)  # build_model(cfg, fast=True) reaches the engine through this


__all__ = [
    "ENGINE",
    "FastCrossAttention",
    "FastDecoderLM",
    "FastSelfAttention",
    "FastTransformerEncoder",
    "FastTransformerEncoderDecoder",
    "accelerate",
    "is_fast",
]
