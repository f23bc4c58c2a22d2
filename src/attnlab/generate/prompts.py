"""Prompts and sources in: text or ids -> checked id lists -> one padded batch.

Language-model prompts are **left**-padded: every row's last real token sits in the last column,
so one forward pass gives every row's next-token logits at ``[:, -1]``, and new tokens append in
the same column for all rows. Position ids then come from the padding mask,

    pos[b, j] = max(0, sum_{j' <= j} mask[b, j'] - 1)

so a row's first real token is at position 0 whatever its padding (right padding, or positions
0..T-1 for all rows, would put the next token after the pads: a classic batched-generation bug).
Sources of a seq2seq model are right-padded, as in training (the encoder counts positions from 0).

Decisions (docs/generation.md):
  * characters the tokenizer maps to <unk> are named in a warning (never silently replaced);
  * an empty LM prompt becomes [BOS] when a BOS id is known, otherwise it is an error;
  * a prompt longer than the context window keeps its last ``max_len`` tokens (the window the first
    new token can see) and a warning says so; sliding then continues (see ``steppers.py``);
  * a source longer than the encoder's window is an error: cropping it would change its meaning.

Shapes: B prompts, P longest prompt, S longest source.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from attnlab.data.unknown import unknown_characters


class PromptBatch(NamedTuple):
    """Checked prompts (id lists, after BOS/cropping) and their padded batch."""

    prompts: list[list[int]]
    ids: Tensor  # (B, P) int64
    mask: Tensor | None  # (B, P) bool, True = real token; None when no row is padded


def as_id_lists(inputs: Any, tokenizer: Any | None, what: str = "prompt") -> list[list[int]]:
    """A str, id list, 1-D/2-D tensor, or a list of those -> a list of id lists."""
    if isinstance(inputs, Tensor):
        if inputs.dim() not in (1, 2) or not _holds_ids(inputs):
            raise ValueError(
                f"a {what} tensor must hold integer ids of shape (T,) or (B, T), "
                f"got {inputs.dtype} {tuple(inputs.shape)}"
            )
        return inputs.reshape(-1, inputs.size(-1)).tolist() if inputs.numel() else [[]]
    if isinstance(inputs, str) or _is_id_list(inputs):
        inputs = [inputs]
    if not isinstance(inputs, Sequence) or len(inputs) == 0:
        raise ValueError(f"give at least one {what} (a string, a list of ids, or a list of them)")
    out = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            out.append(_encode(item, tokenizer, what, i))
        elif isinstance(item, Tensor) and item.dim() == 1 and _holds_ids(item):
            out.append([int(t) for t in item.tolist()])
        elif _is_id_list(item):
            out.append([int(t) for t in item])
        else:
            raise TypeError(
                f"{what} {i} must be a string or a list of token ids, got {type(item).__name__}"
            )
    return out


def _holds_ids(x: Tensor) -> bool:
    """An integer tensor (not float, complex or bool: True would be read as id 1)."""
    return not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)


def _is_id_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in x
    )


def _encode(text: str, tokenizer: Any | None, what: str, i: int) -> list[int]:
    if tokenizer is None:
        raise ValueError(f"{what} {i} is text but no tokenizer was given; pass tokenizer= or ids")
    try:
        ids = list(tokenizer.encode(text))
    except ValueError as err:
        raise ValueError(f"{what} {i} cannot be encoded by the tokenizer: {err}") from None
    if getattr(tokenizer, "unk_id", None) in ids:
        unknown = unknown_characters(tokenizer, text)
        shown = ", ".join(repr(c) for c in unknown[:10]) or "some characters"
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        warnings.warn(
            f"{what} {i} has characters the tokenizer does not know: {shown}{more}; the model "
            f"sees each as <unk>, a token it rarely saw in training, so rewrite the {what} "
            f"without them for output that follows it",
            stacklevel=4,
        )
    return ids


def check_vocab(prompts: list[list[int]], vocab_size: int, what: str = "prompt") -> None:
    """Every id must index the model's vocabulary."""
    for i, ids in enumerate(prompts):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(
                f"{what} {i} contains token id(s) {bad[:5]} outside the model's vocabulary "
                f"[0, {vocab_size}); was it encoded with a different tokenizer?"
            )


def prepare_lm_prompts(
    prompts: list[list[int]], *, bos_id: int | None, vocab_size: int, window: int | None
) -> list[list[int]]:
    """Empty prompts -> [BOS] (or an error); prompts longer than ``window`` keep their end."""
    out = []
    for i, ids in enumerate(prompts):
        if not ids:
            if bos_id is None:
                raise ValueError(
                    f"prompt {i} is empty and no BOS token is known to start from; give a "
                    "non-empty prompt, a tokenizer, or GenerationConfig(bos_token_id=...)"
                )
            ids = [bos_id]
        if window is not None and len(ids) > window:
            warnings.warn(
                f"prompt {i} has {len(ids)} tokens but the model's context window is {window}; "
                f"keeping its last {window} tokens",
                stacklevel=3,
            )
            ids = ids[-window:]
        out.append(ids)
    check_vocab(out, vocab_size)
    return out


def left_pad(prompts: list[list[int]], pad_id: int) -> PromptBatch:
    """Left-pad id lists: ids (B, P), mask (B, P) or None when all have the same length."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)  # (B, P)
    mask = torch.zeros((len(prompts), longest), dtype=torch.bool)  # (B, P)
    for b, p in enumerate(prompts):
        ids[b, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[b, longest - len(p) :] = True
    return PromptBatch(prompts, ids, None if bool(mask.all()) else mask)


def prepare_sources(
    sources: list[list[int]], *, vocab_size: int, window: int | None, pad_id: int
) -> PromptBatch:
    """Check seq2seq sources and right-pad them: ids (B, S), mask (B, S) (always given)."""
    for i, source in enumerate(sources):
        if not source:
            raise ValueError(f"source {i} is empty; every source needs at least one token")
        if window is not None and len(source) > window:
            raise ValueError(
                f"source {i} has {len(source)} tokens but the encoder accepts at most max_len="
                f"{window}; shorten or split it"
            )
    check_vocab(sources, vocab_size, "source")
    longest = max(len(s) for s in sources)
    ids = torch.full((len(sources), longest), pad_id, dtype=torch.long)  # (B, S)
    mask = torch.zeros((len(sources), longest), dtype=torch.bool)  # (B, S)
    for b, s in enumerate(sources):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[b, : len(s)] = True
    return PromptBatch(sources, ids, mask)


def position_ids(mask: Tensor) -> Tensor:
    """Positions of left-padded rows from their padding mask: (B, T) bool -> (B, T) int64."""
    return (mask.long().cumsum(dim=1) - 1).clamp(min=0)
