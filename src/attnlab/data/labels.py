"""Class labels <-> ids, with a saved label list so predictions map back to names."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


class LabelSet:
    """An ordered list of class names; id i is ``names[i]``.

    ``LabelSet.from_labels`` sorts the distinct labels (numerically when all are integers, so
    "2" < "10"), which makes the mapping independent of the order examples appear in.
    """

    def __init__(self, names: Sequence[str]):
        names = [str(n) for n in names]
        if len(names) < 2:
            raise ValueError(f"a classification task needs at least 2 labels, got {names}")
        if len(set(names)) != len(names):
            raise ValueError(f"label names must be unique, got {names}")
        self.names = tuple(names)
        self._ids = {n: i for i, n in enumerate(self.names)}

    @classmethod
    def from_labels(cls, labels: Iterable[str | int]) -> LabelSet:
        distinct = {str(x) for x in labels}
        numeric = all(_is_int(x) for x in distinct)
        return cls(sorted(distinct, key=int) if numeric else sorted(distinct))

    def __len__(self) -> int:
        return len(self.names)

    def encode(self, label: str | int) -> int:
        key = str(label)
        if key not in self._ids:
            raise ValueError(
                f"unknown label {key!r}; known labels are {list(self.names)} "
                f"(build the LabelSet from the training labels)"
            )
        return self._ids[key]

    def decode(self, id: int) -> str:
        if not 0 <= int(id) < len(self.names):
            raise ValueError(f"class id {id} is outside [0, {len(self.names)})")
        return self.names[int(id)]

    def to_dict(self) -> dict[str, Any]:
        return {"labels": list(self.names)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LabelSet:
        return cls(data["labels"])

    def save(self, path: str | os.PathLike) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> LabelSet:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no label file at {str(p)!r}; save one with LabelSet.save")
        return cls.from_dict(json.loads(p.read_text(encoding="utf-8")))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LabelSet) and self.names == other.names

    def __repr__(self) -> str:
        return f"LabelSet({list(self.names)})"


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True
