"""attnlab.lab.kit.seq2seq: trimming a batch changes no number, chunked scores agree, Multi30k's
missing files are named."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.config import ModelConfig
from attnlab.data import CharTokenizer
from attnlab.errors import DataError
from attnlab.lab.kit.seq2seq import (
    greedy_texts,
    masked_seq2seq_loss,
    pair_batch,
    read_multi30k,
    seq2seq_eval_loss,
    teacher_forced,
    trimmed,
)
from attnlab.models import build_model

PAIRS = [("abc", "cba"), ("abcdef", "fedcba"), ("a", "a"), ("dcab", "bacd")]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    tok = CharTokenizer("abcdef")
    cfg = ModelConfig(kind="encoder_decoder", vocab_size=tok.vocab_size, d_model=16, n_heads=2,
                      n_layers=1, max_len=16)  # fmt: skip
    model = build_model(cfg).eval()
    return tok, model, pair_batch(PAIRS, tok)


def _padded(batch, width):
    """The batch padded further to ``width`` columns (as rows of a longer set would be)."""
    pad = [torch.zeros(t.size(0), width - t.size(1), dtype=t.dtype) for t in batch]
    return [torch.cat([t, p], dim=1) for t, p in zip(batch, pad)]


def test_trimming_changes_neither_loss_nor_scores(setup):
    tok, model, batch = setup
    wide = _padded(batch, 12)
    assert trimmed(wide).src.shape == batch.src.shape
    with torch.no_grad():
        src, src_mask, tgt_in, tgt_out, tgt_mask = wide
        logits = model(src, tgt_in, src_mask=src_mask, tgt_mask=tgt_mask).logits
        reference = F.cross_entropy(
            logits.flatten(0, 1), tgt_out.masked_fill(~tgt_mask, -100).flatten(), ignore_index=-100
        )
        assert torch.allclose(masked_seq2seq_loss(model, wide), reference, atol=1e-6)
    assert seq2seq_eval_loss(model, batch, chunk=1) == pytest.approx(
        seq2seq_eval_loss(model, batch), abs=1e-6
    )
    assert teacher_forced(model, batch, chunk=1) == pytest.approx(teacher_forced(model, batch))


def test_greedy_texts_gives_one_translation_per_source(setup):
    tok, model, batch = setup
    texts = greedy_texts(model, batch, tok, max_new=8, chunk=3)
    assert len(texts) == len(PAIRS) and all(isinstance(t, str) for t in texts)


def test_read_multi30k_names_the_missing_files(tmp_path):
    (tmp_path / "train.de").write_text("Hallo\n", encoding="utf-8")
    with pytest.raises(DataError, match="train.en"):
        read_multi30k(tmp_path)
