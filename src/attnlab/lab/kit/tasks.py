"""Small generated tasks shared by several experiments (in-memory tensors, seeded, no files).

key-value lookup (hard attention suffices)
    position 0 holds a query key q; positions 1..n hold *pair tokens* (k_j, v_j), one id per
    pair, with distinct keys, one of them equal to q. The label is the value paired with q.
    One attention step from the query to the matching pair retrieves the answer: an
    information-retrieval lookup (004 "hard attention ... returns the corresponding value for
    the best key match to the query").

counting (averaging needed)
    position 0 holds a [cls] token; positions 1..n hold symbols from {a, b}. The label is the
    number of a's (0..n). A uniform average over the positions gives the fraction of a's; a single
    one-hot lookup returns one symbol and cannot count.

Shapes: N examples, T = n + 1 positions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from attnlab.config import ModelConfig


class TaskData(NamedTuple):
    ids: Tensor  # (N, T) int64
    labels: Tensor  # (N,) int64
    vocab_size: int
    n_classes: int

    def majority_rate(self) -> float:
        """Share of the most common label: what a classifier that ignores its input can score."""
        return float(torch.bincount(self.labels).max()) / len(self.labels)

    def classifier(self, **fields: Any) -> ModelConfig:
        """A Transformer classifier for this task, reading the first ([cls]) position;
        ``fields`` give its shape (d_model, n_heads, ...) and anything else."""
        return ModelConfig(
            kind="classifier",
            vocab_size=self.vocab_size,
            n_classes=self.n_classes,
            pooling="cls",
            **fields,
        )


def kv_lookup(
    n: int, n_pairs: int, n_keys: int, n_values: int, rng: np.random.Generator
) -> TaskData:
    """Key-value lookup; ids: query keys are 0..K-1, the pair (k, v) is K + k * n_values + v."""
    if not 1 <= n_pairs <= n_keys:
        raise ValueError(f"need 1 <= n_pairs <= n_keys, got n_pairs={n_pairs}, n_keys={n_keys}")
    keys = np.argsort(rng.random((n, n_keys)), axis=1)[:, :n_pairs]  # (N, n) distinct keys
    values = rng.integers(0, n_values, size=(n, n_pairs))  # (N, n)
    pick = rng.integers(0, n_pairs, size=n)  # which pair the query asks for
    query = keys[np.arange(n), pick]  # (N,)
    pairs = n_keys + keys * n_values + values  # (N, n)
    ids = np.concatenate([query[:, None], pairs], axis=1)  # (N, n + 1)
    labels = values[np.arange(n), pick]
    return TaskData(
        torch.from_numpy(ids).long(),
        torch.from_numpy(labels).long(),
        n_keys + n_keys * n_values,
        n_values,
    )


def counting(n: int, length: int, rng: np.random.Generator) -> TaskData:
    """Count the a's: ids 0 = [cls], 1 = a, 2 = b; labels 0..length, roughly uniform."""
    p = rng.random((n, 1))  # a per-example rate spreads the counts over 0..length
    symbols = np.where(rng.random((n, length)) < p, 1, 2)  # (N, L)
    ids = np.concatenate([np.zeros((n, 1), dtype=np.int64), symbols], axis=1)  # (N, L + 1)
    labels = (symbols == 1).sum(axis=1)
    return TaskData(torch.from_numpy(ids).long(), torch.from_numpy(labels).long(), 3, length + 1)
