"""(x, y) windows over a token stream for language-model training and evaluation.

A window of T + 1 consecutive tokens starting at s gives x = w[s : s+T] and y = w[s+1 : s+T+1]:
position t of x is trained to predict y[t], the token after it.

Training batches are random but reproducible. The global batch at a step is drawn from
``numpy.random.default_rng([seed, step])`` (B * world_size start positions) and rank r takes
rows r*B .. (r+1)*B - 1. So a batch depends only on (seed, step, rank, world_size): training can
resume bit-identically at any step, ranks see different windows, and the union over ranks is
the same as one process drawing the global batch. No global RNG is touched.

Evaluation walks the stream in order with non-overlapping windows (stride T by default), so the
validation loss is always measured on the same fixed set of windows.

Shapes: B batch size, T context length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from attnlab.data.batching import LMBatch
from attnlab.errors import ConfigValueError


def _non_negative(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name}={value!r} must be a non-negative int")


class LMWindows:
    """Random (training) and sequential (evaluation) windows over one 1-D token array."""

    def __init__(self, tokens: np.ndarray | Sequence[int], name: str = "tokens"):
        self.tokens = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
        if self.tokens.ndim != 1:
            raise ValueError(f"{name} must be a 1-D token array, got shape {self.tokens.shape}")
        self.name = name

    def __len__(self) -> int:
        return len(self.tokens)

    def num_starts(self, context_len: int) -> int:
        """How many distinct windows of ``context_len`` (+1 target) tokens fit."""
        self._check_context(context_len)
        return len(self.tokens) - context_len

    def _check_context(self, context_len: int) -> None:
        if not isinstance(context_len, (int, np.integer)) or context_len <= 0:
            raise ConfigValueError(
                f"context_len={context_len!r} must be a positive int", fields=("context_len",)
            )
        if len(self.tokens) < context_len + 1:
            raise ConfigValueError(
                f"{self.name} has {len(self.tokens)} tokens but one window needs context_len + 1 "
                f"= {context_len + 1}; use a shorter context (context_len) or more text (or a "
                f"smaller val_fraction if this is the validation split)",
                fields=("context_len", "val_fraction"),
            )

    def _gather(self, starts: np.ndarray, context_len: int) -> LMBatch:
        idx = starts[:, None] + np.arange(context_len + 1)  # (B, T+1)
        w = torch.from_numpy(self.tokens[idx].astype(np.int64))  # (B, T+1)
        return LMBatch(w[:, :-1].contiguous(), w[:, 1:].contiguous())  # (B, T), (B, T)

    def batch_at(
        self,
        step: int,
        batch_size: int,
        context_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> LMBatch:
        """The training batch of ``step`` for ``rank``: x, y int64 of shape (B, T)."""
        _non_negative(step=step, seed=seed, rank=rank)
        if batch_size <= 0 or world_size <= 0:
            raise ValueError(f"batch_size={batch_size} and world_size={world_size} must be > 0")
        if rank >= world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        n_starts = self.num_starts(context_len)
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, n_starts, size=batch_size * world_size)  # (B * world_size,)
        return self._gather(starts[rank * batch_size : (rank + 1) * batch_size], context_len)

    def eval_starts(
        self, context_len: int, stride: int | None = None, max_windows: int | None = None
    ) -> np.ndarray:
        """Start positions of the fixed evaluation windows (evenly thinned to max_windows)."""
        stride = context_len if stride is None else stride
        if stride <= 0:
            raise ValueError(f"stride={stride} must be positive")
        starts = np.arange(0, self.num_starts(context_len), stride)
        if max_windows is not None and max_windows < len(starts):
            if max_windows <= 0:
                raise ValueError(f"max_windows={max_windows} must be positive")
            starts = starts[np.linspace(0, len(starts) - 1, max_windows).round().astype(int)]
        return starts

    def eval_batches(
        self,
        batch_size: int,
        context_len: int,
        *,
        stride: int | None = None,
        max_windows: int | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> Iterator[LMBatch]:
        """Sequential evaluation batches; the last may be smaller. Rank r gets every
        world_size-th window, so ranks split the fixed set without overlap."""
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be positive")
        starts = self.eval_starts(context_len, stride, max_windows)[rank::world_size]
        for i in range(0, len(starts), batch_size):
            yield self._gather(starts[i : i + batch_size], context_len)
