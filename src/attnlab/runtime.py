"""Floor 0 (docs: ARCHITECTURE.md): what this machine can do, asked once, for every floor above.

The CPU's model and load (recorded beside every benchmark and experiment), and whether its
matrix products run natively in bfloat16. Memory limits are :mod:`attnlab.budget`.
"""

from __future__ import annotations

import os
import platform

import torch


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the system has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN runs bfloat16 matmuls natively here (AVX-512 BF16 or AMX).

    Without it CPU bf16 autocast emulates the arithmetic and is slower than fp32.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
