"""Sequence-to-sequence pieces shared by the experiments that train p(y | x) on pairs (004 eq. 1):
padded batches, the masked loss, teacher-forced scores, the decoder-only form of a pair, greedy
decoding and Multi30k's splits.

Encoder-decoder form (``Seq2SeqBatch``: src (N, S), src_mask, tgt_in = [BOS] y, tgt_out = y [EOS],
tgt_mask; right-padded). :func:`trimmed` cuts a random batch of rows padded to the longest pair
of the whole set down to its own longest source and target, so a batch costs what its sentences
cost.

Decoder-only form (:func:`concatenated`): one sequence ``x SEP y EOS`` per pair, the loss and the
scores counting only the target half (``y EOS``), which is what the encoder-decoder predicts
from the same pair.

Shapes: N pairs, B batch, S source length, T target length, L = S + T + 2, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data import Seq2SeqBatch, Tokenizer, collate_pairs, encode_pairs, read_parallel
from attnlab.errors import DataError
from attnlab.generate import GenerationConfig
from attnlab.generate.seq2seq import generate_seq2seq_padded
from attnlab.models.base import Seq2SeqModel

MULTI30K_SPLITS = {"train": "train", "val": "val", "test": "test_2016_flickr"}


def pair_batch(pairs: Sequence[tuple[str, str]], tok: Tokenizer) -> Seq2SeqBatch:
    """(source, target) strings -> one right-padded batch (no BOS/EOS on the source)."""
    return collate_pairs(encode_pairs(pairs, tok), tok.pad_id, tok.bos_id, tok.eos_id)


def trimmed(batch: Sequence[Tensor]) -> Seq2SeqBatch:
    """The batch cut to its longest real source and target (right padding only)."""
    src, src_mask, tgt_in, tgt_out, tgt_mask = batch
    s = int(src_mask.sum(1).max())
    t = int(tgt_mask.sum(1).max())
    return Seq2SeqBatch(src[:, :s], src_mask[:, :s], tgt_in[:, :t], tgt_out[:, :t], tgt_mask[:, :t])


def masked_seq2seq_loss(model: nn.Module, batch: Sequence[Tensor]) -> Tensor:
    """Mean -log p(y_l | y_<l, x) over real target tokens (004 eq. 1); padding masked on both
    sides, the batch trimmed first."""
    src, src_mask, tgt_in, tgt_out, tgt_mask = trimmed(batch)
    logits = model(src, tgt_in, src_mask=src_mask, tgt_mask=tgt_mask).logits  # (B, T, V)
    targets = tgt_out.masked_fill(~tgt_mask, -100)  # (B, T)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


@torch.no_grad()
def teacher_forced(model: nn.Module, batch: Seq2SeqBatch, chunk: int = 250) -> tuple[float, float]:
    """(per-token accuracy, exact match) of the argmax under teacher forcing. A whole target is
    right under teacher forcing exactly when greedy decoding reproduces it."""
    model.eval()
    hits, real, exact = 0, 0, 0
    for i in range(0, batch.src.size(0), chunk):
        part = trimmed([t[i : i + chunk] for t in batch])
        logits = model(part.src, part.tgt_in, src_mask=part.src_mask, tgt_mask=part.tgt_mask)
        right = (logits.logits.argmax(-1) == part.tgt_out) & part.tgt_mask  # (B, T)
        hits += int(right.sum())
        real += int(part.tgt_mask.sum())
        exact += int((right | ~part.tgt_mask).all(dim=1).sum())
    return hits / real, exact / batch.src.size(0)


@torch.no_grad()
def seq2seq_eval_loss(model: nn.Module, batch: Seq2SeqBatch, chunk: int = 250) -> float:
    """:func:`masked_seq2seq_loss` over every pair, in chunks, weighted by target tokens."""
    model.eval()
    total, tokens = 0.0, 0
    for i in range(0, batch.src.size(0), chunk):
        part = trimmed([t[i : i + chunk] for t in batch])
        n = int(part.tgt_mask.sum())
        total += float(masked_seq2seq_loss(model, part)) * n
        tokens += n
    return total / tokens


def concatenated(batch: Seq2SeqBatch, sep: int, pad: int) -> tuple[Tensor, Tensor]:
    """The decoder-only form of the pairs: ids (N, L) = ``x SEP y EOS`` right-padded, and
    targets (N, L - 1): target j is ids[j + 1] where ids[j + 1] is in ``y EOS``, else -100 (the
    loss of :func:`attnlab.lab.kit.copy_task.copy_loss`)."""
    n = batch.src.size(0)
    s_len, t_len = batch.src_mask.sum(1).tolist(), batch.tgt_mask.sum(1).tolist()
    longest = max(s + t for s, t in zip(s_len, t_len)) + 1  # x, SEP, y EOS
    ids = torch.full((n, longest), pad, dtype=torch.long)
    targets = torch.full((n, longest - 1), -100, dtype=torch.long)
    for row, (s, t) in enumerate(zip(s_len, t_len)):
        y_eos = batch.tgt_out[row, :t]  # y EOS
        ids[row, :s] = batch.src[row, :s]
        ids[row, s] = sep
        ids[row, s + 1 : s + 1 + t] = y_eos
        targets[row, s : s + t] = y_eos  # predicted from x SEP y_<l
    return ids, targets


@torch.no_grad()
def greedy_texts(
    model: nn.Module, batch: Seq2SeqBatch, tok: Tokenizer, max_new: int, chunk: int = 200
) -> list[str]:
    """Greedy translations of the batch's sources (decoded as padded, no re-tokenising)."""
    cfg = GenerationConfig(max_new_tokens=max_new, temperature=0.0, seed=0,
                           bos_token_id=tok.bos_id, stop_token_ids=(tok.eos_id,),
                           pad_token_id=tok.pad_id)  # fmt: skip
    out: list[str] = []
    for i in range(0, batch.src.size(0), chunk):
        part = trimmed([t[i : i + chunk] for t in batch])
        result = generate_seq2seq_padded(cast(Seq2SeqModel, model), part.src, part.src_mask, cfg)
        out += [tok.decode(ids).strip() for ids in result.tokens]
    return out


def read_multi30k(folder: Path) -> dict[str, list[tuple[str, str]]]:
    """(German, English) pairs of Multi30k's train, val and test_2016_flickr splits."""
    missing = [f"{stem}.{lang}" for stem in MULTI30K_SPLITS.values() for lang in ("de", "en")
               if not (folder / f"{stem}.{lang}").is_file()]  # fmt: skip
    if missing:
        raise DataError(
            f"the Multi30k folder {str(folder)!r} lacks {', '.join(missing)}; it needs "
            "line-aligned train.de/.en, val.de/.en and test_2016_flickr.de/.en",
            fields=("data",),
        )
    return {
        k: read_parallel(folder / f"{s}.de", folder / f"{s}.en") for k, s in MULTI30K_SPLITS.items()
    }
