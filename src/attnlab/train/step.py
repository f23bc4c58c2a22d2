"""One optimizer step of the training loop, on every process of the job.

Step s (0-based):

    seed torch with f(seed, s, rank)                  dropout noise is a pure function of the step
    lr_s = lr_at(s)                                   warm-up + decay (attnlab.train.optim)
    for k in 0..grad_accum-1:                         shard k * world_size + rank of step s
        L_k = sum of per-target losses of batch j     (attnlab.train.objectives)
        backward(L_k * world_size / N)                N = targets in the step, over all ranks
    clip the global gradient norm; optimizer.step()

DDP averages gradients over ranks, so the update is that of the mean loss over all N targets of
the global batch, exactly as one process would compute it (up to floating-point summation order).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import torch
from torch import nn

from attnlab.train.distributed import DistInfo, all_reduce_sum
from attnlab.train.objectives import batch_loss, move_batch, target_count
from attnlab.train.optim import clip_gradient_norm, set_lr


class StepParts(NamedTuple):
    """What a step works on; fixed for the whole run."""

    net: nn.Module  # the model as called: wrapped in DDP and/or torch.compile, or plain
    model: nn.Module  # the plain model (its parameters are clipped and saved)
    optimizers: Sequence[torch.optim.Optimizer]
    data: Any  # attnlab.train.task_data.TaskData
    cfg: Any  # TrainConfig
    info: DistInfo
    device: torch.device
    amp: torch.dtype | None  # autocast dtype, None for fp32


class StepStats(NamedTuple):
    """What one step measured, summed over the processes of the job."""

    loss: float  # mean per-target training loss of the step
    tokens: float  # targets of the step
    grad_norm: float  # global gradient norm before clipping
    lr: float  # learning rate used
    stop_votes: float  # processes that received SIGINT/SIGTERM (> 0: stop after this step)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of one (step, rank): well mixed, independent of anything else."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    """``torch.autocast`` to ``dtype`` on ``device``, or nothing for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def train_step(parts: StepParts, step: int, stop_requested: bool) -> StepStats:
    """Run optimizer step ``step`` (see module doc); every process calls it with the same step."""
    cfg, info, data = parts.cfg, parts.info, parts.data
    torch.manual_seed(step_seed(cfg.seed, step, info.rank))
    lr = set_lr(parts.optimizers, step, cfg)
    shards = cfg.grad_accum * info.world_size
    cpu_batches = [
        data.train_batch(step, cfg.batch_size, k * info.world_size + info.rank, shards)
        for k in range(cfg.grad_accum)
    ]
    n_targets = float(sum(target_count(b, data.kind) for b in cpu_batches))  # counted on the host
    if info.enabled:
        n_targets = float(all_reduce_sum(torch.tensor([n_targets], device=parts.device), info))
    batches = [move_batch(b, parts.device) for b in cpu_batches]
    scale = info.world_size / n_targets
    step_loss = torch.zeros((), dtype=torch.float64, device=parts.device)
    step_tokens = 0
    for k, batch in enumerate(batches):
        last = k == len(batches) - 1
        # distributed: net is DistributedDataParallel (torch.compile's wrapper forwards no_sync)
        ddp = cast(nn.parallel.DistributedDataParallel, parts.net)
        sync = contextlib.nullcontext() if last or not info.enabled else ddp.no_sync()
        with sync:
            with autocast(parts.device, parts.amp):
                loss = batch_loss(parts.net, batch, data.kind, cfg.label_smoothing)
            (loss.total * scale).backward()
        step_loss += loss.total.detach().double() / n_targets
        step_tokens += loss.n_tokens
    grad_norm = clip_gradient_norm(parts.model.parameters(), cfg.grad_clip)
    for opt in parts.optimizers:
        opt.step()
        opt.zero_grad(set_to_none=True)
    norm = grad_norm.detach().to(step_loss)
    if not info.enabled:  # the step's one wait for the device: loss and norm read back together
        step_loss, norm = torch.stack([step_loss, norm]).tolist()
        return StepStats(step_loss, float(step_tokens), norm, lr, float(stop_requested))
    shared = torch.tensor(
        [0.0, float(step_tokens), float(stop_requested)], dtype=torch.float64, device=parts.device
    )
    shared[0] = step_loss
    step_loss, step_tokens, stops = all_reduce_sum(shared, info).tolist()
    return StepStats(step_loss, step_tokens, float(norm), lr, stops)
