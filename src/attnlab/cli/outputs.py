"""Files a command writes for the user (experiment reports, exports, plots), never over theirs.

Each output directory gets a manifest, ``.attnlab-outputs.json``: every file an attnlab command
wrote there, with the SHA-256 of its bytes. A later command may replace such a file (it is an
earlier output, unedited since); any other file it would replace is the user's, and the command
stops naming it before it does anything. ``export --force`` removes exactly the files of the
earlier export its manifest lists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from attnlab.checkpoint.atomic import atomic_write_json
from attnlab.errors import UserError

MANIFEST = ".attnlab-outputs.json"
BOOKKEEPING = ".attnlab-"  # the manifest, attnlab.lab.kit.pieces / resume files: never the user's


class NotOursError(UserError):
    """A command would replace a file that attnlab did not write."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files_in(root: Path, names: Collection[str] | None = None) -> dict[str, str]:
    """Every file under ``root`` (relative path -> SHA-256) but attnlab's own bookkeeping (the
    manifest, a resumable run's ledger of pieces and its finished jobs' results: ``.attnlab-*``
    files and folders); only those of ``names`` if given (a plot into the current directory
    hashes its own file alone)."""
    if not root.is_dir():
        return {}
    found = sorted(root.rglob("*")) if names is None else [root / n for n in sorted(names)]
    return {
        str(p.relative_to(root)): _digest(p)
        for p in found
        if p.is_file()
        and not any(part.startswith(BOOKKEEPING) for part in p.relative_to(root).parts)
    }


def recorded(root: Path) -> dict[str, str]:
    """The files the manifest of ``root`` lists as attnlab's (relative path -> SHA-256)."""
    try:
        data = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        return {str(k): str(v) for k, v in data["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def not_ours(root: Path, names: Collection[str] | None = None) -> list[str]:
    """Files under ``root`` (only those in ``names``, if given) that attnlab did not write, or
    that were changed since."""
    own = recorded(root)
    return [n for n, digest in files_in(root, names).items() if own.get(n) != digest]


def stamps(root: Path, names: Collection[str]) -> dict[str, int]:
    """Each file's modification time in ns (relative path -> st_mtime_ns)."""
    return {n: (root / n).stat().st_mtime_ns for n in names}


def record(
    root: Path,
    before: dict[str, str],
    names: Collection[str] | None = None,
    times: dict[str, int] | None = None,
) -> None:
    """Add the files under ``root`` (of ``names``, if given) that are new or changed since
    ``before``, or rewritten since their modification times ``times`` (the same bytes again,
    e.g. a figure of an earlier report drawn again), to its manifest."""

    def written(name: str, digest: str) -> bool:
        rewritten = times is not None and times.get(name) != (root / name).stat().st_mtime_ns
        return before.get(name) != digest or rewritten

    after = files_in(root, names)
    own = {n: d for n, d in recorded(root).items() if (root / n).is_file()}
    own.update({n: d for n, d in after.items() if written(n, d)})
    if own:
        atomic_write_json(root / MANIFEST, {"written_by": "attnlab", "files": own})


@contextlib.contextmanager
def outputs(
    root: Path,
    what: str,
    *,
    names: Collection[str] | None = None,
    earlier_ours: Callable[[Path], bool] = lambda root: False,
    check: bool = True,
) -> Iterator[None]:
    """Let the block write into ``root`` only if it replaces no file of the user's: refuse up
    front when ``root`` holds a file (of ``names``, if given) attnlab did not write, unless
    ``earlier_ours(root)`` recognises the directory as an earlier output written before
    manifests existed; afterwards record what the block wrote. ``check=False``: the block
    refuses every existing file itself, only record."""
    foreign = not_ours(root, names) if check else []
    if foreign and not earlier_ours(root):
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise NotOursError(
            f"{what} would write into {str(root)!r}, which holds files attnlab did not write "
            f"({shown}); choose a new or empty --out (or move those files away) so nothing of "
            f"yours is replaced"
        )
    before = files_in(root, names)
    times = stamps(root, before)
    yield
    record(root, before, names, times)


def remove_earlier(root: Path, what: str) -> None:
    """Remove the files of an earlier output in ``root`` (those its manifest lists, unchanged);
    refuse when ``root`` holds anything else (a run directory, the user's files)."""
    foreign = not_ours(root)
    if foreign:
        shown = ", ".join(foreign[:5])
        raise NotOursError(
            f"--force replaces only an earlier {what} by attnlab, and {str(root)!r} holds other "
            f"files ({shown}); choose a new or empty --out"
        )
    for name in recorded(root):
        (root / name).unlink(missing_ok=True)
    (root / MANIFEST).unlink(missing_ok=True)
