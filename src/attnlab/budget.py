"""Memory checked before allocating: what a model, table or benchmark needs against what this
machine has, so an impossible size stops with one sentence (the estimate, the limit and the fix)
instead of an out-of-memory kill or a traceback from deep inside an allocation.

The limit is the memory the operating system reports available now (``MemAvailable`` of
``/proc/meminfo``, else free physical pages); where neither is known nothing is checked.
"""

from __future__ import annotations

import os

import torch

from attnlab.errors import UserError

GIB = 1024**3


class MemoryBudgetError(UserError):
    """An allocation would need more memory than this machine has available."""


def available_bytes() -> int | None:
    """Memory available to a new allocation on this machine (bytes), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gpu_available_bytes(device) -> int | None:
    """Free memory of a CUDA ``device`` (bytes, ``torch.cuda.mem_get_info``), or None."""
    try:
        return int(torch.cuda.mem_get_info(device)[0])
    except (RuntimeError, AssertionError, ValueError):
        return None


def _on_gpu(device) -> bool:
    return device is not None and getattr(device, "type", str(device)).startswith("cuda")


def check_allocation(nbytes: float, what: str, fix: str, device=None) -> None:
    """Raise :class:`MemoryBudgetError` when ``nbytes`` exceed the available memory; ``what``
    names the allocation (``"a decoder_lm of 1.2e12 parameters"``), ``fix`` how to shrink it.
    ``device``: a CUDA device's free memory is the limit instead of the machine's."""
    on_gpu = _on_gpu(device)
    limit = gpu_available_bytes(device) if on_gpu else available_bytes()
    if limit is not None and nbytes > limit:
        where = f"{device} has" if on_gpu else "this machine has"
        raise MemoryBudgetError(
            f"{what} needs about {nbytes / GIB:,.1f} GiB of memory, but {where} "
            f"{limit / GIB:,.1f} GiB available; {fix}"
        )


def fits_easily(nbytes: float, device=None) -> bool:
    """Whether ``nbytes`` is below an eighth of the available memory (no exact count needed);
    ``device`` as in :func:`check_allocation`."""
    limit = gpu_available_bytes(device) if _on_gpu(device) else available_bytes()
    return limit is None or nbytes < limit / 8
