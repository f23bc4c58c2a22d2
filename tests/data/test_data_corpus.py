"""LM corpora: memmap encoding, deterministic split, dtype choice, windows per step and rank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.checkpoint.atomic import atomic_write_bytes
from attnlab.data import (
    ByteTokenizer,
    CharTokenizer,
    LMWindows,
    load_corpus,
    prepare_corpus,
    token_dtype,
)

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200))


def prepare(*args, **kw):
    """``prepare_corpus`` writing through the project's one atomic writer, as training does."""
    return prepare_corpus(*args, write=atomic_write_bytes, **kw)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture
def corpus(text_file, tmp_path):
    return prepare(text_file, tmp_path / "out", CharTokenizer.train([TEXT]))


# Encoding and split -------------------------------------------------------------------------
def test_prepare_writes_memmap_split(corpus, tmp_path):
    tok = corpus.tokenizer
    ids = tok.encode(TEXT)
    n_val = round(len(ids) * 0.1)
    assert corpus.meta["n_train"] == len(ids) - n_val and corpus.meta["n_val"] == n_val
    assert isinstance(corpus.train, np.memmap) and corpus.train.dtype == np.uint16
    assert corpus.train.tolist() + corpus.val.tolist() == ids  # first 90% train, last 10% val
    for name in ("train.bin", "val.bin", "meta.json", "tokenizer.json"):
        assert (tmp_path / "out" / name).is_file()
    assert not list((tmp_path / "out").glob("*.tmp"))
    again = load_corpus(tmp_path / "out")
    assert np.array_equal(again.train, corpus.train) and again.tokenizer.encode(
        "fox"
    ) == tok.encode("fox")


def test_prepare_is_deterministic_and_fraction_configurable(text_file, tmp_path):
    tok = ByteTokenizer()
    a = prepare(text_file, tmp_path / "a", tok, val_fraction=0.25)
    b = prepare(text_file, tmp_path / "b", tok, val_fraction=0.25)
    assert (tmp_path / "a/train.bin").read_bytes() == (tmp_path / "b/train.bin").read_bytes()
    assert a.meta["n_val"] == round(len(TEXT.encode()) * 0.25) == len(b.val)
    with pytest.raises(ValueError, match="val_fraction"):
        prepare(text_file, tmp_path / "c", tok, val_fraction=1.0)


def test_dtype_choice():
    assert token_dtype(259) == np.uint16
    assert token_dtype(2**16) == np.uint16
    assert token_dtype(2**16 + 1) == np.uint32


def test_large_vocab_uses_uint32(tmp_path):
    chars = [chr(0x10000 + i) for i in range(70_000)]
    tok = CharTokenizer(chars)
    path = tmp_path / "big.txt"
    path.write_text("".join(chars[-50:]) * 4, encoding="utf-8")
    corpus = prepare(path, tmp_path / "out", tok)
    assert corpus.train.dtype == np.uint32
    assert int(corpus.train.max()) == tok.vocab_size - 1


def test_directory_sorted_with_eos_between_documents(tmp_path):
    src = tmp_path / "docs"
    (src / "sub").mkdir(parents=True)
    (src / "b.txt").write_text("bb", encoding="utf-8")
    (src / "a.txt").write_text("aa", encoding="utf-8")
    (src / "sub" / "c.txt").write_text("cc", encoding="utf-8")
    (src / "empty.txt").write_text("", encoding="utf-8")
    (src / ".hidden.txt").write_text("zz", encoding="utf-8")
    (src / "notes.csv").write_text("xx", encoding="utf-8")
    tok = CharTokenizer.train(["abc"])
    corpus = prepare(src, tmp_path / "out", tok, val_fraction=0.0)
    assert corpus.meta["sources"] == ["a.txt", "b.txt", "empty.txt", "sub/c.txt"]
    assert tok.decode(corpus.train, skip_special=False) == "aa<eos>bb<eos>cc"
    assert len(corpus.val) == 0


