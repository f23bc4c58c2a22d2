"""Readers for local pair files (seq2seq) and labelled files (classification).

Sequence-to-sequence pairs, as a list of (source, target) strings:

    TSV     one "source<TAB>target" per line                        (.tsv, .txt)
    JSONL   one {"src": ..., "tgt": ...} per line, or "source"/"target"   (.jsonl, .json)
    two parallel files, line i of one translating line i of the other (Multi30k train.de/.en)

Classification examples, as a list of (text, label) strings:

    CSV     a header row with "text" and "label" columns (others ignored)   (.csv)
    JSONL   one {"text": ..., "label": ...} per line                         (.jsonl, .json)

Blank lines are skipped in TSV/JSONL (never in parallel files, where they keep lines aligned).
Every malformed line is an error naming ``file:line`` and the fix; nothing is silently dropped.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from attnlab.data.textfiles import read_lines, read_text

PAIR_KEYS = (("src", "tgt"), ("source", "target"))


def _format(path: Path, given: str | None, known: dict[str, str], what: str) -> str:
    fmt = given or known.get(path.suffix.lower())
    formats = sorted(set(known.values()))
    if fmt not in formats:
        raise ValueError(
            f"cannot tell the {what} format of {str(path)!r} (suffix {path.suffix!r}); "
            f"rename it to end in one of {sorted(known)} (from Python, pass format= one of "
            f"{formats})"
        )
    return fmt


def _non_empty(items: list, path: Path) -> list:
    if not items:
        raise ValueError(f"{str(path)!r} holds no examples (only blank lines); add some")
    return items


def _jsonl_objects(path: Path) -> list[tuple[int, dict]]:
    out = []
    for lineno, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}:{lineno}: invalid JSON ({err.msg}); one object per line"
            ) from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        out.append((lineno, obj))
    return out


def _string(obj: dict, key: str, path: Path, lineno: int) -> str:
    value = obj[key]
    if not isinstance(value, str):
        raise ValueError(f"{path}:{lineno}: {key!r} must be a string, got {value!r}")
    return value


def read_pairs(path: str | os.PathLike, *, format: str | None = None) -> list[tuple[str, str]]:
    """(source, target) pairs from a TSV or JSONL file; ``format`` overrides the suffix."""
    p = Path(path)
    fmt = _format(
        p, format, {".tsv": "tsv", ".txt": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}, "pair"
    )
    pairs = []
    if fmt == "tsv":
        for lineno, line in enumerate(read_lines(p), start=1):
            if not line.strip():
                continue
            fields = line.rstrip("\r").split("\t")
            if len(fields) != 2:
                raise ValueError(
                    f"{p}:{lineno}: expected 'source<TAB>target' but found {len(fields) - 1} tabs; "
                    f"fix the line, or use JSONL when texts contain tabs"
                )
            pairs.append((fields[0], fields[1]))
        return _non_empty(pairs, p)
    for lineno, obj in _jsonl_objects(p):
        keys = next((k for k in PAIR_KEYS if k[0] in obj and k[1] in obj), None)
        if keys is None:
            raise ValueError(
                f"{p}:{lineno}: expected keys 'src' and 'tgt' (or 'source' and 'target'), "
                f"found {sorted(obj)}"
            )
        pairs.append((_string(obj, keys[0], p, lineno), _string(obj, keys[1], p, lineno)))
    return _non_empty(pairs, p)


def read_parallel(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike
) -> list[tuple[str, str]]:
    """Pairs from two line-aligned files (e.g. ``train.de`` and ``train.en``)."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(
            f"parallel files have different line counts: {str(src_path)!r} has {len(src)}, "
            f"{str(tgt_path)!r} has {len(tgt)}; line i of each must be a translation pair"
        )
    return [(s.rstrip("\r"), t.rstrip("\r")) for s, t in zip(src, tgt)]


def read_labelled(path: str | os.PathLike, *, format: str | None = None) -> list[tuple[str, str]]:
    """(text, label) examples from a CSV (with a text,label header) or JSONL file."""
    p = Path(path)
    fmt = _format(p, format, {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}, "labelled")
    examples = []
    if fmt == "jsonl":
        for lineno, obj in _jsonl_objects(p):
            if "text" not in obj or "label" not in obj:
                raise ValueError(
                    f"{p}:{lineno}: expected keys 'text' and 'label', found {sorted(obj)}"
                )
            label = obj["label"]
            if not isinstance(label, (str, int)) or isinstance(label, bool):
                raise ValueError(f"{p}:{lineno}: 'label' must be a string or int, got {label!r}")
            examples.append((_string(obj, "text", p, lineno), str(label)))
        return _non_empty(examples, p)
    reader = csv.reader(io.StringIO(read_text(p), newline=""))
    header = [h.strip().lower() for h in next(reader)]
    if "text" not in header or "label" not in header:
        raise ValueError(
            f"{p}:1: the CSV header must name 'text' and 'label' columns, found {header}; "
            f"add a header line like 'text,label'"
        )
    t, l = header.index("text"), header.index("label")
    for row in reader:
        if not row:
            continue
        if len(row) != len(header):
            raise ValueError(
                f"{p}:{reader.line_num}: expected {len(header)} fields like the header, got "
                f'{len(row)}; quote text that contains commas: "a, b",label'
            )
        if not row[l].strip():
            raise ValueError(f"{p}:{reader.line_num}: empty label; every row needs one")
        examples.append((row[t], row[l].strip()))
    return _non_empty(examples, p)
