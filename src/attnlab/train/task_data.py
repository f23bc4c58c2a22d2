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
  s*B*shards .. (s+1)*B*shards - 1, shard i taking its B of them.

So the data of a step depends only on the global batch size: batch 8 in one process, batch 4
with grad_accum 2, batch 4 on each of 2 processes, and batch 2 x accumulation 2 x 2 processes
all train on exactly the same examples.

Shapes: B batch, T context / target length, S source length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from attnlab.data import (
    LabelSet,
    LMWindows,
    Tokenizer,
    collate_labelled,
    collate_pairs,
)
from attnlab.errors import DataError


class Example(NamedTuple):
    """One evaluation example as text: source (or LM/classifier input) and reference."""

    source: str
    target: str


class ShuffledStream:
    """Item k of an endless stream of epochs: epoch e is ``default_rng([seed, e])``'s
    permutation of the n items."""

    def __init__(self, n: int, seed: int):
        if n <= 0:
            raise DataError("the training set is empty; give at least one training example")
        self.n, self.seed = n, seed
        self._cache: dict[int, np.ndarray] = {}

    def _epoch(self, e: int) -> np.ndarray:
        if e not in self._cache:
            if len(self._cache) > 2:
                self._cache.pop(min(self._cache))
            self._cache[e] = np.random.default_rng([self.seed, e]).permutation(self.n)
        return self._cache[e]

    def indices(self, start: int, count: int) -> list[int]:
        return [int(self._epoch(k // self.n)[k % self.n]) for k in range(start, start + count)]


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
                raise DataError(f"{err} (corpus {corpus.path})") from None
        self.summary = (f"{len(corpus.train):,} training and {len(corpus.val):,} validation "
                        f"tokens ({self.tokenizer.type} tokenizer, {self.tokenizer.vocab_size} "
                        f"ids), windows of {context_len}")  # fmt: skip

    def train_batch(self, step: int, batch_size: int, shard: int = 0, shards: int = 1) -> Any:
        return self.train.batch_at(step, batch_size, self.context_len, self.seed, shard,
                                   shards)  # fmt: skip

    def val_batches(self, batch_size: int, max_batches: int) -> list[Any]:
        return list(self.val.eval_batches(batch_size, self.context_len,
                                          max_windows=batch_size * max_batches))  # fmt: skip

    def check_fits(self, model_cfg: Any) -> None:
        if model_cfg.kind == "decoder_lm" and self.context_len > model_cfg.max_len:
            raise DataError(
                f"context_len={self.context_len} exceeds the model's max_len="
                f"{model_cfg.max_len}; lower --context-len or raise --max-len"
            )


class PairData(TaskData):
    """Sequence-to-sequence (source, target) pairs, encoded once, batched by the stream."""

    kind = "seq2seq"

    def __init__(self, tokenizer: Tokenizer, train: Sequence[tuple[str, str]],
                 val: Sequence[tuple[str, str]], seed: int, origin: str,
                 generated: bool = False):  # fmt: skip
        self.tokenizer, self.seed, self.generated = tokenizer, seed, generated
        self.train_ids = _encode_pairs(tokenizer, train, "training")
        self.val_examples = [Example(s, t) for s, t in val]
        self.val_ids = _encode_pairs(tokenizer, val, "validation")
        self.stream = ShuffledStream(len(self.train_ids), seed)
        self.longest_target = max(len(t) for _, t in self.train_ids)
        self.summary = (
            f"{len(train):,} training and {len(val):,} validation pairs from "
            f"{origin} ({tokenizer.type} tokenizer, {tokenizer.vocab_size} ids)"
        )

    def _collate(self, items: Sequence[tuple[list[int], list[int]]]) -> Any:
        tok = self.tokenizer
        return collate_pairs(items, tok.pad_id, tok.bos_id, tok.eos_id)

    def train_batch(self, step: int, batch_size: int, shard: int = 0, shards: int = 1) -> Any:
        start = (step * shards + shard) * batch_size
        return self._collate([self.train_ids[i] for i in self.stream.indices(start, batch_size)])

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
                f"but the model's max_len is {model_cfg.max_len}; raise --max-len to at least "
                f"{max(src, tgt)}, or drop long pairs with --max-src-len/--max-tgt-len"
            )


class LabelData(TaskData):
    """(text, label) examples; texts get a leading <bos> that the classifier pools as CLS."""

    kind = "classify"

    def __init__(self, tokenizer: Tokenizer, labels: LabelSet, train: Sequence[tuple[str, str]],
                 val: Sequence[tuple[str, str]], seed: int, origin: str):  # fmt: skip
        self.tokenizer, self.labels, self.seed = tokenizer, labels, seed
        self.train_ids = [(tokenizer.encode(t, add_bos=True), labels.encode(y)) for t, y in train]
        self.val_examples = [Example(t, y) for t, y in val]
        self.val_ids = [(tokenizer.encode(t, add_bos=True), labels.encode(y)) for t, y in val]
        self.stream = ShuffledStream(len(self.train_ids), seed)
        self.summary = (
            f"{len(train):,} training and {len(val):,} validation examples from "
            f"{origin}, {len(labels)} classes {list(labels.names)[:8]}"
        )

    def train_batch(self, step: int, batch_size: int, shard: int = 0, shards: int = 1) -> Any:
        start = (step * shards + shard) * batch_size
        items = [self.train_ids[i] for i in self.stream.indices(start, batch_size)]
        return collate_labelled(items, self.tokenizer.pad_id)

    def val_batches(self, batch_size: int, max_batches: int) -> list[Any]:
        n = min(len(self.val_ids), batch_size * max_batches)
        return [collate_labelled(self.val_ids[i : i + batch_size], self.tokenizer.pad_id)
                for i in range(0, n, batch_size)]  # fmt: skip

    def check_fits(self, model_cfg: Any) -> None:
        if model_cfg.kind != "classifier":
            return
        longest = max(len(ids) for ids, _ in self.train_ids + self.val_ids)
        if longest > model_cfg.max_len:
            raise DataError(
                f"the longest text has {longest} tokens (with the CLS token) but the model's "
                f"max_len is {model_cfg.max_len}; raise --max-len to at least {longest} or drop "
                f"long texts with --max-src-len"
            )


def _encode_pairs(tok: Tokenizer, pairs: Sequence[tuple[str, str]], what: str) -> list:
    out = []
    for i, (s, t) in enumerate(pairs):
        src = tok.encode(s)
        if not src:
            raise DataError(f"{what} pair {i} has an empty source ({s!r} -> {t!r}); remove it")
        out.append((src, tok.encode(t)))
    return out
