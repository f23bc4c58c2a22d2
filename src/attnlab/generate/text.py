"""The text side of generation: incremental detokenisation and stop strings.

Tokens are not characters: a byte-level token can end in the middle of a UTF-8 character, and a
BPE token's text can depend on its neighbours. :class:`IncrementalDecoder` therefore re-decodes a
short window of recent tokens and emits only text that is complete (not ending in U+FFFD, the
replacement character of a partial byte sequence), so pieces joined give exactly
``tokenizer.decode(all tokens)``.

Stop strings are searched in the decoded text, only in the part that changed (a window as long as
the longest stop string plus the new piece), so the cost per token does not grow with the length of
the output. The output is cut right *before* the first stop string. For streaming, text that might
be the start of a stop string is held back until it is known not to be one, so a stream never
shows a stop string or any part of it.
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Token ids in, complete text pieces out (the "prefix/read offset" scheme of HF TGI)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # start of the window re-decoded for context
        self.read = 0  # tokens whose text has been emitted

    def push(self, token: int) -> str:
        """Add one token; return the new complete text (maybe '')."""
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """Whatever text is still pending (a partial character decodes as U+FFFD)."""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]


class TextRow:
    """One row's decoded text, checked for stop strings as it grows."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...]):
        self.decoder = IncrementalDecoder(tokenizer)
        self.stop_strings = stop_strings
        self.longest = max((len(s) for s in stop_strings), default=0)
        self.text = ""
        self.stopped = False  # a stop string was found; ``text`` is cut before it
        self.shown = 0  # characters already handed to a stream

    def push(self, token: int) -> bool:
        """Add a token; True if this completed a stop string."""
        if self.stopped:
            return True
        piece = self.decoder.push(token)
        return self._extend(piece)

    def finish(self) -> None:
        """The row ended: decode what is pending (a stop string may still complete)."""
        if not self.stopped:
            self._extend(self.decoder.flush())

    def _extend(self, piece: str) -> bool:
        if not piece:
            return False
        start = max(0, len(self.text) - self.longest + 1)
        self.text += piece
        cut = _find_first(self.text, self.stop_strings, start)
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
        return self.stopped

    def take_visible(self) -> str:
        """New text safe to show: excludes a tail that could still begin a stop string."""
        end = len(self.text)
        if not self.stopped:
            end -= _pending_prefix(self.text, self.stop_strings)
        piece = self.text[self.shown : end] if end > self.shown else ""
        self.shown = max(self.shown, end)
        return piece


def _find_first(text: str, stops: tuple[str, ...], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _pending_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
