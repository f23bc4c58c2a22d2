"""One training per run directory: an exclusive lock on ``RUN_DIR/.attnlab-lock``.

Two processes writing checkpoints and ``metrics.jsonl`` into one directory would interleave their
metrics and keep only one run's checkpoints, with both exiting 0. So :func:`run_lock` takes an
exclusive ``flock`` on a lock file inside the run directory for as long as training runs; a
second process gets a :class:`RunLockedError` naming the holder's PID at once (it never waits).

The lock file holds the holder's PID. The operating system drops a ``flock`` when its process
dies, however it dies (``kill -9`` included), so a dead holder never blocks the next run; its file
is left behind, though, and the next run reports it as stale (a previous run was killed) before
taking the lock over, and removes the write probes a killed run left in the directory. On a normal
exit the file is removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

from attnlab.checkpoint.atomic import ensure_writable_dir, storage_error
from attnlab.checkpoint.rundir import remove_write_probes
from attnlab.errors import UserError

LOCK_FILE = ".attnlab-lock"

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; the lock is a no-op there
    fcntl = None  # type: ignore[assignment]


class RunLockedError(UserError):
    """Another live process is training into the same run directory."""


def _holder(path: Path) -> tuple[int | None, str]:
    """(PID, host) written in the lock file, (None, "") if it holds none."""
    try:
        pid, _, host = path.read_text(encoding="utf-8").strip().partition(" ")
        return int(pid), host
    except (OSError, ValueError):
        return None, ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: it exists, owned by someone else
        return True
    return True


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, *, enabled: bool = True) -> Iterator[Path | None]:
    """Hold the exclusive lock of ``run_dir`` (created if missing) while the block runs.

    Raises :class:`RunLockedError` naming the holder's PID when another process holds it; warns
    when a lock file left by a dead process is taken over. ``enabled=False`` (the other
    processes of a torchrun job: rank 0 holds the lock for all) does nothing.
    """
    if not enabled or fcntl is None:
        yield None
        return
    run_dir = ensure_writable_dir(run_dir)
    path = run_dir / LOCK_FILE
    while True:  # the file may be removed by its holder between our open and our flock
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise storage_error(err, path, "create the lock file") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise storage_error(err, path, "lock") from None
            pid, host = _holder(path)
            who = f"process {pid}" + (f" on {host}" if host else "") if pid else "another process"
            raise RunLockedError(
                f"{who} is training into {str(run_dir)!r} right now (it holds {path.name}); two "
                f"runs in one directory would mix their checkpoints and metrics. Wait for it to "
                f"finish (or stop it: kill {pid or 'PID'}), or train into another out directory",
                fields=("out",),
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # we locked a file its holder had just removed: try the new one
    try:
        pid, host = _holder(path)
        if pid is not None and pid != os.getpid():
            here = host in ("", socket.gethostname())
            state = "is no longer running" if here and not _alive(pid) else "left it behind"
            warnings.warn(
                f"{str(path)!r} names process {pid}, which {state}: a previous training in "
                f"this directory ended without releasing its lock (killed?). Taking the lock over",
                stacklevel=3,
            )
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except OSError as err:  # e.g. a full disk: named like every other write
            raise storage_error(err, path, "write the lock file") from None
        with contextlib.suppress(OSError):
            remove_write_probes(run_dir)  # a killed run's; ours are gone when the lock is held
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # still ours: nobody else can lock it while we hold it
        os.close(fd)  # releases the flock
