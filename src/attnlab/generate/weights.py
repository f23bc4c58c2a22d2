"""Reduced-precision weights for decoding: ``quantize_weights(model, "int8")`` at load time.

Every ``nn.Linear`` of a language model is swapped for its weight-only counterpart of
:mod:`attnlab.nn.quantized` (same ``in_features``/``out_features``/``bias``, same forward
signature), so attention, positions, norms, the KV cache and the decode loop are untouched and
run in the model's compute dtype. Works the same for trained checkpoints and imported models
(``attnlab.interop``), with or without ``GenerationConfig(compile=True)``.

    mode   weight bits   where                    product
    fp32   32            any device               unchanged (the model as loaded)
    bf16   16            CPU, CUDA with bf16      bf16 ``F.linear`` (warns where a CPU emulates it)
    int8   8 + a scale   CPU                      ``torch._weight_int8pack_mm``
    int4   4 + (a, z)    CPU                      ``torch._weight_int4pack_mm_for_cpu``
           per channel / per group of 64 (or 32) inputs

Why PyTorch's aten kernels and not another route (measurements: benchmarks/ANALYSIS.md,
"Reduced-precision decode" and "Greedy generation"): they ship with torch (no new dependency),
inductor lowers them to themselves under ``torch.compile``, and they widen the codes inside the
kernel, so only the small codes cross the memory bus. The alternatives dequantize the whole
matrix per call in eager mode (``w.to(x.dtype) * scale`` then ``mm``, torchao's CPU fallback) or
need bf16 to be native (inductor widening bf16 weights in its decomposed matrix-vector loop is
far slower than fp32 on a CPU without native bf16).

Tied embeddings: the input embedding stays fp32 (a lookup reads one row per token); the output
head gets its own reduced-precision copy, which is what every token reads in full.

Shapes: K in_features, N out_features.
"""

from __future__ import annotations

import functools
import time
import warnings
from typing import Any

import torch
from torch import nn

from attnlab.models.base import LanguageModel
from attnlab.nn.cache import resolve_cache_dtype
from attnlab.nn.multihead import SelfAttention
from attnlab.nn.quantized import (
    BF16Linear,
    Int4Linear,
    Int8Linear,
    WeightOnlyLinear,
    int4_group_size,
)
from attnlab.nn.recurrent import refuse_cache_dtype
from attnlab.runtime import cpu_has_native_bf16

WEIGHT_MODES = ("fp32", "bf16", "int8", "int4")
_LAYERS = {"bf16": BF16Linear, "int8": Int8Linear, "int4": Int4Linear}
BYTES_PER_WEIGHT = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}


def supported_modes(device: torch.device | str) -> tuple[str, ...]:
    """The weight modes this device runs: fp32 and bf16 on CPU and CUDA, int8/int4 on CPU."""
    device = torch.device(device)
    if device.type == "cpu":
        return WEIGHT_MODES
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return ("fp32", "bf16")
    return ("fp32",)


def quantize_weights(model: nn.Module, mode: str) -> nn.Module:
    """Swap the model's ``nn.Linear`` layers for ``mode``'s weight-only layers, in place.

    ``mode`` is one of :data:`WEIGHT_MODES`; "fp32" leaves the model as it is. Returns the
    model. The model must be a language model (``decoder_lm``, ``rnn_lm``, imported GPT-2) on a
    device that runs the mode (:func:`supported_modes`); it is for inference from then on.
    """
    if mode not in WEIGHT_MODES:
        raise ValueError(f"unknown weights mode {mode!r}; choose from {', '.join(WEIGHT_MODES)}")
    if not isinstance(model, LanguageModel):
        raise TypeError(
            f"reduced-precision weights are for language models (decoder_lm, rnn_lm, imported "
            f"GPT-2); got {type(model).__name__}; use weights='fp32'"
        )
    done = weights_mode(model)
    if done != "fp32":
        raise ValueError(
            f"this model already has {done} weights; load it again to choose another mode"
        )
    if mode == "fp32":
        return model
    device = _device(model)
    if mode not in supported_modes(device):
        raise ValueError(
            f"weights={mode!r} is not supported on {device.type}; supported there: "
            f"{', '.join(supported_modes(device))}"
        )
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    dtypes = {m.weight.dtype for _, m in linears}
    if dtypes - {torch.float32}:
        raise ValueError(
            f"reduced-precision weights start from an fp32 model; this one has "
            f"{sorted(map(str, dtypes))} Linear weights; load it in fp32"
        )
    if mode == "int4":
        bad = [(name, m.in_features) for name, m in linears if not int4_group_size(m.in_features)]
        if bad:
            raise ValueError(
                f"int4 weights need every Linear's input width to be a multiple of 32; "
                f"{bad[0][0]} has {bad[0][1]}; use int8"
            )
    if mode == "bf16" and device.type == "cpu":
        warn_if_bf16_emulated()
    layer = _LAYERS[mode]
    for name, linear in linears:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, layer(linear))
    return model


