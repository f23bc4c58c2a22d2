"""Length-bucketed batching and deterministic splits for padded (seq2seq, classification) data.

Padding wastes compute in proportion to the spread of lengths inside a batch. The bucket
sampler (as in fairseq / torchtext's BucketIterator) shuffles the examples, cuts the shuffled
order into pools of ``pool_size`` batches, sorts each pool by length, cuts it into batches
(a fixed ``batch_size`` or a ``max_tokens`` budget of padded tokens), and shuffles the batches.
Every random choice comes from ``numpy.random.default_rng([seed, epoch])``: no global RNG.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def _check_seed(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name}={value!r} must be a non-negative int")


class BucketBatchSampler:
    """Batches of example indices with similar lengths; usable as a DataLoader ``batch_sampler``.

    ``lengths[i]`` is the padded size of example i (e.g. ``max(len(src), len(tgt) + 1)``).
    Give exactly one of ``batch_size`` (examples per batch) or ``max_tokens`` (a budget on
    ``n_examples * longest`` per batch; an example longer than the budget gets a batch alone).
    Call ``set_epoch(e)`` (or use ``batches(epoch=e)``) for a new deterministic order each epoch;
    with ``world_size > 1`` rank r takes every world_size-th batch.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        pool_size: int = 100,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        if (batch_size is None) == (max_tokens is None):
            raise ValueError("give exactly one of batch_size or max_tokens")
        for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
            if value is not None and value <= 0:
                raise ValueError(f"{name}={value} must be positive")
        if pool_size <= 0:
            raise ValueError(f"pool_size={pool_size} must be positive")
        _check_seed(seed=seed)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.ndim != 1 or len(self.lengths) == 0:
            raise ValueError("lengths must be a non-empty 1-D sequence of ints")
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.pool_size, self.shuffle, self.drop_last = pool_size, shuffle, drop_last
        self.seed, self.epoch = seed, 0
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch: int) -> None:
        _check_seed(epoch=epoch)
        self.epoch = epoch

    def batches(
        self, epoch: int | None = None, rank: int | None = None, world_size: int | None = None
    ) -> list[list[int]]:
        """The batches of one epoch (a pure function of seed, epoch, rank, world_size)."""
        epoch = self.epoch if epoch is None else epoch
        rank = self.rank if rank is None else rank
        world_size = self.world_size if world_size is None else world_size
        _check_seed(epoch=epoch, rank=rank)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        pool = self.pool_size * (self.batch_size or max(1, self._budget() // self._mean_len()))
        out: list[list[int]] = []
        for start in range(0, n, pool):
            chunk = order[start : start + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            out.extend(self._cut(chunk.tolist()))
        if self.shuffle:
            out = [out[i] for i in rng.permutation(len(out))]
        return out[rank::world_size]

    def _budget(self) -> int:
        """max_tokens, given whenever batch_size is not (``__init__`` checks one of them)."""
        assert self.max_tokens is not None
        return self.max_tokens

    def _mean_len(self) -> int:
        return max(1, int(self.lengths.mean()))

    def _cut(self, indices: list[int]) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for i in indices:
            size = int(self.lengths[i])
            if self.batch_size is not None:
                full = len(current) == self.batch_size
            else:
                full = bool(current) and (len(current) + 1) * max(longest, size) > self._budget()
            if full:
                batches.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, size)
        if current and not (self.drop_last and self.batch_size and len(current) < self.batch_size):
            batches.append(current)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches())

    def __len__(self) -> int:
        return len(self.batches())


def split_items(
    items: Sequence[T], val_fraction: float = 0.1, seed: int = 0
) -> tuple[list[T], list[T]]:
    """A deterministic shuffled (train, validation) split of a list, e.g. of pairs.

    The validation part has ``round(len(items) * val_fraction)`` items; the same (items, seed)
    always give the same split, and the original order is kept inside each part.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in [0, 1)")
    _check_seed(seed=seed)
    n_val = int(round(len(items) * val_fraction))
    val_idx = set(np.random.default_rng([seed]).permutation(len(items))[:n_val].tolist())
    train = [x for i, x in enumerate(items) if i not in val_idx]
    val = [x for i, x in enumerate(items) if i in val_idx]
    return train, val
