"""The data of a training run, behind one small interface for the three task kinds.

``attnlab.train.build_data.build_task_data(train_cfg)`` turns a TrainConfig into a
:class:`TaskData`: the tokenizer (and label set), the training batches, and the validation set.

Training batches are a pure function of (seed, step, shard, shards), never of a global RNG or of
how many batches were drawn before. That is what makes ``--resume`` bit-identical and lets every
process of a distributed run draw its own shard without talking. The global batch of a step has
B * shards rows, where shards = grad_accum * world_size; accumulation step k of rank r takes
shard k * world_size + r:

* LM:  ``LMWindows.batch_at(step, ...)``: B * shards random windows from
  ``default_rng([seed, step])``, shard i taking rows i*B .. (i+1)*B - 1.
* pairs / labelled examples: an endless stream of shuffled epochs (epoch e is the permutation
  ``default_rng([seed, e])`` of the training examples); step s covers stream items
  s*B*shards .. (s+1)*B*shards - 1, shard i taking its B of them. With ``length_buckets`` k > 0
  the items of each run of k global batches are first sorted by length (less padding), and
  those k batches are shuffled with ``default_rng([seed, pool, 1])``.

So the data of a step depends only on the global batch size: batch 8 in one process, batch 4
with grad_accum 2, batch 4 on each of 2 processes, and batch 2 x accumulation 2 x 2 processes
all train on exactly the same examples.

Shapes: B batch, T context / target length, S source length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from attnlab.config import CLASSIFIER_KINDS
from attnlab.data import LabelSet, LMWindows, Tokenizer, collate_labelled, collate_pairs
from attnlab.errors import DataError, blamed_fields


class Example(NamedTuple):
    """One evaluation example as text: source (or LM/classifier input) and reference."""

    source: str
    target: str


class ShuffledStream:
    """Item k of an endless stream of epochs: epoch e is ``default_rng([seed, e])``'s
    permutation of the n items.

    With ``lengths`` and ``pool_batches`` > 0 the stream is read in length buckets (fairseq-style
    bucketing, so a batch holds similar lengths and little padding): the items of each run of
    ``pool_batches`` consecutive batches ("pool" p) are sorted by length, cut into batches, and
    those batches are put in the order ``default_rng([seed, p, 1])``. Still a pure function of
    (seed, start, count), and every item is seen once per epoch up to the pool at its edge.
    """

    def __init__(
        self, n: int, seed: int, lengths: Sequence[int] | None = None, pool_batches: int = 0
    ):
        if n <= 0:
            raise DataError("the training set is empty; give at least one training example")
        self.n, self.seed = n, seed
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.pool_batches = pool_batches
        self._cache: dict[int, np.ndarray] = {}
        self._pool: tuple[tuple[int, int], np.ndarray] | None = None

    def _epoch(self, e: int) -> np.ndarray:
        if e not in self._cache:
            if len(self._cache) > 2:
                self._cache.pop(min(self._cache))
            self._cache[e] = np.random.default_rng([self.seed, e]).permutation(self.n)
        return self._cache[e]

    def _items(self, start: int, count: int) -> list[int]:
        return [int(self._epoch(k // self.n)[k % self.n]) for k in range(start, start + count)]

    def indices(self, start: int, count: int) -> list[int]:
        """Items ``start .. start + count - 1`` of the stream; bucketed streams need ``start`` to
        be a multiple of ``count`` (whole batches)."""
        if self.lengths is None or self.pool_batches <= 0:
            return self._items(start, count)
        if start % count:
            raise ValueError(
                f"a bucketed stream reads whole batches: start={start} is not a "
                f"multiple of count={count}"
            )
        pool, batch = divmod(start // count, self.pool_batches)
        if self._pool is None or self._pool[0] != (pool, count):
            size = self.pool_batches * count
            items = np.asarray(self._items(pool * size, size))
            by_length = items[np.argsort(self.lengths[items], kind="stable")]
            order = np.random.default_rng([self.seed, pool, 1]).permutation(self.pool_batches)
            self._pool = ((pool, count), by_length.reshape(self.pool_batches, count)[order])
        return [int(i) for i in self._pool[1][batch]]


class TaskData:
    """Tokenizer, labels, training batches and validation set of one run (see module doc)."""

    kind: str = ""
    tokenizer: Tokenizer
    labels: LabelSet | None = None
    summary: str = ""

    def train_batch(self, step: int, batch_size: int, shard: int = 0, shards: int = 1) -> Any:
        raise NotImplementedError

    def val_batches(self, batch_size: int, max_batches: int) -> list[Any]:
        raise NotImplementedError

    def check_fits(self, model_cfg: Any) -> None:
        """Raise a DataError if the data cannot be fed to a model of ``model_cfg``."""


class LMData(TaskData):
    """A memory-mapped corpus cut into random training windows and fixed validation windows."""

    kind = "lm"

    def __init__(self, corpus: Any, context_len: int, seed: int):
        self.corpus, self.tokenizer = corpus, corpus.tokenizer
        self.context_len, self.seed = context_len, seed
        self.train = LMWindows(corpus.train, "the training split")
        self.val = LMWindows(corpus.val, "the validation split")
        for windows in (self.train, self.val):
            try:
                windows.num_starts(context_len)
            except ValueError as err:
                raise DataError(
                    f"{err} (corpus {corpus.path})", fields=blamed_fields(err)
                ) from None
        self.summary = (
            f"{len(corpus.train):,} training and {len(corpus.val):,} validation "
            f"tokens ({self.tokenizer.type} tokenizer, {self.tokenizer.vocab_size} "
            f"ids), windows of {context_len}"
        )

    def train_batch(self, step: int, batch_size: int, shard: int = 0, shards: int = 1) -> Any:
        return self.train.batch_at(step, batch_size, self.context_len, self.seed, shard, shards)

    def val_batches(self, batch_size: int, max_batches: int) -> list[Any]:
        return list(
            self.val.eval_batches(
                batch_size, self.context_len, max_windows=batch_size * max_batches
            )
        )

    def check_fits(self, model_cfg: Any) -> None:
        if model_cfg.kind == "decoder_lm" and self.context_len > model_cfg.max_len:
            raise DataError(
                f"context_len={self.context_len} exceeds the model's max_len="
                f"{model_cfg.max_len}; lower context_len or raise max_len",
                fields=("context_len", "max_len"),
            )


class PairData(TaskData):
    """Sequence-to-sequence (source, target) pairs, encoded once, batched by the stream."""

    kind = "seq2seq"

    def __init__(
        self,
        tokenizer: Tokenizer,
        train: Sequence[tuple[str, str]],
        val: Sequence[tuple[str, str]],
        seed: int,
        origin: str,
        generated: bool = False,
        length_buckets: int = 0,
    ):
        self.tokenizer, self.seed, self.generated = tokenizer, seed, generated
        self.train_ids = _encode_pairs(tokenizer, train, "training")
        self.val_examples = [Example(s, t) for s, t in val]
        self.val_ids = _encode_pairs(tokenizer, val, "validation")
        lengths = [max(len(s), len(t) + 1) for s, t in self.train_ids]  # padded size, with <bos>
        self.stream = ShuffledStream(len(self.train_ids), seed, lengths, length_buckets)
        self.longest_target = max(len(t) for _, t in self.train_ids)
        self.summary = (
            f"{len(train):,} training and {len(val):,} validation pairs from "
            f"{origin} ({tokenizer.type} tokenizer, {tokenizer.vocab_size} ids)"
        )

    def _collate(self, items: Sequence[tuple[list[int], list[int]]]) -> Any:
        tok = self.tokenizer
        return collate_pairs(items, tok.pad_id, tok.bos_id, tok.eos_id)

    def train_batch(self, step: int, batch_size: int, shard: int = 0, shards: int = 1) -> Any:
        return self._collate(
            [
                self.train_ids[i]
                for i in _shard_indices(self.stream, step, batch_size, shard, shards)
            ]
        )

    def val_batches(self, batch_size: int, max_batches: int) -> list[Any]:
        n = min(len(self.val_ids), batch_size * max_batches)
        return [self._collate(self.val_ids[i : i + batch_size]) for i in range(0, n, batch_size)]

    def check_fits(self, model_cfg: Any) -> None:
        if model_cfg.kind != "encoder_decoder":  # recurrent models have no length limit
            return
        src = max(len(s) for s, _ in self.train_ids + self.val_ids)
        tgt = 1 + max(len(t) for _, t in self.train_ids + self.val_ids)  # + <bos>
        if max(src, tgt) > model_cfg.max_len:
            raise DataError(
                f"the longest source has {src} tokens and the longest target {tgt} (with <bos>) "
                f"but the model's max_len is {model_cfg.max_len}; raise max_len to at least "
                f"{max(src, tgt)}, or drop long pairs with max_src_len/max_tgt_len",
                fields=("max_len", "max_src_len", "max_tgt_len"),
            )


class LabelData(TaskData):
    """(text, label) examples; texts get a leading <bos> that the classifier pools as CLS."""

    kind = "classify"

    def __init__(
        self,
        tokenizer: Tokenizer,
        labels: LabelSet,
        train: Sequence[tuple[str, str]],
        val: Sequence[tuple[str, str]],
        seed: int,
        origin: str,
        length_buckets: int = 0,
    ):
        self.tokenizer, self.labels, self.seed = tokenizer, labels, seed
        self.train_ids = [(tokenizer.encode(t, add_bos=True), labels.encode(y)) for t, y in train]
        self.val_examples = [Example(t, y) for t, y in val]
        self.val_ids = [(tokenizer.encode(t, add_bos=True), labels.encode(y)) for t, y in val]
        self.stream = ShuffledStream(
            len(self.train_ids), seed, [len(t) for t, _ in self.train_ids], length_buckets
        )
        self.summary = (
            f"{len(train):,} training and {len(val):,} validation examples from "
            f"{origin}, {len(labels)} classes {list(labels.names)[:8]}"
        )

    def train_batch(self, step: int, batch_size: int, shard: int = 0, shards: int = 1) -> Any:
        items = [
            self.train_ids[i] for i in _shard_indices(self.stream, step, batch_size, shard, shards)
        ]
        return collate_labelled(items, self.tokenizer.pad_id)

    def val_batches(self, batch_size: int, max_batches: int) -> list[Any]:
        n = min(len(self.val_ids), batch_size * max_batches)
        return [
            collate_labelled(self.val_ids[i : i + batch_size], self.tokenizer.pad_id)
            for i in range(0, n, batch_size)
        ]

    def check_fits(self, model_cfg: Any) -> None:
        if model_cfg.kind not in CLASSIFIER_KINDS:
            return
        longest = max(len(ids) for ids, _ in self.train_ids + self.val_ids)
        if longest > model_cfg.max_len:
            raise DataError(
                f"the longest text has {longest} tokens (with the <bos>/CLS token) but the model's "
                f"max_len is {model_cfg.max_len}; raise max_len to at least {longest} or drop "
                f"long texts with max_src_len",
                fields=("max_len", "max_src_len"),
            )


def _shard_indices(
    stream: ShuffledStream, step: int, batch_size: int, shard: int, shards: int
) -> list[int]:
    """Shard ``shard`` (B items) of the global batch of ``step`` (B * shards stream items)."""
    global_batch = stream.indices(step * shards * batch_size, shards * batch_size)
    return global_batch[shard * batch_size : (shard + 1) * batch_size]


def _encode_pairs(tok: Tokenizer, pairs: Sequence[tuple[str, str]], what: str) -> list:
    out = []
    for i, (s, t) in enumerate(pairs):
        src = tok.encode(s)
        if not src:
            raise DataError(f"{what} pair {i} has an empty source ({s!r} -> {t!r}); remove it")
        out.append((src, tok.encode(t)))
    return out