def check_cache_dtype(model: nn.Module, cache_dtype: str | None) -> None:
    """A clear error up front when ``cache_dtype`` ("fp32", "bf16"; None: the compute dtype)
    is unknown or the model has no KV cache to store in it (recurrent models)."""
    if cache_dtype is None:
        return
    resolve_cache_dtype(cache_dtype)
    if not any(isinstance(m, SelfAttention) for m in model.modules()):
        kind = getattr(getattr(model, "cfg", None), "kind", None) or type(model).__name__
        refuse_cache_dtype(kind, cache_dtype)


def weights_mode(model: nn.Module) -> str:
    """The weight mode of a model: "fp32", or the format of its reduced-precision layers."""
    formats = {m.format for m in model.modules() if isinstance(m, WeightOnlyLinear)}
    return formats.pop() if len(formats) == 1 else "fp32" if not formats else "mixed"


def linear_weight_count(model: nn.Module) -> int:
    """Weights N K of every linear layer (swapped or not): what a decode step reads in full."""
    total = 0
    for m in model.modules():
        if isinstance(m, (nn.Linear, WeightOnlyLinear)):
            total += m.in_features * m.out_features
    return total


def bytes_per_token(model: nn.Module, mode: str) -> float:
    """Bytes of linear-layer weights a batch-1 decode step reads in ``mode``, with the int8
    scales (2 bytes per channel) and the int4 scale/offset pairs (4 bytes per group)."""
    total = 0.0
    for m in model.modules():
        if isinstance(m, (nn.Linear, WeightOnlyLinear)):
            n, k = m.out_features, m.in_features
            total += n * k * BYTES_PER_WEIGHT[mode]
            if mode == "int8":
                total += 2 * n
            elif mode == "int4":
                total += 4 * n * (k // (int4_group_size(k) or k))
    return total


def warn_if_bf16_emulated() -> None:
    """Warn, with the measured cost, when this CPU has no native bf16 products."""
    if cpu_has_native_bf16():
        return
    fp32_ms, bf16_ms = bf16_product_cost()
    warnings.warn(
        f"weights='bf16' on a CPU without native bfloat16 products (no AVX-512 BF16 / AMX): "
        f"PyTorch emulates them; a 1 x 2048 x 2048 product took {bf16_ms:.2f} ms against "
        f"{fp32_ms:.2f} ms in fp32 here ({bf16_ms / fp32_ms:.1f}x); int8 is usually faster",
        stacklevel=3,
    )


@functools.cache
def bf16_product_cost(reps: int = 20) -> tuple[float, float]:
    """Milliseconds per (1, 2048) x (2048, 2048) product: (fp32, bf16), best of ``reps``."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(2048, 2048, generator=gen)
    x = torch.randn(1, 2048, generator=gen)
    return _best_ms(lambda: x @ w.T, reps), _best_ms(
        functools.partial(torch.matmul, x.bfloat16(), w.bfloat16().T), reps
    )


def _best_ms(fn: Any, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _device(model: nn.Module) -> torch.device:
    tensor = next(model.parameters(), None)
    return tensor.device if tensor is not None else torch.device("cpu")
