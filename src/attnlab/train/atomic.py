"""The atomic writer now lives one floor down, in :mod:`attnlab.checkpoint.atomic` (so that
``interop`` on floor 4 can use it too); this module keeps the old import path working."""

from attnlab.checkpoint.atomic import (
    DiskFullError,
    NotWritableError,
    StorageError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    atomic_write_with,
    ensure_writable_dir,
    fsync_dir,
    storage_error,
    storage_errors,
    write_synced,
)

__all__ = [
    "DiskFullError",
    "NotWritableError",
    "StorageError",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "atomic_write_with",
    "ensure_writable_dir",
    "fsync_dir",
    "storage_error",
    "storage_errors",
    "write_synced",
]
