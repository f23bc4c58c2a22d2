"""A preallocated key/value cache for autoregressive decoding.

Keys and values of past positions never change in a causal decoder, so each layer keeps them in a
buffer allocated once for ``max_len`` positions and writes new ones in place (no re-concatenation
per token). Shapes: B batch, H heads, L = max_len, Dk/Dv per-head widths.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
    ):
        self.k = torch.zeros(batch_size, n_heads, max_len, d_head, dtype=dtype, device=device)
        self.v = torch.zeros(batch_size, n_heads, max_len, d_v, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.size(2)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k (B, H, T, Dk), v (B, H, T, Dv) at the end; return all of them (B, H, S, .)."""
        t = k.size(2)
        end = self.length + t
        if end > self.max_len:
            raise ValueError(
                f"KV cache overflow: {end} positions but the cache holds {self.max_len}; "
                "allocate a longer cache or slide the window"
            )
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search): (B',) int64."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def crop(self, length: int) -> None:
        """Forget everything after ``length`` positions."""
        self.length = min(self.length, length)
