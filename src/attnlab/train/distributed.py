"""Devices and multi-process training (DistributedDataParallel), launched by ``torchrun``.

``torchrun --nproc_per_node N -m attnlab train ...`` starts N processes with ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE`` set. Each process builds the same model from the same seed,
wraps it in DDP (which averages gradients with an all-reduce during ``backward``), and draws its
own shard of every batch (``attnlab.train.task_data``). Backends: ``nccl`` on CUDA, ``gloo`` on
CPU. Without ``WORLD_SIZE > 1`` everything here is a no-op, so the loop has one code path.

Global batch = batch_size * grad_accum * world_size sequences per optimizer step.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import warnings
from typing import NamedTuple

import torch
import torch.distributed as dist

from attnlab.errors import ConfigError, FieldWarning
from attnlab.runtime import cpu_has_native_bf16


class DistInfo(NamedTuple):
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``"auto"`` -> CUDA if present else CPU; a requested device that is missing is an error."""
    if not isinstance(name, str) or not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        raise ConfigError(
            f"device={name!r} is not a device attnlab knows; use 'auto', 'cpu', 'cuda', "
            f"'cuda:N' or 'mps'",
            fields=("device",),
        )
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={name!r} but this machine has no usable CUDA device; "
                f"use device='cpu' (or 'auto')",
                fields=("device",),
            )
        if name == "cuda":
            name = f"cuda:{local_rank % torch.cuda.device_count()}"
        elif int(name[5:]) >= torch.cuda.device_count():
            raise ConfigError(
                f"device={name!r} but this machine has {torch.cuda.device_count()} CUDA "
                f"device(s), numbered from 0; use device='cuda:0' (or 'auto')",
                fields=("device",),
            )
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            "device='mps' but the Apple MPS backend is not available; use device='cpu'",
            fields=("device",),
        )
    return torch.device(name)


def autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for TrainConfig.dtype, or None for plain fp32."""
    if dtype == "fp32":
        return None
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            "dtype='bf16' but this GPU has no bfloat16 support; use dtype='fp32'", fields=("dtype",)
        )
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(
            f"dtype='bf16' autocast is not supported on {device.type}; use dtype='fp32'",
            fields=("dtype",),
        )
    if device.type == "cpu" and not cpu_has_native_bf16():
        warnings.warn(
            FieldWarning(
                "dtype='bf16' on a CPU without native bfloat16 products (no AVX-512 BF16 / AMX): "
                "PyTorch emulates them, which is usually several times slower than fp32 here; "
                "use dtype='fp32' unless you are checking bf16 numerics",
                fields=("dtype",),
            ),
            stacklevel=2,
        )
    return torch.bfloat16


def init_distributed(device_name: str) -> tuple[DistInfo, torch.device]:
    """Join the process group if launched by torchrun (``WORLD_SIZE > 1``); pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), resolve_device(device_name)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=dt.timedelta(minutes=30))
    return DistInfo(rank, world, local), device


def all_reduce_sum(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum ``values`` over processes (in place); identity in a single process."""
    if info.enabled:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def broadcast_flag(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """Rank 0's boolean, on every rank (e.g. "saving failed, stop")."""
    if not info.enabled:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def cleanup(info: DistInfo) -> None:
    """Leave the process group (``destroy_process_group``) at the end of training."""
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
