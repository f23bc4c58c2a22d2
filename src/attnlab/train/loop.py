"""The training loop: ``train(run_config, run_dir=...)`` for every task kind and model family.

One optimizer step s (0-based) does, on every process:

    seed torch with f(seed, s, rank)                  dropout noise is a pure function of the step
    lr_s = lr_at(s)                                   warm-up + decay (attnlab.train.optim)
    for k in 0..grad_accum-1:                         shard k * world_size + rank of step s
        L_k = sum of per-target losses of batch j     (attnlab.train.objectives)
        backward(L_k * world_size / N)                N = targets in the step, over all ranks
    clip the global gradient norm; optimizer.step()

DDP averages gradients over ranks, so the update is that of the mean loss over all N targets of
the global batch, exactly as one process would compute it (up to floating-point summation
order). Because data order, dropout noise and the learning rate depend only on (seed, step,
rank), a run resumed from a checkpoint at step s repeats steps s, s+1, ... bit for bit.

Rank 0 alone evaluates (``eval_batches`` batches of the global batch size), writes metrics,
plots and checkpoints; the others wait at a barrier.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab.errors import UserError
from attnlab.models import build_model
from attnlab.train.atomic import atomic_write_text
from attnlab.train.checkpoint import best_checkpoint, restore_training, save_checkpoint
from attnlab.train.distributed import (
    DistInfo,
    all_reduce_sum,
    autocast_dtype,
    barrier,
    broadcast_flag,
    cleanup,
    init_distributed,
)
from attnlab.train.evaluate import Prediction, evaluate
from attnlab.train.objectives import batch_loss, move_batch, target_count
from attnlab.train.optim import build_optimizers, clip_gradients, set_lr
from attnlab.train.report import METRICS_FILE, PLOT_FILE, MetricsLog, TensorBoard, plot_loss
from attnlab.train.report import progress_bar as make_progress_bar
from attnlab.train.run_config import RunConfig, dump_toml
from attnlab.train.setup import prepare_run
from attnlab.train.signals import EXIT_CODES, GracefulStop
from attnlab.train.state import restore_rng_state

CONFIG_FILE = "config.toml"


class TrainingDiverged(UserError):
    """The loss became NaN or infinite."""


@dataclass
class TrainResult:
    """What a call to :func:`train` did."""

    run_dir: Path
    step: int  # optimizer steps done in total (including those before a resume)
    start_step: int  # where this call started (0, or the resumed checkpoint's step)
    losses: list[tuple[int, float]]  # (step, train loss) of every step run in this call
    metrics: dict[str, float]  # the last evaluation
    predictions: list[Prediction]  # of the last evaluation (seq2seq / classify)
    checkpoint: Path | None  # the last checkpoint written
    best_checkpoint: Path | None
    elapsed_s: float  # wall time of the run, summed over resumes
    model: nn.Module  # the trained model (unwrapped, eval mode, on its device)
    tokenizer: Any
    labels: Any = None
    resumed_from: Path | None = None
    stopped_by: str | None = None  # "SIGINT" / "SIGTERM" if interrupted
    exit_code: int = 0  # 0, or 130 / 143 after an interrupt
    summary: str = ""  # one line describing the data
    extra: dict[str, Any] = field(default_factory=dict)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of one (step, rank): well mixed, independent of anything else."""
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])


def train(
    run_config: RunConfig,
    *,
    run_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    stop_at: int | None = None,
) -> TrainResult:
    """Train the model of ``run_config.model`` on ``run_config.train``'s task; see module doc.

    ``run_dir`` defaults to ``train.out``. With ``resume`` the run continues from the latest
    checkpoint there (bit-identically); without it a run directory that holds checkpoints is an
    error, so saved work is never overwritten. ``stop_at`` ends this call after that global
    step with a checkpoint (the schedule still runs to ``train.steps``), e.g. to split a long
    run into pieces that fit a job time limit and continue each with ``resume``.
    """
    if not isinstance(run_config, RunConfig):
        raise TypeError(f"train() needs a RunConfig, got {type(run_config).__name__}")
    cfg = run_config.train
    info, device = init_distributed(cfg.device)
    try:
        with cpu_settings(cfg.threads):
            run_dir = Path(run_dir or cfg.out)
            return _train(run_config, run_dir, resume, progress, stop_at, info, device)
    finally:
        cleanup(info)


