"""Characters a tokenizer reads as <unk>: what a view or a command names instead of showing a
silent <unk> (the explorer's tokens view, ``attnlab plot attention``)."""

from __future__ import annotations

import inspect
from typing import Any


def unknown_characters(tokenizer: Any, text: str) -> list[str]:
    """The characters of ``text`` that ``tokenizer`` encodes as its <unk> id, each once, in order
    of first use; [] for a tokenizer without <unk> (one that raises on unknown input instead).
    Each character is encoded alone without the model's framing tokens ([CLS] ... [SEP], <s>),
    which a pretrained tokenizer would otherwise put around the <unk>."""
    unk = getattr(tokenizer, "unk_id", None)
    if unk is None or not text:
        return []
    bare = {"add_special": False} if _frames(tokenizer) else {}
    return [c for c in dict.fromkeys(text) if unk in tokenizer.encode(c, **bare)]


def _frames(tokenizer: Any) -> bool:
    """Whether the tokenizer's ``encode`` adds framing tokens that ``add_special=False`` drops
    (:class:`attnlab.data.pretrained_tokenizer.PretrainedTokenizer`)."""
    try:
        return "add_special" in inspect.signature(tokenizer.encode).parameters
    except (TypeError, ValueError):
        return False