# Bad input ----------------------------------------------------------------------------------
def test_pretrained_tokenizer_without_eos_joins_documents_without_a_boundary(tmp_path):
    """A corpus of several files marks document boundaries with EOS; a pretrained tokenizer
    that has none (no eos role) joins them directly instead of failing on a missing id."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    from attnlab.data import PretrainedTokenizer, load_tokenizer

    hf = HFTokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "c": 3}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PretrainedTokenizer(hf, {"unk": "[UNK]"})
    assert tok.eos_id is None
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "1.txt").write_text("a b", encoding="utf-8")
    (docs / "2.txt").write_text("c a", encoding="utf-8")
    got = prepare(docs, tmp_path / "out", tok, val_fraction=0.0)
    assert got.train.tolist() == [1, 2, 3, 1]
    assert load_tokenizer(tmp_path / "out" / "tokenizer.json").to_dict() == tok.to_dict()


def test_bad_corpus_inputs(tmp_path):
    tok = ByteTokenizer()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare(tmp_path / "nope.txt", tmp_path / "out", tok)
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="is empty"):
        prepare(tmp_path / "empty.txt", tmp_path / "out", tok)
    (tmp_path / "d").mkdir()
    with pytest.raises(ValueError, match="no text files"):
        prepare(tmp_path / "d", tmp_path / "out", tok)
    (tmp_path / "d" / "x.txt").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match="zero tokens"):
        prepare(tmp_path / "d", tmp_path / "out", tok)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ok".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt' is not valid UTF-8: byte 0xe9 at offset 3"):
        prepare(tmp_path / "latin1.txt", tmp_path / "out", tok)
    (tmp_path / "latin1.txt").write_text("caf\xe9 ok", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="prepare_corpus"):
        load_corpus(tmp_path / "d")
    with pytest.raises(ValueError, match=r"cannot encode .*latin1.txt.*'é' at 3"):
        prepare(tmp_path / "latin1.txt", tmp_path / "out", CharTokenizer.train(["abc"]))


def test_corrupted_split_is_detected(corpus, tmp_path):
    (tmp_path / "out" / "val.bin").write_bytes(b"\x00")
    with pytest.raises(ValueError, match="corrupted"):
        load_corpus(tmp_path / "out")


def test_corpus_shorter_than_a_window():
    windows = LMWindows(np.arange(10), name="val split")
    with pytest.raises(ValueError, match="val split has 10 tokens but one window needs .* 11"):
        windows.batch_at(0, 2, context_len=10)
    assert windows.num_starts(9) == 1


# Windows ------------------------------------------------------------------------------------
def test_batch_at_shapes_and_shift(corpus):
    windows = LMWindows(corpus.train)
    x, y = windows.batch_at(step=5, batch_size=4, context_len=16, seed=1)
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    stream = torch.from_numpy(corpus.train.astype(np.int64))
    for row_x, row_y in zip(x, y):  # each row is a real window of the stream
        starts = [s for s in range(len(stream) - 16) if torch.equal(stream[s : s + 16], row_x)]
        assert any(torch.equal(stream[s + 1 : s + 17], row_y) for s in starts)


def test_batch_at_is_deterministic_per_step_seed_and_rank():
    windows = LMWindows(np.arange(5000))
    a = windows.batch_at(7, 8, 32, seed=3, rank=1, world_size=2)
    b = windows.batch_at(7, 8, 32, seed=3, rank=1, world_size=2)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, windows.batch_at(8, 8, 32, seed=3, rank=1, world_size=2).x)
    assert not torch.equal(a.x, windows.batch_at(7, 8, 32, seed=4, rank=1, world_size=2).x)
    assert not torch.equal(a.x, windows.batch_at(7, 8, 32, seed=3, rank=0, world_size=2).x)


def test_ranks_partition_the_global_batch():
    windows = LMWindows(np.arange(5000))
    whole = windows.batch_at(3, 12, 16, seed=0)
    parts = [windows.batch_at(3, 4, 16, seed=0, rank=r, world_size=3) for r in range(3)]
    assert torch.equal(torch.cat([p.x for p in parts]), whole.x)
    with pytest.raises(ValueError, match="rank=3"):
        windows.batch_at(3, 4, 16, rank=3, world_size=3)


def test_batch_at_ignores_global_rng():
    windows = LMWindows(np.arange(5000))
    torch.manual_seed(1)
    np.random.seed(1)  # noqa: NPY002 (the point: the global RNG must not matter)
    a = windows.batch_at(0, 4, 8)
    torch.manual_seed(2)
    np.random.seed(2)  # noqa: NPY002 (the point: the global RNG must not matter)
    assert torch.equal(a.x, windows.batch_at(0, 4, 8).x)


def test_eval_batches_fixed_non_overlapping_windows():
    windows = LMWindows(np.arange(105), name="val")
    batches = list(windows.eval_batches(batch_size=4, context_len=10))
    assert [len(b.x) for b in batches] == [4, 4, 2]  # starts 0, 10, ..., 90
    firsts = torch.cat([b.x[:, 0] for b in batches])
    assert firsts.tolist() == list(range(0, 100, 10))
    again = list(windows.eval_batches(batch_size=4, context_len=10))
    assert all(torch.equal(a.y, b.y) for a, b in zip(batches, again))
    thinned = torch.cat([b.x[:, 0] for b in windows.eval_batches(8, 10, max_windows=3)])
    assert thinned.tolist() == [0, 40, 90]  # evenly spaced indices 0, 4, 9
    ranks = [
        torch.cat([b.x[:, 0] for b in windows.eval_batches(8, 10, rank=r, world_size=2)])
        for r in range(2)
    ]
    assert sorted(ranks[0].tolist() + ranks[1].tolist()) == firsts.tolist()


def test_tinyshakespeare_end_to_end(tinyshakespeare, tmp_path):
    tok = CharTokenizer.train(Path(tinyshakespeare))
    corpus = prepare(tinyshakespeare, tmp_path / "shakespeare", tok)
    assert tok.vocab_size == 3 + 65
    x, _ = LMWindows(corpus.train).batch_at(0, 2, 64)
    assert tok.decode(x[0]) in Path(tinyshakespeare).read_text(encoding="utf-8")
