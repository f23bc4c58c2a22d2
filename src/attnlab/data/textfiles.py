"""Reading local text files: strict UTF-8, deterministic file order, errors that name the fix.

Every reader in ``attnlab.data`` goes through :func:`read_text`, so a missing path, an empty file
or bytes that are not UTF-8 always produce the same kind of message: which file, which byte
offset, and what to do about it. Nothing is ever downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst")

PathLike = str | os.PathLike


def require_file(path: PathLike, what: str = "file") -> Path:
    """Return ``path`` as a Path, or raise FileNotFoundError naming it and the fix."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"{what} {str(p)!r} does not exist; check the path (cwd={os.getcwd()})"
        )
    if not p.is_file():
        raise ValueError(f"{what} {str(p)!r} is not a regular file; pass a file path")
    return p


def read_text(path: PathLike, *, allow_empty: bool = False) -> str:
    """The whole file decoded as strict UTF-8 (a leading BOM is dropped).

    Raises FileNotFoundError for a missing file, ValueError for an empty file (unless
    ``allow_empty``) and for bytes that are not UTF-8 (naming the byte offset).
    """
    p = require_file(path)
    data = p.read_bytes()
    if not data and not allow_empty:
        raise ValueError(f"file {str(p)!r} is empty; give it some text or remove it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        snippet = data[max(0, err.start - 10) : err.start + 10]
        raise ValueError(
            f"file {str(p)!r} is not valid UTF-8: byte 0x{data[err.start]:02x} at offset "
            f"{err.start} ({err.reason}; context {snippet!r}); re-encode it, e.g. "
            f"`iconv -f latin1 -t utf-8 in.txt > out.txt`"
        ) from None
    return text.removeprefix("\ufeff")


def read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 file without their ``\\n`` (the ``\\r`` of a CRLF file is kept; callers
    that read text strip it)."""
    text = read_text(path)
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def list_text_files(path: PathLike, suffixes: Iterable[str] = TEXT_SUFFIXES) -> list[Path]:
    """One file, or every file under a directory with a text suffix, sorted by relative path.

    Sorting makes the token stream (and so the train/validation split) independent of the file
    system's listing order. Hidden files and directories (leading ``.``) are skipped.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"corpus path {str(p)!r} does not exist; pass a text file or a directory of "
            f"{'/'.join(TEXT_SUFFIXES)} files"
        )
    if p.is_file():
        return [p]
    wanted = tuple(s.lower() for s in suffixes)
    files = sorted(
        f
        for f in p.rglob("*")
        if f.is_file()
        and f.suffix.lower() in wanted
        and not any(part.startswith(".") for part in f.relative_to(p).parts)
    )
    if not files:
        raise ValueError(
            f"directory {str(p)!r} contains no text files with suffix {list(wanted)}; "
            f"add some or give the files one of these suffixes (from Python, "
            f"list_text_files(path, suffixes=...) reads others)"
        )
    return files


def iter_texts(files_or_texts: PathLike | Iterable[str | os.PathLike]) -> Iterator[str]:
    """Texts from a mix of in-memory strings and paths.

    A single ``Path``/``os.PathLike`` (file or directory) or any ``os.PathLike`` element of an
    iterable is read from disk; plain ``str`` elements are the texts themselves. A bare ``str``
    argument is treated as one text, not a path: wrap paths in ``pathlib.Path`` to read them.
    """
    if isinstance(files_or_texts, str):
        yield files_or_texts
        return
    if isinstance(files_or_texts, os.PathLike):
        files_or_texts = [files_or_texts]
    for item in files_or_texts:
        if isinstance(item, os.PathLike):
            for f in list_text_files(item):
                yield read_text(f, allow_empty=True)
        elif isinstance(item, str):
            yield item
        else:
            raise TypeError(
                f"expected str texts or pathlib.Path files, got {type(item).__name__}: {item!r}"
            )
