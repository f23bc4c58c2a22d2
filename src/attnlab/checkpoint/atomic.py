"""Atomic, durable file writes: a reader sees the old file or the new one, never half of either.

The recipe (what databases and package managers do):

    1. write the bytes to a temporary file in the *same* directory (same filesystem),
    2. flush and ``fsync`` it, so the data is on disk before it gets its real name,
    3. ``os.replace`` it over the target: one atomic rename on POSIX and Windows,
    4. ``fsync`` the directory, so the rename itself survives a power cut.

A crash (even ``kill -9``) between any two steps leaves the previous file intact plus, at worst,
a stray ``.<name>.tmp-*`` file that nothing reads. Checkpoint directories use the same idea one
level up (see :mod:`attnlab.checkpoint.save`). This is the one atomic writer of the package: the
training checkpoints, reports and figures, and ``interop``'s Hugging Face and safetensors exports
(whose libraries write to a path, hence :func:`atomic_write_with`) all go through it.

Operating-system errors become :class:`~attnlab.errors.UserError` subclasses whose one-paragraph
message names the path and the fix: a full disk (:class:`DiskFullError`), a directory the user
cannot write (:class:`NotWritableError`), anything else (:class:`StorageError`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attnlab.errors import UserError

PathLike = str | os.PathLike


class StorageError(UserError):
    """Writing a file or directory failed for an operating-system reason."""


class DiskFullError(StorageError):
    """The device ran out of space (ENOSPC) or quota (EDQUOT)."""


class NotWritableError(StorageError):
    """The directory is read-only or belongs to someone else (EACCES, EPERM, EROFS)."""


_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def storage_error(err: OSError, path: PathLike, action: str = "write") -> StorageError:
    """Translate an ``OSError`` raised while touching ``path`` into a user-facing error."""
    where = str(path)
    if err.errno in _FULL:
        return DiskFullError(
            f"no space left on the device while trying to {action} {where!r} ({err.strerror}); "
            f"free some space or choose another output directory (out) on a disk with room. "
            f"Previously saved checkpoints were not touched.",
            fields=("out",),
        )
    if err.errno in _DENIED:
        return NotWritableError(
            f"cannot {action} {where!r}: {err.strerror}; choose a directory you can write "
            f"(out) or fix its permissions (e.g. chmod u+w on the directory)",
            fields=("out",),
        )
    return StorageError(f"could not {action} {where!r}: {err.strerror or err}")


@contextlib.contextmanager
def storage_errors(path: PathLike, action: str = "write") -> Iterator[None]:
    """``with storage_errors(p): ...`` re-raises any ``OSError`` as a :class:`StorageError`."""
    try:
        yield
    except StorageError:
        raise
    except OSError as err:
        raise storage_error(err, getattr(err, "filename", None) or path, action) from err


def fsync_dir(path: PathLike) -> None:
    """Make a rename or a new entry in directory ``path`` durable (a no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # Windows cannot open directories; renames there are already durable
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_synced(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` (create or truncate) and fsync it; not atomic by itself.

    Used for files inside a directory that is renamed into place afterwards.
    """
    with storage_errors(path), open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _file_mode(target: Path) -> int:
    """Keep an existing file's mode; new files get 0o666 minus the umask, like ``open``."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0o022)  # read the umask (the only portable way) and put it back
        os.umask(umask)
        return 0o666 & ~umask


def atomic_write_with(path: PathLike, write: Callable[[str], object]) -> Path:
    """Replace ``path`` atomically and durably with what ``write(tmp_name)`` writes to a temporary
    file beside it (for libraries that write to a path, e.g. ``safetensors.torch.save_file``).
    Parent directories are created; the file gets the usual permissions (``open``'s)."""
    target = Path(path)
    with storage_errors(target.parent, "create the directory"):
        target.parent.mkdir(parents=True, exist_ok=True)
    with storage_errors(target):
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
        try:
            if hasattr(os, "fchmod"):  # mkstemp creates 0o600; give the usual permissions
                os.fchmod(fd, _file_mode(target))
            os.close(fd)
            write(tmp)
            with open(tmp, "rb+") as f:  # the library closed its handle; flush it to disk
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fsync_dir(target.parent)
    return target


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically and durably; parent directories are created."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"atomic_write_bytes needs bytes, got {type(data).__name__}")
    return atomic_write_with(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: PathLike, text: str) -> Path:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text needs a str, got {type(text).__name__}")
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """Replace ``path`` with ``obj`` as JSON (UTF-8, keys in insertion order) atomically."""
    try:
        text = json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError) as err:
        raise TypeError(f"cannot write {str(path)!r} as JSON: {err}") from None
    return atomic_write_text(path, text + "\n")


def ensure_writable_dir(path: PathLike) -> Path:
    """Create ``path`` if needed and prove it is writable now, before hours of training.

    Raises :class:`NotWritableError` / :class:`DiskFullError` with the fix in the message.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise NotWritableError(
            f"{str(p)!r} exists and is a file, not a directory; choose another output "
            f"directory (out)",
            fields=("out",),
        )
    with storage_errors(p, "create the directory"):
        p.mkdir(parents=True, exist_ok=True)
    with storage_errors(p, "write into the directory"):
        fd, probe = tempfile.mkstemp(dir=p, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    return p
