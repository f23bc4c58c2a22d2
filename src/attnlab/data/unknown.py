"""Characters a tokenizer reads as <unk>: what a view or a command names instead of showing a
silent <unk> (the explorer's tokens view, ``attnlab plot attention``)."""

from __future__ import annotations

from typing import Any


def unknown_characters(tokenizer: Any, text: str) -> list[str]:
    """The characters of ``text`` that ``tokenizer`` encodes as its <unk> id, each once, in order
    of first use; [] for a tokenizer without <unk> (one that raises on unknown input instead)."""
    unk = getattr(tokenizer, "unk_id", None)
    if unk is None or not text:
        return []
    return [c for c in dict.fromkeys(text) if list(tokenizer.encode(c)) == [unk]]
