"""What machine a benchmark ran on: CPU model, cores, threads, library versions, load.

Numbers from a shared machine are only comparable within one run; the load average recorded
here says how busy the machine was while they were taken.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import torch

from attnlab.runtime import cpu_model, load_average


def machine_info(threads: int) -> dict[str, Any]:
    """JSON ``machine`` block: cpu_model, logical_cores, threads, torch/python versions, load."""
    try:
        import transformers  # optional (dev extra): the reference only

        hf_version = transformers.__version__
    except ImportError:
        hf_version = None
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        capability = None
    try:
        mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem_bytes = None
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "threads": threads,
        "cpu_capability": capability,
        "memory_bytes": mem_bytes,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": hf_version,
        "flush_denormal": True,
        "load_average_start": load_average(),
    }
