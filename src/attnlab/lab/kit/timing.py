"""Wall time on the CPU and on a GPU, for the lab's timing experiments (``parallelism``,
``complexity``): the notes' claims about parallel hardware are about GPUs, so where one is present
those experiments time their work on it as well as on the CPU.

A CUDA kernel returns before it has run, so a GPU time is taken between two
``torch.cuda.synchronize()`` calls: the interval covers the work, not its launch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

CPU = torch.device("cpu")


def find_gpu() -> torch.device | None:
    """The first CUDA device, or None on a machine without one."""
    return torch.device("cuda") if torch.cuda.is_available() else None


def device_name(device: torch.device) -> str:
    """The GPU's model name (``NVIDIA H200``), or the device's own name (``cpu``)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(device)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds from the start of ``fn()`` until the work it queued on ``device`` is done."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return 1000 * (time.perf_counter() - start)


def best_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """The fastest of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones (the minimum is
    the least disturbed by other processes and the GPU's clock ramp)."""
    for _ in range(warmup):
        fn()
    return min(wall_ms(fn, device) for _ in range(repeats))
