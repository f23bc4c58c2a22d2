"""The run's ``checkpoints/`` directory: file names, pointers, listing, retention, cleanup.

The layout and the crash-safety argument are described in :mod:`attnlab.checkpoint.save`, which
writes the checkpoints. This module holds the names of the files and directories described there
and the bookkeeping around complete checkpoints: placing a finished ``.tmp-*`` directory with one
atomic rename, reading the ``latest`` and ``best`` pointers, listing complete ``step_*``
directories, deleting all but the newest ``keep_last``, removing the ``.tmp-*``, ``.del-*``,
``.old-*`` and ``.write-probe-*`` leftovers of crashed saves, and resolving a path a user passes to
its checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import warnings
from pathlib import Path

from attnlab.checkpoint.atomic import fsync_dir
from attnlab.errors import CheckpointError

FORMAT = "attnlab-checkpoint"
FORMAT_VERSION = 1
CHECKPOINTS = "checkpoints"
CONFIG, MODEL, TOKENIZER = "config.json", "model.safetensors", "tokenizer.json"
LABELS = "labels.json"
MANIFEST, TRAIN_STATE = "manifest.json", "train_state"
OPTIMIZER, STATE = f"{TRAIN_STATE}/optimizer.safetensors", f"{TRAIN_STATE}/state.json"
LATEST, BEST = "latest", "best"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")
# The name attnlab.checkpoint.atomic.ensure_writable_dir gives the empty file it creates and removes
# at once to prove a directory writable; one that survives was left by a process killed in between.
WRITE_PROBE = ".write-probe-"


# Placing, pointers, retention, cleanup -------------------------------------------------------
def _place_dir(tmp: Path, final: Path) -> None:
    """Atomically rename the finished ``tmp`` to ``final``, replacing an existing one."""
    old = final.with_name(f".old-{final.name}")
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)  # recovered by _cleanup if we die before the next line
    os.replace(tmp, final)
    fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def _step_of(path: Path) -> int | None:
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m else None


def damage_of(path: Path) -> str | None:
    """What makes the checkpoint directory ``path`` incomplete, or None when the files every
    checkpoint has are there: the one structural check that listing, resuming, evaluating and
    generating share (the loader then checks each file against the manifest's sizes and CRCs).

    A save assembles a checkpoint elsewhere and renames it into place whole, so a ``step_*``
    directory that fails this check was damaged afterwards (a file deleted or replaced)."""
    if not path.is_dir():
        return "it is not a directory"
    for name in (CONFIG, MODEL, MANIFEST):
        if (path / name).is_dir():
            return f"'{name}' is a directory, not a file"
        if not (path / name).is_file():
            return f"'{name}' is missing"
    return None


def _is_complete(path: Path) -> bool:
    return damage_of(path) is None


def step_dirs(root: Path) -> list[Path]:
    """Every ``step_*`` directory directly in the checkpoints directory ``root``, complete or
    not, oldest first."""
    if not root.is_dir():
        return []
    here = root.resolve()
    found = [
        p
        for p in root.iterdir()
        if _step_of(p) is not None and p.is_dir() and p.resolve().parent == here
    ]
    return sorted(found, key=lambda p: _step_of(p) or 0)


def newer_than(ckpt: Path) -> list[Path]:
    """The ``step_*`` directories of ``ckpt``'s run with a higher step than ``ckpt``: saves that
    did not finish (their ``latest`` update never happened) or damaged ones skipped for it."""
    step = _step_of(ckpt)
    if step is None:
        return []
    return [p for p in step_dirs(ckpt.parent) if (_step_of(p) or 0) > step]


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoint directories of a run (or of its ``checkpoints/`` dir), oldest first."""
    root = _checkpoint_root(Path(run_dir))
    return [] if root is None else [p for p in step_dirs(root) if _is_complete(p)]


def _checkpoint_root(p: Path) -> Path | None:
    if (p / CHECKPOINTS).is_dir():
        return p / CHECKPOINTS
    if p.is_dir() and ((p / LATEST).is_file() or any(_step_of(c) is not None for c in p.iterdir())):
        return p
    return None


def _is_ours(path: Path) -> bool:
    """Whether ``path`` is an attnlab checkpoint directory (safe to replace)."""
    try:
        return json.loads((path / CONFIG).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _read_pointer(root: Path, name: str) -> Path | None:
    """The complete checkpoint a pointer file names (or its displaced copy mid re-save)."""
    try:
        text = (root / name).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    target = root / text
    if _step_of(target) is None:
        return None
    if Path(text).name != text or target.resolve().parent != root.resolve():
        warnings.warn(
            f"{str(root / name)!r} names {text!r}, which is not a checkpoint of this run; the "
            f"pointer is ignored (a pointer holds a step_* name inside its own checkpoints/)",
            stacklevel=3,
        )
        return None
    for candidate in (target, root / f".old-{target.name}"):  # see _place_dir
        if _is_complete(candidate):
            return candidate
    return target if target.is_dir() else None  # damaged: the loader names what is wrong


def _current_best(root: Path) -> tuple[str | None, float | None]:
    best = _read_pointer(root, BEST)
    if best is None:
        return None, None
    try:
        metric = json.loads((best / MANIFEST).read_text(encoding="utf-8")).get("metric")
    except (OSError, ValueError):
        return None, None
    return best.name, metric


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from: ``latest``'s target, else the highest complete step dir.

    ``run_dir`` may be a run directory, its ``checkpoints/`` directory, or a checkpoint directory
    itself (returned as is). None when there is nothing to resume from.
    """
    p = Path(run_dir)
    if (p / CONFIG).is_file():
        return p
    root = _checkpoint_root(p)
    if root is None:
        return None
    target = _read_pointer(root, LATEST)
    if target is not None:
        return target
    found = list_checkpoints(root)  # newer damaged ones are named by report_unfinished
    if found and (root / LATEST).is_file():
        warnings.warn(
            f"{str(root / LATEST)!r} does not name a checkpoint directory of this run; using "
            f"the highest step, {found[-1].name}",
            stacklevel=2,
        )
    return found[-1] if found else None


def best_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The checkpoint with the best metric, or None if no save passed a metric."""
    root = _checkpoint_root(Path(run_dir))
    return None if root is None else _read_pointer(root, BEST)


def _retain(root: Path, keep_last: int, protect: set[str | None]) -> None:
    if keep_last == 0:
        return
    found = list_checkpoints(root)
    for path in found[: max(len(found) - keep_last, 0)]:
        if path.name not in protect:
            doomed = root / f".del-{path.name}-{secrets.token_hex(3)}"
            os.replace(path, doomed)  # never leave a half-deleted dir that looks complete
            shutil.rmtree(doomed, ignore_errors=True)


def _cleanup(root: Path) -> None:
    """Remove leftovers of crashed saves; restore a checkpoint displaced by a crashed re-save."""
    for p in root.iterdir():
        stale_tmp = p.name.startswith(".tmp-") and not _owner_alive(p.name)
        if stale_tmp or p.name.startswith(".del-"):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith((f".{LATEST}.tmp-", f".{BEST}.tmp-")) and p.is_file():
            p.unlink(missing_ok=True)  # a pointer write killed before its os.replace
        elif p.name.startswith(".old-"):
            original = root / p.name[len(".old-") :]
            if original.exists():
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.replace(p, original)
    remove_write_probes(root)


def remove_write_probes(directory: Path) -> None:
    """Remove the write probes a killed process left in ``directory`` (see ``WRITE_PROBE``).

    Called only by the process that owns the directory (the run lock's holder, or a save into the
    run's own ``checkpoints/``): a probe lives for one create-and-unlink, so any it finds is dead.
    """
    for p in directory.glob(WRITE_PROBE + "*"):
        if p.is_file():
            p.unlink(missing_ok=True)


def _owner_alive(name: str) -> bool:
    """Whether the process that named ``.tmp-<what>-<pid>-<hex>`` still runs (and is not us)."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


# Resolving a user's path ---------------------------------------------------------------------
def _resolve(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise CheckpointError(
            f"no checkpoint at {str(p)!r}: the path does not exist; pass a run directory "
            f"(with checkpoints/ inside) or a checkpoint directory such as "
            f"runs/NAME/checkpoints/step_00001000"
        )
    if p.is_file():
        if p.name in (LATEST, BEST) and (target := _read_pointer(p.parent, p.name)) is not None:
            return target
        if p.name == LATEST and (complete := list_checkpoints(p.parent)):
            return complete[-1]  # the pointer was not usable: the highest complete step
        raise CheckpointError(
            f"{str(p)!r} is a file, but a checkpoint is a directory (config.json + "
            f"model.safetensors); pass the directory that contains it"
        )
    found = latest_checkpoint(p)
    if found is None:
        raise CheckpointError(
            f"no checkpoint in {str(p)!r}: it holds neither config.json nor a checkpoints/ "
            f"directory with a complete step_* checkpoint; train first (`attnlab train --out "
            f"{p}`) or pass the right directory"
        )
    return found
