"""The data of a training run, behind one small interface for the three task kinds.

``build_task_data(train_cfg, ...)`` turns a :class:`~attnlab.train.run_config.TrainConfig` into a
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

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from attnlab.data import (
    CLASSIFICATION_TASKS,
    TASKS,
    ByteTokenizer,
    CharTokenizer,
    LabelSet,
    LMWindows,
    Tokenizer,
    collate_labelled,
    collate_pairs,
    list_text_files,
    load_corpus,
    make_task,
    prepare_corpus,
    read_labelled,
    read_pairs,
    read_text,
    split_items,
    train_tokenizer,
)
from attnlab.errors import DataError

TEST_SEED_OFFSET = 2_000_003  # generated test sets use seed + this (validation: seed + 1_000_003)
VAL_SEED_OFFSET = 1_000_003


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


# Building ------------------------------------------------------------------------------------
def make_tokenizer(kind: str, texts: Sequence[str], bpe_vocab_size: int,
                   chars: str | None = None) -> Tokenizer:  # fmt: skip
    """A tokenizer of ``kind`` for in-memory texts (a char tokenizer may be given its alphabet)."""
    if kind == "char":  # file data: characters unseen in training map to <unk> at test time
        return CharTokenizer(chars) if chars else CharTokenizer.train(list(texts), unk=True)
    if kind == "byte":
        return ByteTokenizer()
    return train_tokenizer("bpe", list(texts), vocab_size=bpe_vocab_size)


def _limit(pairs: list[tuple[str, str]], max_src: int | None, max_tgt: int | None,
           tok: Tokenizer) -> list[tuple[str, str]]:  # fmt: skip
    """Keep pairs within explicit length limits (the summary reports how many were dropped)."""
    if max_src is None and max_tgt is None:
        return pairs
    return [(s, t) for s, t in pairs
            if (max_src is None or len(tok.encode(s)) <= max_src)
            and (max_tgt is None or len(tok.encode(t)) + 1 <= max_tgt)]  # fmt: skip


def _held_out(train: Sequence[tuple[str, str]], candidates: list[tuple[str, str]]) -> list:
    seen = {s for s, _ in train}
    return [p for p in candidates if p[0] not in seen]


def _split(cfg: Any, items: list[tuple[str, str]], read: Any, split: str) -> tuple[list, list]:
    """(train, evaluation) items: a separate file if given, else a deterministic split."""
    if split == "test":
        raise DataError("a test split of a file-based task needs its own file: pass it as the "
                        "data flag of `attnlab evaluate` (e.g. --pairs test.tsv)")  # fmt: skip
    if cfg.val_data:
        return items, read(cfg.val_data)
    train, val = split_items(items, cfg.val_fraction, cfg.seed)
    if not val or not train:
        raise DataError(
            f"{cfg.data!r} has {len(items)} examples, too few to hold out val_fraction="
            f"{cfg.val_fraction} for validation; add examples or pass --val-data FILE"
        )
    return train, val


def build_task_data(
    cfg: Any,
    *,
    data_dir: str | Path | None = None,
    tokenizer: Tokenizer | None = None,
    labels: LabelSet | None = None,
    split: str = "val",
    eval_data: str | None = None,
    prepare: bool = True,
) -> TaskData:
    """The :class:`TaskData` of TrainConfig ``cfg``.

    ``tokenizer``/``labels`` come from a checkpoint when resuming or evaluating (they must not
    change); otherwise they are built from the training data. ``data_dir`` holds the prepared LM
    corpus (memory-mapped). ``split="test"`` gives generated tasks a fresh held-out set;
    ``eval_data`` replaces the validation set with a file (for ``attnlab evaluate``).
    ``prepare=False`` only reads an LM corpus another process prepared in ``data_dir``.
    """
    if cfg.task == "lm":
        if split == "test" and eval_data is None:
            raise DataError("a language model's test split needs its own text: pass the file "
                            "with --text to `attnlab evaluate --split test`")  # fmt: skip
        return _lm_data(cfg, data_dir, tokenizer, eval_data, prepare)
    if cfg.task == "seq2seq":
        return _pair_data(cfg, tokenizer, split, eval_data)
    if cfg.task == "classify":
        return _label_data(cfg, tokenizer, labels, split, eval_data)
    raise DataError(f"unknown task {cfg.task!r}; choose lm, seq2seq or classify")


def _lm_data(cfg: Any, data_dir: Any, tokenizer: Tokenizer | None, eval_data: str | None,
             prepare: bool):  # fmt: skip
    if cfg.data in TASKS or cfg.data in CLASSIFICATION_TASKS:
        raise DataError(f"task 'lm' needs a text file or directory, but data={cfg.data!r} names "
                        f"a built-in task; pass --text FILE_OR_DIR")  # fmt: skip
    if data_dir is None:
        raise ValueError("an LM run needs data_dir for its memory-mapped corpus")
    data_dir = Path(data_dir)
    if eval_data is not None:  # evaluate a trained model on another text: only that is encoded
        if tokenizer is None:
            raise ValueError("evaluating an LM on a text file needs the model's tokenizer")
        _check_text(eval_data)
        other = prepare_corpus(eval_data, data_dir / "eval", tokenizer, val_fraction=0.0)
        return LMData(dataclasses.replace(other, val=other.train), cfg.context_len, cfg.seed)
    corpus_dir = data_dir / "corpus"
    meta = corpus_dir / "meta.json"
    if not prepare:
        corpus = load_corpus(corpus_dir)
    elif tokenizer is not None and meta.is_file():
        corpus = load_corpus(corpus_dir)
        if corpus.tokenizer.to_dict() != tokenizer.to_dict():
            corpus = None
    else:
        corpus = None
    if corpus is None:
        _check_text(cfg.data)
        if tokenizer is None:
            tokenizer = train_tokenizer(cfg.tokenizer, Path(cfg.data),
                                        vocab_size=cfg.bpe_vocab_size)  # fmt: skip
        fraction = 0.0 if cfg.val_data else cfg.val_fraction
        corpus = prepare_corpus(cfg.data, corpus_dir, tokenizer, val_fraction=fraction)
    if cfg.val_data:  # a separate text file as the validation split
        if prepare:
            _check_text(cfg.val_data)
            other = prepare_corpus(cfg.val_data, data_dir / "val", corpus.tokenizer,
                                   val_fraction=0.0)  # fmt: skip
        else:
            other = load_corpus(data_dir / "val")
        corpus = dataclasses.replace(corpus, val=other.train)
    return LMData(corpus, cfg.context_len, cfg.seed)


def _check_text(path: str) -> None:
    """Fail early, naming the file, on a missing path or an empty single file."""
    files = list_text_files(path)
    if len(files) == 1 and files[0].stat().st_size == 0:
        read_text(files[0])  # raises: "file ... is empty; give it some text or remove it"


def _pair_data(cfg: Any, tokenizer: Tokenizer | None, split: str, eval_data: str | None):
    if cfg.data in TASKS:
        task = make_task(cfg.data)
        train = task.make_pairs(cfg.n_train, seed=cfg.seed)
        offset = TEST_SEED_OFFSET if split == "test" else VAL_SEED_OFFSET
        val = _held_out(train, task.make_pairs(cfg.n_val, seed=cfg.seed + offset))
        chars, origin = task.characters(), f"the generated {cfg.data!r} task"
    elif cfg.data in CLASSIFICATION_TASKS:
        raise DataError(f"{cfg.data!r} is a classification task; use --task classify with it")
    elif eval_data is not None:  # a trained model on another file: the training file is not read
        train = val = read_pairs(eval_data)
        chars, origin = None, repr(eval_data)
    else:
        train, val = _split(cfg, read_pairs(cfg.data), read_pairs, split)
        chars, origin = None, repr(cfg.data)
    if eval_data is not None:
        val = read_pairs(eval_data)
    if tokenizer is None:
        tokenizer = make_tokenizer(cfg.tokenizer, [x for p in train for x in p],
                                   cfg.bpe_vocab_size, chars)  # fmt: skip
    n_before = len(train)
    train = _limit(train, cfg.max_src_len, cfg.max_tgt_len, tokenizer)
    if not train:
        raise DataError(f"no training pair fits max_src_len={cfg.max_src_len} / max_tgt_len="
                        f"{cfg.max_tgt_len}; raise the limits")  # fmt: skip
    if not val:
        raise DataError(f"the validation set of {cfg.data!r} is empty after removing pairs seen "
                        f"in training; raise n_val or give --val-data")  # fmt: skip
    data = PairData(tokenizer, train, val, cfg.seed, origin, generated=cfg.data in TASKS)
    if len(train) < n_before:
        data.summary += f"; {n_before - len(train)} pairs over the length limits left out"
    return data


def _label_data(cfg: Any, tokenizer: Tokenizer | None, labels: LabelSet | None, split: str,
                eval_data: str | None):  # fmt: skip
    if cfg.data in CLASSIFICATION_TASKS:
        task = make_task(cfg.data)
        train = task.make_pairs(cfg.n_train, seed=cfg.seed)
        offset = TEST_SEED_OFFSET if split == "test" else VAL_SEED_OFFSET
        val = task.make_pairs(cfg.n_val, seed=cfg.seed + offset)
        chars, origin, names = task.characters(), f"the generated {cfg.data!r} task", task.labels
    elif cfg.data in TASKS:
        raise DataError(f"{cfg.data!r} is a sequence-to-sequence task; use --task seq2seq with it")
    elif eval_data is not None:
        train = val = read_labelled(eval_data)
        chars, origin, names = None, repr(eval_data), None
    else:
        train, val = _split(cfg, read_labelled(cfg.data), read_labelled, split)
        chars, origin, names = None, repr(cfg.data), None
    if eval_data is not None:
        val = read_labelled(eval_data)
    if labels is None:
        labels = LabelSet(names) if names else LabelSet.from_labels(y for _, y in train + val)
    if tokenizer is None:
        tokenizer = make_tokenizer(cfg.tokenizer, [t for t, _ in train], cfg.bpe_vocab_size,
                                   chars)  # fmt: skip
    if cfg.max_src_len is not None:
        train = [(t, y) for t, y in train if len(tokenizer.encode(t)) + 1 <= cfg.max_src_len]
    return LabelData(tokenizer, labels, train, val, cfg.seed, origin)
