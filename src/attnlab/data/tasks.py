"""Generated tasks: no download, every example a pure function of (task settings, n, seed).

Sequence-to-sequence tasks return (source, target) string pairs, one character per token:

    copy       "hello"   -> "hello"
    reverse    "hello"   -> "olleh"
    sort       "hello"   -> "ehllo"     (order of the task's alphabet)
    addition   "123+45"  -> "168"       (``reverse_target=True`` writes "861", least digit first)
    dates      "March 3rd, 1998" -> "1998-03-03"   (see ``dates.py``)

Classification tasks return (text, label) pairs:

    parens     "(()())" -> "balanced", "())(()" -> "unbalanced". Both classes always have as many
               '(' as ')', so counting cannot solve it: the model must use the order.
    majority   "abcab" -> "a": the most frequent symbol (ties are never generated). A counting
               task that a bag of tokens solves; a baseline next to ``parens``.

``make_task("reverse", max_len=20)`` builds a task by name from ``TASKS`` or
``CLASSIFICATION_TASKS``; unknown settings are an error listing the valid ones.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnlab.config import from_dict
from attnlab.data.dates import DateTask


def _rng(seed: int) -> np.random.Generator:
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed={seed!r} must be a non-negative int")
    return np.random.default_rng([seed])


def _check_range(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    if not 1 <= lo <= hi:
        raise ValueError(f"need 1 <= {lo_name} <= {hi_name}, got {lo_name}={lo}, {hi_name}={hi}")


@dataclass(frozen=True)
class SequenceTask:
    """Random strings of length [min_len, max_len] over ``alphabet``, mapped by ``target``."""

    name: ClassVar[str] = ""
    min_len: int = 1
    max_len: int = 10
    alphabet: str = string.ascii_lowercase

    def __post_init__(self) -> None:
        _check_range("min_len", self.min_len, "max_len", self.max_len)
        if len(self.alphabet) < 2 or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"alphabet={self.alphabet!r} needs 2+ distinct characters")

    def target(self, src: str) -> str:
        raise NotImplementedError

    def make_pairs(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``n`` (source, target) pairs, a pure function of (self, n, seed)."""
        rng = _rng(seed)
        lengths = rng.integers(self.min_len, self.max_len + 1, size=n)
        letters = np.array(list(self.alphabet))
        sources = ["".join(letters[rng.integers(0, len(letters), size=k)]) for k in lengths]
        return [(s, self.target(s)) for s in sources]

    def characters(self) -> str:
        return "".join(sorted(self.alphabet))


class CopyTask(SequenceTask):
    name = "copy"

    def target(self, src: str) -> str:
        return src


class ReverseTask(SequenceTask):
    name = "reverse"

    def target(self, src: str) -> str:
        return src[::-1]


class SortTask(SequenceTask):
    name = "sort"

    def target(self, src: str) -> str:
        rank = {c: i for i, c in enumerate(self.alphabet)}
        return "".join(sorted(src, key=rank.__getitem__))


@dataclass(frozen=True)
class AdditionTask:
    """ "a+b" -> "a+b evaluated", each operand with a uniform number of digits in the range."""

    name: ClassVar[str] = "addition"
    min_digits: int = 1
    max_digits: int = 3
    reverse_target: bool = False

    def __post_init__(self) -> None:
        _check_range("min_digits", self.min_digits, "max_digits", self.max_digits)
        if self.max_digits > 18:
            raise ValueError(f"max_digits={self.max_digits} must be <= 18 (int64 operands)")

    def _operand(self, rng: np.random.Generator) -> int:
        k = int(rng.integers(self.min_digits, self.max_digits + 1))
        lo = 0 if k == 1 else 10 ** (k - 1)
        return int(rng.integers(lo, 10**k))

    def make_pairs(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        rng = _rng(seed)
        pairs = []
        for _ in range(n):
            a, b = self._operand(rng), self._operand(rng)
            total = str(a + b)
            pairs.append((f"{a}+{b}", total[::-1] if self.reverse_target else total))
        return pairs

    def characters(self) -> str:
        return "+0123456789"


@dataclass(frozen=True)
class BalancedParensTask:
    """Is a string of '(' and ')' balanced? 2k characters, k uniform in [min_pairs, max_pairs]."""

    name: ClassVar[str] = "parens"
    labels: ClassVar[tuple[str, ...]] = ("balanced", "unbalanced")
    min_pairs: int = 1
    max_pairs: int = 8

    def __post_init__(self) -> None:
        _check_range("min_pairs", self.min_pairs, "max_pairs", self.max_pairs)

    @staticmethod
    def is_balanced(text: str) -> bool:
        depth = 0
        for ch in text:
            depth += 1 if ch == "(" else -1
            if depth < 0:
                return False
        return depth == 0

    def make_pairs(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        """``n`` (text, label) pairs; each label drawn with probability 1/2."""
        rng = _rng(seed)
        out = []
        for _ in range(n):
            k = int(rng.integers(self.min_pairs, self.max_pairs + 1))
            if rng.random() < 0.5:
                out.append((self._balanced(rng, k), "balanced"))
            else:
                out.append((self._unbalanced(rng, k), "unbalanced"))
        return out

    @staticmethod
    def _balanced(rng: np.random.Generator, k: int) -> str:
        chars, depth, opened = [], 0, 0
        for _ in range(2 * k):
            if opened < k and (depth == 0 or rng.random() < 0.5):
                chars.append("(")
                depth, opened = depth + 1, opened + 1
            else:
                chars.append(")")
                depth -= 1
        return "".join(chars)

    def _unbalanced(self, rng: np.random.Generator, k: int) -> str:
        while True:  # a random arrangement is balanced with probability 1/(k+1) <= 1/2
            text = "".join(rng.permutation(list("(" * k + ")" * k)))
            if not self.is_balanced(text):
                return text

    def characters(self) -> str:
        return "()"


@dataclass(frozen=True)
class MajorityTask:
    """Which symbol of ``alphabet`` occurs most often? One class per symbol; no ties."""

    name: ClassVar[str] = "majority"
    min_len: int = 3
    max_len: int = 20
    alphabet: str = "abc"

    def __post_init__(self) -> None:
        _check_range("min_len", self.min_len, "max_len", self.max_len)
        if len(self.alphabet) < 2 or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(f"alphabet={self.alphabet!r} needs 2+ distinct characters")

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.alphabet)

    def make_pairs(self, n: int, seed: int = 0) -> list[tuple[str, str]]:
        rng = _rng(seed)
        letters = np.array(list(self.alphabet))
        out: list[tuple[str, str]] = []
        while len(out) < n:
            k = int(rng.integers(self.min_len, self.max_len + 1))
            counts = np.zeros(len(letters), dtype=int)
            idx = rng.integers(0, len(letters), size=k)
            np.add.at(counts, idx, 1)
            if (counts == counts.max()).sum() == 1:  # resample ties
                out.append(("".join(letters[idx]), str(letters[counts.argmax()])))
        return out

    def characters(self) -> str:
        return "".join(sorted(self.alphabet))


TASKS: dict[str, type] = {
    t.name: t for t in (CopyTask, ReverseTask, SortTask, AdditionTask, DateTask)
}
CLASSIFICATION_TASKS: dict[str, type] = {t.name: t for t in (BalancedParensTask, MajorityTask)}


def make_task(name: str, **settings: Any) -> Any:
    """A task by name with its settings, e.g. ``make_task("addition", max_digits=5)``."""
    registry = {**TASKS, **CLASSIFICATION_TASKS}
    if name not in registry:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(registry)}")
    return from_dict(registry[name], settings)
