"""Character text for the experiments' small language models (in memory, never downloaded).

A full-size run reads tinyshakespeare when the shared data sits next to the checkout; a quick
run, or a machine without the file, uses play-like dialogue generated here from a small grammar
(:func:`generated_text`). The models read *windows* of T + 1 characters: the inputs w_1..w_T
and the targets w_2..w_{T+1} of next-character prediction. Two count-based baselines put a
model's loss in context: the add-one unigram (no context) and bigram p(w_t | w_{t-1}) models.

Shapes: N windows, T context, V characters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.config import ModelConfig
from attnlab.lab.kit.datasets import SHAKESPEARE, dataset

SPEAKERS = ("KING", "QUEEN", "FOOL", "DUKE", "NURSE", "FIRST GUARD")
SUBJECTS = (
    "the king",
    "my lord",
    "the queen",
    "this fool",
    "a soldier",
    "the old man",
    "my love",
    "the night",
    "your father",
    "the duke",
)
VERBS = (
    "loves",
    "fears",
    "calls",
    "waits for",
    "speaks to",
    "remembers",
    "follows",
    "sees",
    "betrays",
    "forgives",
)
OBJECTS = (
    "the crown",
    "his daughter",
    "the sea",
    "our cause",
    "the castle",
    "her brother",
    "the morning",
    "a letter",
    "the gods",
    "my sword",
)
TAILS = (
    ".",
    "!",
    "?",
    ", and so do I.",
    " in the dark.",
    " with all his heart.",
    " before the dawn.",
    ", I swear it.",
)


def generated_text(n_lines: int, seed: int) -> str:
    """Play-like dialogue from a small grammar: speaker lines, 1-3 sentences each."""
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(n_lines):
        speaker = SPEAKERS[rng.integers(len(SPEAKERS))]
        sentences = []
        for _ in range(int(rng.integers(1, 4))):
            words = (
                SUBJECTS[rng.integers(len(SUBJECTS))],
                VERBS[rng.integers(len(VERBS))],
                OBJECTS[rng.integers(len(OBJECTS))],
            )
            sentence = " ".join(words) + TAILS[rng.integers(len(TAILS))]
            sentences.append(sentence[0].upper() + sentence[1:])
        parts.append(f"{speaker}:\n" + " ".join(sentences) + "\n")
    return "\n".join(parts)


def corpus_text(
    quick: bool, quick_lines: int, seed: int = 0, data: Path | None = None
) -> tuple[str, str]:
    """(text, where it came from): with a data folder, its tinyshakespeare
    (:func:`attnlab.lab.kit.datasets.dataset`); else :func:`generated_text` with
    ``quick_lines`` speeches (quick) or 6000 (full size)."""
    path = dataset(data, SHAKESPEARE)
    if path is not None:
        return path.read_text(encoding="utf-8"), f"tinyshakespeare ({path.name})"
    return generated_text(quick_lines if quick else 6000, seed), "a generated play-like text"


def char_ids(text: str, chars: list[str]) -> Tensor:
    """The text as ids, each character's index in ``chars``: (len(text),) int64."""
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text])


def windows(ids: Tensor, context: int) -> Tensor:
    """Consecutive, non-overlapping windows of context + 1 ids: (N, T + 1); the rest is dropped."""
    n = (len(ids) - 1) // (context + 1)
    return ids[: n * (context + 1)].view(n, context + 1)


def text_windows(
    quick: bool, context: int, data: Path | None = None
) -> tuple[Tensor, Tensor, list[str], str]:
    """(train windows (N, T + 1), validation windows, the character set, where the text is from)
    from the first 600 000 characters of :func:`corpus_text`; the last 10% is validation."""
    text, source = corpus_text(quick, 400, data=data)
    text = text[:600_000]
    chars = sorted(set(text))
    ids = char_ids(text, chars)
    cut = int(0.9 * len(ids))
    return windows(ids[:cut], context), windows(ids[cut:], context), chars, source


UNIGRAM_MARGIN = 0.05  # nats/char above the add-one unigram entropy still counts as learned
LEARNED_FREQUENCIES = (  # a char LM's competence criterion against the unigram entropy + margin
    f"validation loss (nats/char) at most the unigram entropy + {UNIGRAM_MARGIN:g} (the "
    "training learned the character frequencies)"
)


def unigram_bigram(train: Tensor, val: Tensor, vocab: int) -> tuple[float, float]:
    """Validation nats/char of add-one unigram and bigram counts from the training windows."""
    flat, vflat = train.flatten(), val.flatten()
    uni = torch.bincount(flat, minlength=vocab).double() + 1
    uni_loss = float(-(uni / uni.sum()).log()[vflat].mean())
    pairs = torch.zeros(vocab, vocab, dtype=torch.float64) + 1
    pairs.index_put_(
        (flat[:-1], flat[1:]), torch.ones(len(flat) - 1, dtype=torch.float64), accumulate=True
    )
    cond = pairs / pairs.sum(1, keepdim=True)
    bi_loss = float(-cond[vflat[:-1], vflat[1:]].log().mean())
    return uni_loss, bi_loss


def char_lm_config(vocab: int, context: int, n_layers: int = 2, **changes: Any) -> ModelConfig:
    """The lab's character LM: a decoder-only Transformer of width 64 with 4 heads, over
    ``context`` characters; ``changes`` override any field (e.g. ``norm_placement``)."""
    fields = dict(d_model=64, n_heads=4, n_layers=n_layers, **changes)
    return ModelConfig(kind="decoder_lm", vocab_size=vocab, max_len=context, **fields)
