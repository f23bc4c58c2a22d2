"""A preallocated key/value cache for autoregressive decoding.

Keys and values of past positions never change in a causal decoder, so each layer keeps them in a
buffer allocated once for ``max_len`` positions and writes new ones in place (no re-concatenation
per token). Shapes: B batch, H heads (the key/value heads H_kv with grouped-query attention: the
cache is that much smaller), L = max_len, Dk/Dv per-head widths.

With sliding-window attention (window W) no query ever looks further back than W - 1 keys, so
the cache is trimmed to the window: it holds at most 2W positions, and when full it keeps only the
last W - 1 (one copy every W + 1 tokens instead of a copy per token). ``start`` is then the
absolute position of the first key held; ``length`` always counts every token consumed.

The buffers have their own dtype (:data:`CACHE_DTYPES`): by default the model's compute dtype,
or bf16 to halve the bytes a decode step reads per cached position (``GenerationConfig
(cache_dtype="bf16")``). New keys/values are rounded to it when written; attention reads them
back in that dtype (``attnlab.nn.attention.scaled_dot_product_attention`` widens them to the
query's).
"""

from __future__ import annotations

import torch
from torch import Tensor

CACHE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def resolve_cache_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """A cache dtype by name ("fp32", "bf16"), a torch dtype among those, or None (the model's
    compute dtype); anything else is refused with the supported names."""
    if name is None or isinstance(name, torch.dtype) and name in CACHE_DTYPES.values():
        return name
    if isinstance(name, str) and name in CACHE_DTYPES:
        return CACHE_DTYPES[name]
    raise ValueError(
        f"unsupported KV cache dtype {name!r}; choose from {', '.join(CACHE_DTYPES)} "
        "(or leave it unset for the model's compute dtype)"
    )


class KVCache:
    """Per-layer cache: k (B, H, L, Dk) and v (B, H, L, Dv) buffers and a fill ``length``."""

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        max_len: int,
        d_head: int,
        d_v: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | None = None,
        window: int | None = None,
    ):
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window={window!r} must be a positive int or None")
        self.window = window
        self.limit = max_len  # the most positions one sequence may consume
        size = max_len if window is None else min(max_len, 2 * window)
        self.k = torch.zeros(batch_size, n_heads, size, d_head, dtype=dtype, device=device)
        self.v = torch.zeros(batch_size, n_heads, size, d_v, dtype=dtype, device=device)
        self.length = 0  # tokens consumed (the absolute position of the next one)
        self.start = 0  # absolute position of the first key held (> 0 once trimmed)

    @property
    def max_len(self) -> int:
        return self.limit

    @property
    def held(self) -> int:
        """Positions stored now: length - start."""
        return self.length - self.start

    def start_after(self, t: int) -> int:
        """``start`` once T more tokens are appended (the window keeps the last W - 1 old keys
        when the buffer cannot take T more)."""
        if self.window is None or self.held + t <= self.k.size(2):
            return self.start
        return max(self.start, self.length - (self.window - 1))

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k (B, H, T, Dk), v (B, H, T, Dv) after the held keys; return every key and value
        held, (B, H, S, .) with S = length - start (all of them without a window)."""
        t = k.size(2)
        if k.size(0) != self.k.size(0):
            raise ValueError(
                f"the KV cache holds a batch of {self.k.size(0)} sequences, the new keys "
                f"{k.size(0)}: make a cache for this batch (model.new_cache({k.size(0)}, ...))"
            )
        if self.length + t > self.limit:
            raise ValueError(
                f"KV cache overflow: {self.length + t} positions but the cache holds "
                f"{self.limit}; allocate a longer cache or slide the window"
            )
        start = self.start_after(t)
        if start != self.start:  # drop keys no new query can see (outside every window)
            keep = self.length - start
            self.k[:, :, :keep] = self.k[:, :, self.held - keep : self.held].clone()
            self.v[:, :, :keep] = self.v[:, :, self.held - keep : self.held].clone()
            self.start = start
        held, end = self.held, self.held + t
        if end > self.k.size(2):  # a prefill longer than the buffer: grow it once
            self.k = _grow(self.k, end)
            self.v = _grow(self.v, end)
        self.k[:, :, held:end] = k
        self.v[:, :, held:end] = v
        self.length += t
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search): (B',) int64."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def crop(self, length: int) -> None:
        """Forget everything after ``length`` positions (not before ``start``)."""
        if length < self.start:
            raise ValueError(
                f"cannot crop a window-trimmed cache to {length} positions: it starts at "
                f"{self.start}"
            )
        self.length = min(self.length, length)


def _grow(buffer: Tensor, size: int) -> Tensor:
    """(B, H, L, D) -> (B, H, size, D), the old positions first."""
    b, h, n, d = buffer.shape
    out = buffer.new_zeros(b, h, size, d)
    out[:, :, :n] = buffer
    return out
