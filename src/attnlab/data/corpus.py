"""Language-model corpora: local text encoded once into memory-mapped token files (as in nanoGPT).

``prepare_corpus(source, out_dir, tokenizer)`` reads a text file, or every text file under a
directory in sorted order, encodes it, and writes

    out_dir/train.bin      the first (1 - val_fraction) of the token stream
    out_dir/val.bin        the last val_fraction of it
    out_dir/meta.json      dtype, token counts, vocabulary size, source files
    out_dir/tokenizer.json the tokenizer, so the directory is self-contained

Tokens are stored as ``np.uint16`` when the vocabulary fits (<= 65536 ids), else ``np.uint32``.
Files of a directory are joined with the tokenizer's EOS id between documents. The split is a
plain cut of the stream (no shuffling), so it is deterministic and validation text is unseen.
``load_corpus(out_dir)`` maps the files back read-only; see ``windows.py`` for batches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.pretrained_tokenizer import PretrainedTokenizer
from attnlab.data.textfiles import TEXT_SUFFIXES, list_text_files, read_text
from attnlab.data.tokenizers import Tokenizer, load_tokenizer

META_FILE = "meta.json"
FORMAT = "attnlab-corpus"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding ids 0..vocab_size-1: uint16 or uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size={vocab_size} must be positive")
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class Corpus:
    """A prepared corpus: read-only train/val token arrays, metadata and the tokenizer."""

    train: np.ndarray  # (N_train,) uint16/uint32 memmap
    val: np.ndarray  # (N_val,)
    meta: dict[str, Any]
    tokenizer: Tokenizer | PretrainedTokenizer
    path: Path


def prepare_corpus(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    tokenizer: Tokenizer | PretrainedTokenizer,
    *,
    write: Callable[[Path, bytes], object],
    val_fraction: float = 0.1,
    suffixes: Iterable[str] = TEXT_SUFFIXES,
) -> Corpus:
    """Encode ``source`` (file or directory) into ``out_dir``; returns the loaded :class:`Corpus`.

    Run it once (on rank 0 when distributed). ``write(path, data)`` puts each finished file on
    disk: the caller passes the project's one atomic writer (``attnlab.checkpoint.atomic``
    ``.atomic_write_bytes``, a floor above this one), so an interrupted run never leaves a
    half-written split behind.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction} must be in [0, 1), e.g. 0.1")
    files = list_text_files(source, suffixes)
    single = Path(source).is_file()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tokenizer.vocab_size)
    stream = out / "tokens.tmp"
    n_tokens = 0
    with open(stream, "wb") as f:
        for k, path in enumerate(files):
            text = read_text(path, allow_empty=not single)
            try:
                ids = tokenizer.encode(text)
            except ValueError as err:  # e.g. characters a CharTokenizer never saw
                stream.unlink()
                raise ValueError(f"cannot encode {str(path)!r}: {err}") from None
            if k and n_tokens and ids and tokenizer.eos_id is not None:
                ids = [tokenizer.eos_id, *ids]  # document boundary (none without an EOS token)
            f.write(np.asarray(ids, dtype=dtype).tobytes())
            n_tokens += len(ids)
    if n_tokens == 0:
        stream.unlink()
        raise ValueError(f"corpus {str(source)!r} encodes to zero tokens; add some text to it")
    n_val = int(round(n_tokens * val_fraction))
    n_train = n_tokens - n_val
    tokens = np.memmap(stream, dtype=dtype, mode="r", shape=(n_tokens,))
    write(out / "train.bin", tokens[:n_train].tobytes())
    write(out / "val.bin", tokens[n_train:].tobytes())
    del tokens
    stream.unlink()
    tokenizer.save(out / "tokenizer.json")
    root = Path(source) if not single else Path(source).parent
    meta = {
        "format": FORMAT,
        "version": 1,
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer_type": tokenizer.type,
        "n_tokens": n_tokens,
        "n_train": n_train,
        "n_val": n_val,
        "val_fraction": val_fraction,
        "sources": [str(p.relative_to(root)) for p in files],
    }
    write(out / META_FILE, json.dumps(meta, indent=2).encode("utf-8"))
    return load_corpus(out)


def load_corpus(path: str | os.PathLike) -> Corpus:
    """Memory-map a directory written by :func:`prepare_corpus` (read-only)."""
    p = Path(path)
    meta_path = p / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{str(p)!r} has no {META_FILE}; prepare it first with "
            f"prepare_corpus(text_path, {str(p)!r}, tokenizer)"
        )
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"{str(meta_path)!r} is not an attnlab corpus (format={meta.get('format')})"
        )
    dtype = np.dtype(meta["dtype"])
    train = _map(p / "train.bin", dtype, meta["n_train"])
    val = _map(p / "val.bin", dtype, meta["n_val"])
    return Corpus(train, val, meta, load_tokenizer(p / "tokenizer.json"), p)


def _map(path: Path, dtype: np.dtype, n: int) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} is missing; re-run prepare_corpus")
    size = path.stat().st_size
    if size != n * dtype.itemsize:
        raise ValueError(
            f"{str(path)!r} holds {size} bytes but meta.json promises {n} {dtype.name} tokens; "
            f"the corpus is corrupted: re-run prepare_corpus"
        )
    if n == 0:  # numpy cannot map an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))
