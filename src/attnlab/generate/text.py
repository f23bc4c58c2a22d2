"""The text side of generation: incremental detokenisation and stop strings.

Tokens are not characters: a byte-level token can end in the middle of a UTF-8 character, and a
BPE token's text can depend on its neighbours. :class:`IncrementalDecoder` therefore re-decodes a
short window of recent tokens and emits only text that is complete (not ending in U+FFFD, the
replacement character of a partial byte sequence), so pieces joined give exactly
``tokenizer.decode(all tokens)``.

A continuation is decoded in the context of what precedes it (the prompt's last
:data:`CONTEXT_TOKENS` tokens, :func:`context_of`): a SentencePiece tokenizer (Llama 2, Gemma,
Mistral) drops the leading space of the first token it decodes, so the continuation " the" of
the prompt "the" decoded alone would read "the", and "the" + "the" would print "thethe".

Stop strings are searched in the decoded text, only in the part that changed (a window as long as
the longest stop string plus the new piece), so the cost per token does not grow with the length of
the output. The output is cut right *before* the first stop string. For streaming, text that might
be the start of a stop string is held back until it is known not to be one, so a stream never
shows a stop string or any part of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 8  # prompt tokens a continuation is decoded after (a word's worth or more)


def context_of(tokenizer: Any, before: Sequence[int]) -> list[int]:
    """The last few tokens of ``before`` (a prompt), the context its continuation is decoded in;
    [] when they end in the middle of a character (its bytes then belong to the continuation)."""
    tail = [int(t) for t in before[-CONTEXT_TOKENS:]]
    return [] if tokenizer.decode(tail).endswith(_REPLACEMENT) else tail


def row_contexts(tokenizer: Any, history: tuple[Any, Any]) -> list[list[int]]:
    """Each row's context (:func:`context_of`) from a stepper's ``history()`` before the first
    step: the token ids (R, t) and their real-token mask (R, t) or None (left padding)."""
    ids, mask = history
    rows = ids.tolist() if mask is None else [r[m].tolist() for r, m in zip(ids, mask.bool())]
    return [context_of(tokenizer, row) for row in rows]


def decode_after(tokenizer: Any, context: Sequence[int], tokens: Sequence[int]) -> str:
    """The text ``tokens`` add after ``context``: decode(context + tokens) less decode(context)."""
    decoder = IncrementalDecoder(tokenizer, context)
    return "".join(decoder.push(int(t)) for t in tokens) + decoder.flush()


class IncrementalDecoder:
    """Token ids in, complete text pieces out (the "prefix/read offset" scheme of HF TGI).
    ``context``: tokens before the first one pushed (:func:`context_of`), decoded with it but
    never emitted."""

    def __init__(self, tokenizer: Any, context: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = [int(t) for t in context]
        self.prefix = 0  # start of the window re-decoded for context
        self.read = len(self.ids)  # tokens whose text has been emitted (or is the context's)

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

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...], context: Sequence[int] = ()):
        self.decoder = IncrementalDecoder(tokenizer, context)
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
