"""Build the :class:`~attnlab.train.task_data.TaskData` of a TrainConfig: read or generate the
data, split off validation, pick the tokenizer (and labels).

* ``task="lm"``: a text file or directory, encoded once into a memory-mapped corpus under
  ``data_dir`` (rank 0 prepares it; other processes read it).
* ``task="seq2seq"``: a built-in generated task (``attnlab.data.TASKS``) or a TSV/JSONL pair file.
* ``task="classify"``: a built-in task (``attnlab.data.CLASSIFICATION_TASKS``) or a CSV/JSONL file.

Generated tasks draw training examples from ``seed``, validation examples from
``seed + VAL_SEED_OFFSET`` and test examples from ``seed + TEST_SEED_OFFSET``; sources that occur
in training are removed from the held-out sets. File data is split deterministically
(``attnlab.data.split_items``) unless ``val_data`` names a separate file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.checkpoint.atomic import atomic_write_bytes, atomic_write_json
from attnlab.data import (
    CLASSIFICATION_TASKS,
    TASKS,
    ByteTokenizer,
    CharTokenizer,
    LabelSet,
    Tokenizer,
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
from attnlab.errors import DataError, UserError
from attnlab.train.task_data import LabelData, LMData, PairData, TaskData

VAL_SEED_OFFSET = 1_000_003
TEST_SEED_OFFSET = 2_000_003


def make_tokenizer(
    kind: str, texts: Sequence[str], bpe_vocab_size: int, chars: str | None = None
) -> Tokenizer:
    """A tokenizer of ``kind`` for in-memory texts (a char tokenizer may be given its alphabet)."""
    if kind == "char":  # file data: characters unseen in training map to <unk> at test time
        return CharTokenizer(chars) if chars else CharTokenizer.train(list(texts), unk=True)
    if kind == "byte":
        return ByteTokenizer()
    return train_tokenizer("bpe", list(texts), vocab_size=bpe_vocab_size)


def _limit(
    pairs: list[tuple[str, str]], max_src: int | None, max_tgt: int | None, tok: Tokenizer
) -> list[tuple[str, str]]:
    """Keep pairs within explicit length limits (the summary reports how many were dropped)."""
    if max_src is None and max_tgt is None:
        return pairs
    return [
        (s, t)
        for s, t in pairs
        if (max_src is None or len(tok.encode(s)) <= max_src)
        and (max_tgt is None or len(tok.encode(t)) + 1 <= max_tgt)
    ]


def _held_out(train: Sequence[tuple[str, str]], candidates: list[tuple[str, str]]) -> list:
    seen = {s for s, _ in train}
    return [p for p in candidates if p[0] not in seen]


def _split(cfg: Any, items: list[tuple[str, str]], read: Any, split: str) -> tuple[list, list]:
    """(train, evaluation) items: a separate file if given, else a deterministic split."""
    if split == "test":
        raise DataError(
            "a test split of a file-based task needs its own file: evaluate on it (the "
            "evaluation data, e.g. 'test.tsv') instead of split='test'",
            fields=("data", "split"),
        )
    if cfg.val_data:
        return items, read(cfg.val_data)
    train, val = split_items(items, cfg.val_fraction, cfg.seed)
    if not val or not train:
        raise DataError(
            f"{cfg.data!r} has {len(items)} examples, too few to hold out val_fraction="
            f"{cfg.val_fraction} for validation; add examples or give a validation file as "
            f"val_data",
            fields=("val_data",),
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
            raise DataError(
                "a language model's test split needs its own text: evaluate with split='test' "
                "on that text file",
                fields=("text", "split"),
            )
        return _lm_data(cfg, data_dir, tokenizer, eval_data, prepare)
    if cfg.task == "seq2seq":
        return _pair_data(cfg, tokenizer, split, eval_data)
    if cfg.task == "classify":
        return _label_data(cfg, tokenizer, labels, split, eval_data)
    raise DataError(f"unknown task {cfg.task!r}; choose lm, seq2seq or classify")


def _lm_data(
    cfg: Any, data_dir: Any, tokenizer: Tokenizer | None, eval_data: str | None, prepare: bool
):
    if cfg.data in TASKS or cfg.data in CLASSIFICATION_TASKS:
        raise DataError(
            f"task 'lm' needs a text file or directory, but data={cfg.data!r} names "
            f"a built-in task; give a text file or directory as data",
            fields=("text",),
        )
    if data_dir is None:
        raise ValueError("an LM run needs data_dir for its memory-mapped corpus")
    data_dir = Path(data_dir)
    if eval_data is not None:  # evaluate a trained model on another text: only that is encoded
        if tokenizer is None:
            raise ValueError("evaluating an LM on a text file needs the model's tokenizer")
        _check_text(eval_data)
        other = prepare_corpus(
            eval_data, data_dir / "eval", tokenizer, write=atomic_write_bytes, val_fraction=0.0
        )
        return LMData(dataclasses.replace(other, val=other.train), cfg.context_len, cfg.seed)
    corpus_dir = data_dir / "corpus"
    meta = corpus_dir / "meta.json"
    fraction = 0.0 if cfg.val_data else cfg.val_fraction
    source = _source_stamp(cfg.data, fraction)
    if not prepare:
        corpus = load_corpus(corpus_dir)
    elif tokenizer is not None and meta.is_file() and _read_stamp(corpus_dir) == source:
        corpus = load_corpus(corpus_dir)  # a resumed run: the cache of the same data
        if corpus.tokenizer.to_dict() != tokenizer.to_dict():
            corpus = None
    else:
        corpus = None
    if corpus is None:
        _check_text(cfg.data)
        if tokenizer is None:
            if cfg.tokenizer == "char":  # unseen characters of later texts become <unk>
                tokenizer = CharTokenizer.train(Path(cfg.data), unk=True)
            else:
                tokenizer = train_tokenizer(
                    cfg.tokenizer, Path(cfg.data), vocab_size=cfg.bpe_vocab_size
                )
        corpus = prepare_corpus(
            cfg.data, corpus_dir, tokenizer, write=atomic_write_bytes, val_fraction=fraction
        )
        atomic_write_json(corpus_dir / SOURCE_STAMP, source)
    if cfg.val_data:  # a separate text file as the validation split
        if prepare:
            _check_text(cfg.val_data)
            other = prepare_corpus(
                cfg.val_data,
                data_dir / "val",
                corpus.tokenizer,
                write=atomic_write_bytes,
                val_fraction=0.0,
            )
        else:
            other = load_corpus(data_dir / "val")
        corpus = dataclasses.replace(corpus, val=other.train)
    return LMData(corpus, cfg.context_len, cfg.seed)


SOURCE_STAMP = "source.json"  # what the cached corpus was encoded from


def _source_stamp(data: str, val_fraction: float) -> dict[str, Any]:
    """The data an LM corpus cache stands for: the text files (path, size, modification time)
    and the split; a cache with another stamp is encoded again (e.g. a resume with a new --text
    and --allow-changes)."""
    try:
        files = [
            (str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns)
            for p in list_text_files(data)
        ]
    except (OSError, ValueError, UserError):
        files = []
    return {"data": str(Path(data).resolve()), "val_fraction": val_fraction, "files": files}


def _read_stamp(corpus_dir: Path) -> Any:
    try:
        return json.loads((corpus_dir / SOURCE_STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _check_text(path: str) -> None:
    """Fail early, naming the file, on a missing path, something that is neither a file nor a
    directory (a device such as /dev/null, a FIFO that would block the read), or an empty file."""
    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():
        raise DataError(
            f"{path!r} is neither a file nor a directory (a device, FIFO or socket); give a text "
            f"file or a directory of text files"
        )
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
        raise DataError(
            f"{cfg.data!r} is a classification task; train it with task='classify'",
            fields=("task",),
        )
    elif eval_data is not None:  # a trained model on another file: the training file is not read
        train = val = read_pairs(eval_data)
        chars, origin = None, repr(eval_data)
    else:
        train, val = _split(cfg, read_pairs(cfg.data), read_pairs, split)
        chars, origin = None, repr(cfg.data)
    if eval_data is not None:
        val = read_pairs(eval_data)
    if tokenizer is None:
        tokenizer = make_tokenizer(
            cfg.tokenizer, [x for p in train for x in p], cfg.bpe_vocab_size, chars
        )
    n_before = len(train)
    train = _limit(train, cfg.max_src_len, cfg.max_tgt_len, tokenizer)
    if not train:
        raise DataError(
            f"no training pair fits max_src_len={cfg.max_src_len} / max_tgt_len="
            f"{cfg.max_tgt_len}; raise the limits"
        )
    if not val:
        raise DataError(
            f"the validation set of {cfg.data!r} is empty after removing pairs seen "
            f"in training; raise n_val or give a validation file as val_data",
            fields=("n_val", "val_data"),
        )
    data = PairData(
        tokenizer,
        train,
        val,
        cfg.seed,
        origin,
        generated=cfg.data in TASKS,
        length_buckets=cfg.length_buckets,
    )
    if len(train) < n_before:
        data.summary += f"; {n_before - len(train)} pairs over the length limits left out"
    return data


def _label_data(
    cfg: Any,
    tokenizer: Tokenizer | None,
    labels: LabelSet | None,
    split: str,
    eval_data: str | None,
):
    if cfg.data in CLASSIFICATION_TASKS:
        task = make_task(cfg.data)
        train = task.make_pairs(cfg.n_train, seed=cfg.seed)
        offset = TEST_SEED_OFFSET if split == "test" else VAL_SEED_OFFSET
        val = task.make_pairs(cfg.n_val, seed=cfg.seed + offset)
        chars, origin, names = task.characters(), f"the generated {cfg.data!r} task", task.labels
    elif cfg.data in TASKS:
        raise DataError(
            f"{cfg.data!r} is a sequence-to-sequence task; train it with task='seq2seq'",
            fields=("task",),
        )
    elif eval_data is not None:
        train = val = read_labelled(eval_data)
        chars, origin, names = None, repr(eval_data), None
    else:
        train, val = _split(cfg, read_labelled(cfg.data), read_labelled, split)
        chars, origin, names = None, repr(cfg.data), None
    if eval_data is not None:
        val = read_labelled(eval_data)
    if labels is None:
        distinct = sorted({str(y) for _, y in train + val})
        if not names and len(distinct) < 2:
            raise DataError(
                f"{origin} has one class only ({distinct}), so there is nothing to tell apart; "
                "give examples of at least 2 different labels",
                fields=("data",),
            )
        labels = LabelSet(names) if names else LabelSet.from_labels(distinct)
    if tokenizer is None:
        tokenizer = make_tokenizer(cfg.tokenizer, [t for t, _ in train], cfg.bpe_vocab_size, chars)
    if cfg.max_src_len is not None:
        train = [(t, y) for t, y in train if len(tokenizer.encode(t)) + 1 <= cfg.max_src_len]
    return LabelData(tokenizer, labels, train, val, cfg.seed, origin, cfg.length_buckets)