@contextlib.contextmanager
def cpu_settings(threads: int):
    """Flush denormals to zero and use ``threads`` intra-op threads (0: leave as is) while
    training; restore the thread count and PyTorch's default (denormals kept) afterwards.

    Denormal floats (|x| < 1.2e-38) take a slow microcode path on x86: tiny gradients and Adam
    moments can make a CPU step several times slower, so training flushes them to zero.
    """
    before = torch.get_num_threads()
    torch.set_flush_denormal(True)
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(before)


def _train(run_config: RunConfig, run_dir: Path, resume: bool, progress: bool,
           stop_at: int | None, info: DistInfo, device: torch.device) -> TrainResult:  # fmt: skip
    cfg = run_config.train
    amp = autocast_dtype(cfg.dtype, device)
    setup = prepare_run(run_config, run_dir, resume, info)
    data, model_cfg, ckpt = setup.data, setup.model_config, setup.checkpoint
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    model = ckpt.model if ckpt is not None else build_model(model_cfg)
    model.to(device).train()
    optimizers = build_optimizers(model, cfg)
    start, elapsed0 = 0, 0.0
    if ckpt is not None:
        extra = restore_training(ckpt, optimizers)
        start, elapsed0 = extra["step"], float(extra.get("elapsed_s", 0.0))
        restore_rng_state(extra["rng"])
    if start > cfg.steps:
        raise UserError(f"the checkpoint is at step {start}, past steps={cfg.steps}; "
                        f"raise --steps to train longer")  # fmt: skip
    net: nn.Module = model
    if info.enabled:
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if cfg.compile:
        if data.kind != "lm":
            warnings.warn(
                f"--compile on padded {data.kind} batches: their shapes change from batch to batch "
                "and torch.compile recompiles for them (the dates preset, 120 steps: 93 s compiled "
                "against 5.6 s eager); it pays off for LM windows, whose shape is fixed",
                stacklevel=2,
            )
        net = torch.compile(net)
    full_config = RunConfig(model_cfg, cfg)
    log = board = None
    if info.is_main:
        atomic_write_text(run_dir / CONFIG_FILE, dump_toml(full_config))
        log = MetricsLog(run_dir / METRICS_FILE, keep_until=start if ckpt is not None else None)
        board = TensorBoard(run_dir / "tensorboard") if cfg.tensorboard else None
    result = TrainResult(run_dir, start, start, [], {}, [], None, None, elapsed0, model,
                         data.tokenizer, data.labels, ckpt.path if ckpt else None,
                         summary=data.summary)  # fmt: skip
    result.checkpoint = ckpt.path if ckpt is not None else None
    bar = make_progress_bar(cfg.steps, start, progress and cfg.progress and info.is_main)
    t0 = last_t = time.perf_counter()
    window_loss, window_steps, window_tokens = 0.0, 0, 0.0
    evaluated_at = -1

    def run_eval(step: int) -> dict[str, float]:
        nonlocal evaluated_at
        metrics: dict[str, float] = {}
        if info.is_main:
            # eval_batches batches of the global batch: the same set whatever the process count
            size = cfg.batch_size * info.world_size
            res = evaluate(model, data, batch_size=size, max_batches=cfg.eval_batches,
                           device=device, autocast_dtype=amp)  # fmt: skip
            metrics, result.metrics, result.predictions = res.metrics, res.metrics, res.predictions
        evaluated_at = step
        barrier(info)
        return metrics

    def save(step: int, metrics: dict[str, float]) -> None:
        error = None
        if info.is_main:
            try:
                result.checkpoint = save_checkpoint(
                    run_dir, model=model, config=model_cfg, tokenizer=data.tokenizer,
                    labels=data.labels, step=step, optimizer=optimizers,
                    extra_state={"elapsed_s": result.elapsed_s, "world_size": info.world_size},
                    train_config=cfg.to_dict(), keep_last=cfg.keep_last,
                    metric=metrics.get(cfg.best_metric), higher_is_better=cfg.higher_is_better,
                )  # fmt: skip
            except (UserError, OSError) as err:
                error = err
        if broadcast_flag(error is not None, info, device):
            raise error or UserError("rank 0 failed to save a checkpoint; see its error above")

    with GracefulStop() as stop, bar:
        end = cfg.steps if stop_at is None else min(cfg.steps, max(stop_at, start))
        for step in range(start, end):
            torch.manual_seed(step_seed(cfg.seed, step, info.rank))
            lr = set_lr(optimizers, step, cfg)
            batches = [
                move_batch(data.train_batch(step, cfg.batch_size, k * info.world_size + info.rank,
                                            cfg.grad_accum * info.world_size), device)
                for k in range(cfg.grad_accum)
            ]  # fmt: skip
            count = torch.tensor([float(sum(target_count(b, data.kind) for b in batches))],
                                 device=device)  # fmt: skip
            n_targets = float(all_reduce_sum(count, info).item())
            scale = info.world_size / n_targets
            step_loss, step_tokens = 0.0, 0
            for k, batch in enumerate(batches):
                last = k == len(batches) - 1
                sync = contextlib.nullcontext() if last or not info.enabled else net.no_sync()
                with sync:
                    with _autocast(device, amp):
                        loss = batch_loss(net, batch, data.kind, cfg.label_smoothing)
                    (loss.total * scale).backward()
                step_loss += float(loss.total.detach()) / n_targets
                step_tokens += loss.n_tokens
            grad_norm = clip_gradients(model.parameters(), cfg.grad_clip)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            shared = torch.tensor([step_loss, float(step_tokens), float(stop.requested)],
                                  dtype=torch.float64, device=device)  # fmt: skip
            step_loss, step_tokens, stops = all_reduce_sum(shared, info).tolist()
            done = step + 1
            result.step, result.elapsed_s = done, elapsed0 + time.perf_counter() - t0
            if not math.isfinite(step_loss):
                raise TrainingDiverged(
                    f"the training loss became {step_loss} at step {done}; lower the learning "
                    f"rate (--lr), keep gradient clipping on (--grad-clip 1.0) or use fp32. "
                    f"Checkpoints saved before this step are intact"
                )
            result.losses.append((done, step_loss))
            window_loss, window_steps = window_loss + step_loss, window_steps + 1
            window_tokens += step_tokens
            bar.update(1)
            final = done == cfg.steps
            want_eval = final or (cfg.eval_every and done % cfg.eval_every == 0)
            want_log = want_eval or done % cfg.log_every == 0
            metrics = run_eval(done) if want_eval else {}
            if want_log:
                now = time.perf_counter()
                record = {
                    "step": done,
                    "train_loss": window_loss / window_steps,
                    "lr": lr,
                    "tokens_per_s": window_tokens / max(now - last_t, 1e-9),
                    "elapsed_s": result.elapsed_s,
                    "grad_norm": grad_norm,
                    **metrics,
                }
                last_t, window_loss, window_steps, window_tokens = now, 0.0, 0, 0.0
                bar.set_postfix(
                    loss=f"{record['train_loss']:.4f}",
                    tok_s=f"{record['tokens_per_s']:.0f}",
                    refresh=False,
                )
                if log is not None:
                    log.append(record)
                    if board is not None:
                        board.log(record)
            stopping = stops > 0
            paused = done == end and not final
            if final or stopping or paused or (cfg.save_every and done % cfg.save_every == 0):
                save(done, metrics)
            if want_eval and info.is_main:
                plot_loss(log.records, run_dir / PLOT_FILE, title=str(run_dir.name))
            if stopping:
                result.stopped_by = stop.name or "SIGTERM"
                result.exit_code = EXIT_CODES.get(stop.signum, 143)
                break
            if paused:
                break
    ended = result.stopped_by is None and result.step == cfg.steps
    if evaluated_at != result.step and ended:  # e.g. resumed at the very end
        run_eval(result.step)
    if info.is_main:
        if log is not None and log.records:
            plot_loss(log.records, run_dir / PLOT_FILE, title=str(run_dir.name))
        result.best_checkpoint = best_checkpoint(run_dir)
        if board is not None:
            board.close()
    model.eval()
    return result


def _autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
