"""Batches as small named tuples, and the collate functions that right-pad id lists into them.

Shapes: B batch, T target/LM length, S source length. Masks are bool with True = a real token
(may attend), the convention of ``attnlab.models.base``; padding positions hold ``pad_id``.

Teacher forcing (Vaswani et al. 2017, §3.1 "shifted right"): for a target y_1..y_L

    tgt_in  = <bos> y_1 ... y_L        (what the decoder reads)
    tgt_out =       y_1 ... y_L <eos>  (what it must predict at each position)

so ``tgt_in[:, t]`` is the input that predicts ``tgt_out[:, t]``, and both share ``tgt_mask``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

if TYPE_CHECKING:
    from attnlab.data.labels import LabelSet
    from attnlab.data.tokenizers import Tokenizer


class LMBatch(NamedTuple):
    """Language-model windows: y is x shifted left by one token."""

    x: Tensor  # (B, T) int64 input ids
    y: Tensor  # (B, T) int64 next-token targets


class Seq2SeqBatch(NamedTuple):
    """A padded batch of (source, target) pairs ready for teacher forcing."""

    src: Tensor  # (B, S) int64
    src_mask: Tensor  # (B, S) bool, True = real token
    tgt_in: Tensor  # (B, T) int64, [BOS] + y
    tgt_out: Tensor  # (B, T) int64, y + [EOS]
    tgt_mask: Tensor  # (B, T) bool, True = real token

    def to(self, device: torch.device | str) -> Seq2SeqBatch:
        return Seq2SeqBatch(*(t.to(device) for t in self))


class ClassificationBatch(NamedTuple):
    """A padded batch of token sequences with one class id each."""

    ids: Tensor  # (B, T) int64
    mask: Tensor  # (B, T) bool, True = real token
    labels: Tensor  # (B,) int64 class ids

    def to(self, device: torch.device | str) -> ClassificationBatch:
        return ClassificationBatch(*(t.to(device) for t in self))


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad id lists to the longest: returns ids (B, L) int64 and mask (B, L) bool."""
    if len(seqs) == 0:
        raise ValueError("cannot collate an empty batch; give at least one sequence")
    longest = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.long)  # (B, L)
    mask = torch.zeros((len(seqs), longest), dtype=torch.bool)  # (B, L)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
            mask[i, : len(s)] = True
    return ids, mask


def collate_pairs(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, bos_id: int, eos_id: int
) -> Seq2SeqBatch:
    """(source ids, target ids) pairs -> a right-padded :class:`Seq2SeqBatch`.

    Sources are used as given (add BOS/EOS when encoding if your model wants them). Targets get
    BOS prepended for ``tgt_in`` and EOS appended for ``tgt_out``. An empty source is an error,
    because a row with no real key would give attention nothing to attend to.
    """
    for i, (source, _) in enumerate(pairs):
        if len(source) == 0:
            raise ValueError(
                f"pair {i} has an empty source; drop it or encode sources with add_eos=True"
            )
    src, src_mask = pad_sequences([p[0] for p in pairs], pad_id)  # (B, S)
    tgt_in, tgt_mask = pad_sequences([[bos_id, *p[1]] for p in pairs], pad_id)  # (B, T)
    tgt_out, _ = pad_sequences([[*p[1], eos_id] for p in pairs], pad_id)  # (B, T)
    return Seq2SeqBatch(src, src_mask, tgt_in, tgt_out, tgt_mask)


def collate_labelled(
    examples: Sequence[tuple[Sequence[int], int]], pad_id: int
) -> ClassificationBatch:
    """(token ids, class id) examples -> a right-padded :class:`ClassificationBatch`."""
    for i, (tokens, _) in enumerate(examples):
        if len(tokens) == 0:
            raise ValueError(f"example {i} has no tokens; drop it or encode with add_bos=True")
    ids, mask = pad_sequences([e[0] for e in examples], pad_id)  # (B, T)
    labels = torch.tensor([int(e[1]) for e in examples], dtype=torch.long)  # (B,)
    return ClassificationBatch(ids, mask, labels)


def encode_pairs(
    pairs: Sequence[tuple[str, str]],
    src_tokenizer: Tokenizer,
    tgt_tokenizer: Tokenizer | None = None,
) -> list[tuple[list[int], list[int]]]:
    """(source, target) strings -> id lists ready for :func:`collate_pairs` (no BOS/EOS added)."""
    tgt_tokenizer = tgt_tokenizer or src_tokenizer
    return [(src_tokenizer.encode(s), tgt_tokenizer.encode(t)) for s, t in pairs]


def encode_labelled(
    examples: Sequence[tuple[str, str]], tokenizer: Tokenizer, labels: LabelSet
) -> list[tuple[list[int], int]]:
    """(text, label) strings -> (ids, class id) ready for :func:`collate_labelled`."""
    return [(tokenizer.encode(text), labels.encode(label)) for text, label in examples]
