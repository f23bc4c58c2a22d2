"""The training loop: ``train(run_config, run_dir=...)`` for every task kind and model family.

A run is a sequence of named steps, each a method of :class:`_Run` (or a function it calls):

    _Run.start       run directory, resume point, data, model, optimizers, wrappers, logs
    train_step       one optimizer step on every process (attnlab.train.step)
    _Run.evaluate    validation metrics (rank 0)
    _Run.log         one metrics.jsonl line per ``log_every`` steps (exact across resumes)
    _Run.save        a checkpoint (rank 0), its failure stops every rank
    GracefulStop     SIGINT / SIGTERM finish the step, save and stop (attnlab.train.signals)

Data order, dropout noise and the learning rate depend only on (seed, step, rank), and the
optimizer and random-number states are saved with every checkpoint, so a run resumed from a
checkpoint at step s repeats steps s, s+1, ... bit for bit. The sums of the open logging window are
saved too, so the first line after a resume covers the same steps as in an uninterrupted run.

Rank 0 alone evaluates (``eval_batches`` batches of the global batch size), writes metrics,
plots and checkpoints; the others wait at a barrier. Each named step is timed as a phase of
:mod:`attnlab.train.timing` (``TrainResult.phases``): where the time outside the training steps
goes.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.checkpoint import best_checkpoint, restore_training, save_checkpoint
from attnlab.checkpoint.atomic import atomic_write_text
from attnlab.checkpoint.state import restore_rng_state
from attnlab.errors import FieldWarning, UserError
from attnlab.models import build_model
from attnlab.models.build import check_model_memory
from attnlab.train.distributed import (
    DistInfo,
    autocast_dtype,
    barrier,
    broadcast_flag,
    cleanup,
    init_distributed,
)
from attnlab.train.evaluate import Prediction, evaluate, evaluation_batches
from attnlab.train.finetune import copy_weights, freeze
from attnlab.train.lock import run_lock
from attnlab.train.optim import build_optimizers
from attnlab.train.report import METRICS_FILE, PLOT_FILE, LossPlotter, MetricsLog, open_boards
from attnlab.train.report import progress_bar as make_progress_bar
from attnlab.train.run_config import RunConfig, dump_toml
from attnlab.train.setup import RunSetup, prepare_run
from attnlab.train.signals import GracefulStop
from attnlab.train.step import StepParts, StepStats, step_seed, train_step
from attnlab.train.timing import TRAINING, PhaseTimes

__all__ = ["TrainResult", "TrainingDiverged", "step_seed", "train"]

CONFIG_FILE = "config.toml"
EVAL_KEPT_BYTES = 256 << 20  # validation batches up to this size stay on the device between evals
EventHandler = Callable[[str, dict[str, Any]], None]


class TrainingDiverged(UserError):
    """The loss became NaN or infinite: ``loss`` (the value) at optimizer step ``step``."""

    def __init__(self, step: int, loss: float):
        self.step, self.loss = step, loss
        super().__init__(
            f"the training loss became {loss} at step {step}; lower the learning rate (lr), "
            "keep gradient clipping on (grad_clip=1.0) or use fp32 (dtype='fp32'). "
            "Checkpoints saved before this step are intact",
            fields=("lr", "grad_clip", "dtype"),
        )


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
    runtime: str = ""  # one line: device, dtype, matmul precision, compilation
    extra: dict[str, Any] = field(default_factory=dict)
    phases: PhaseTimes = field(default_factory=PhaseTimes)  # seconds per phase of this call

    @property
    def steps_s(self) -> float:
        """Wall time inside this call's optimizer steps, its first step excluded."""
        return self.phases.seconds.get(TRAINING, 0.0)

    @property
    def first_step_s(self) -> float:
        """This call's first step (with torch.compile: the compilation)."""
        return self.phases.seconds.get("first step", 0.0)


def train(
    run_config: RunConfig,
    *,
    run_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    stop_at: int | None = None,
    allow_changes: bool = False,
    overwrite: bool = False,
    on_event: EventHandler | None = None,
) -> TrainResult:
    """Train the model of ``run_config.model`` on ``run_config.train``'s task; see module doc.

    ``run_dir`` defaults to ``train.out``. With ``resume`` the run continues from the latest
    checkpoint there (bit-identically); without it a run directory that holds checkpoints is an
    error, so saved work is never overwritten. A resume whose settings differ from the saved ones
    in a way that changes the steps (learning rate, seed, data, ...) is refused unless
    ``allow_changes``. A fresh run into a directory that holds anything but an attnlab run of the
    same config is an error unless ``overwrite``. ``stop_at`` ends this call after that global
    step with a checkpoint (the schedule still runs to ``train.steps``), e.g. to split a long
    run into pieces that fit a job time limit and continue each with ``resume``. Training holds
    an exclusive lock on ``run_dir`` (:mod:`attnlab.train.lock`): one run per directory.

    ``on_event(name, data)`` (rank 0) hears of the run as it happens: ``"resumed"`` (``path``,
    ``step``) and ``"record"`` (every metrics.jsonl line, evaluations included).
    """
    if not isinstance(run_config, RunConfig):
        raise TypeError(f"train() needs a RunConfig, got {type(run_config).__name__}")
    if stop_at is not None and (
        not isinstance(stop_at, int) or isinstance(stop_at, bool) or stop_at < 1
    ):
        raise ValueError(
            f"stop_at={stop_at!r} must be a global step >= 1 (or None to run to train.steps)"
        )
    cfg = run_config.train
    clock = PhaseTimes()
    with clock.phase("setup"):
        info, device = init_distributed(cfg.device)
    run_dir = Path(run_dir or cfg.out)
    try:
        with (
            cpu_settings(cfg.threads),
            cuda_matmul_precision(cfg.matmul_precision, device),
            _removed_on_failure(run_dir, info) as started,
            run_lock(run_dir, enabled=info.is_main),  # one training per run directory
        ):
            with clock.phase("setup"):
                setup = prepare_run(
                    run_config, run_dir, resume, info, allow_changes, overwrite, clock=clock
                )
                run = _Run.start(run_config, setup, info, device, on_event or _ignore, clock)
            started()
            return run.go(progress, stop_at)
    finally:
        cleanup(info)


@contextlib.contextmanager
def _removed_on_failure(run_dir: Path, info: DistInfo):
    """Remove ``run_dir`` again if this call created it and failed before the first step (a
    data file that does not load leaves nothing behind); the yielded function marks the start."""
    created = [info.is_main and not run_dir.exists()]
    try:
        yield created.clear
    except BaseException:
        if created and created[0]:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _ignore(name: str, data: dict[str, Any]) -> None:
    return None


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


@contextlib.contextmanager
def cuda_matmul_precision(precision: str, device: torch.device):
    """On CUDA, fp32 matmuls at ``precision`` ("high": TF32, "highest": full fp32) while
    training, restored afterwards. Other devices are left exactly as they are."""
    if device.type != "cuda":
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def runtime_line(cfg: Any, device: torch.device, amp: torch.dtype | None) -> str:
    """What runs the steps, in one line: device, dtype, fp32 matmul precision, compilation."""
    where = str(device)
    if device.type == "cuda":
        where += f" ({torch.cuda.get_device_name(device)})"
    parts = [where, "bf16 autocast" if amp is not None else "fp32"]
    if device.type == "cuda":
        kind = "TF32" if torch.get_float32_matmul_precision() != "highest" else "full fp32"
        parts.append(f"fp32 matmuls in {kind} (matmul_precision={cfg.matmul_precision!r})")
    parts.append("torch.compile" if cfg.compile else "eager")
    return ", ".join(parts)


@dataclass
class LogWindow:
    """The steps since the previous metrics.jsonl line.

    ``loss`` and ``steps`` are saved with each checkpoint, so a resumed run's first line averages
    the same steps as an uninterrupted run. ``tokens`` and ``since`` measure throughput in this
    process only. ``partial`` marks a window that lost the steps before a resume (a checkpoint
    written before windows were saved).
    """

    loss: float = 0.0
    steps: int = 0
    tokens: float = 0.0
    since: float = field(default_factory=time.perf_counter)
    partial: bool = False

    def add(self, stats: StepStats) -> None:
        self.loss, self.steps = self.loss + stats.loss, self.steps + 1
        self.tokens += stats.tokens

    def close(self) -> dict[str, Any]:
        """The window's share of a metrics line; the next window starts now."""
        now = time.perf_counter()
        line: dict[str, Any] = {
            "train_loss": self.loss / self.steps,
            "tokens_per_s": self.tokens / max(now - self.since, 1e-9),
        }
        if self.partial:
            line["partial_window_steps"] = self.steps
        self.loss, self.steps, self.tokens, self.since, self.partial = 0.0, 0, 0.0, now, False
        return line

    def state(self) -> dict[str, Any]:
        return {"loss": self.loss, "steps": self.steps}

    @classmethod
    def resumed(cls, saved: Any, step: int, log_every: int) -> LogWindow:
        """The window at a resumed ``step``: the saved sums, or a partial one if none were."""
        if isinstance(saved, dict) and isinstance(saved.get("steps"), int):
            return cls(loss=float(saved.get("loss", 0.0)), steps=saved["steps"])
        return cls(partial=step % log_every != 0)


@dataclass
class _Run:
    """One call of :func:`train`: its fixed parts and what changes from step to step."""

    run_config: RunConfig
    setup: RunSetup
    parts: StepParts
    result: TrainResult
    window: LogWindow
    on_event: EventHandler
    log: MetricsLog | None = None
    board: Any = None  # report.Boards: TensorBoard, Weights & Biases
    plotter: LossPlotter | None = None
    elapsed0: float = 0.0  # training time of the run before this call (from the checkpoint)
    evaluated_at: int = -1
    eval_batches: list[Any] | None = None  # the validation batches on the device, built once
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(
        cls,
        run_config: RunConfig,
        setup: RunSetup,
        info: DistInfo,
        device: torch.device,
        on_event: EventHandler,
        clock: PhaseTimes,
    ) -> _Run:
        """Build the model (or take the checkpoint's), its optimizers, wrappers and logs."""
        cfg, data, ckpt = run_config.train, setup.data, setup.checkpoint
        amp = autocast_dtype(cfg.dtype, device)
        with clock.phase("model"):
            torch.manual_seed(cfg.seed)  # identical initial weights on every rank
            model = ckpt.model if ckpt is not None else build_model(setup.model_config)
            if setup.initial_weights is not None:  # fine-tuning: the pretrained weights
                copy_weights(model, setup.initial_weights)
            freeze(model, cfg.freeze)
        with clock.phase("device"):  # on CUDA: the context's start-up
            if device.type == "cuda":  # the CPU's memory was checked by prepare_run
                purpose = f" with its gradients and AdamW moments on {device}"
                check_model_memory(setup.model_config, copies=4, purpose=purpose, device=device)
            model.to(device).train()
        with clock.phase("optimizers"):  # torch.optim's first use imports torch._dynamo
            optimizers = build_optimizers(model, cfg)
            start, elapsed0, window = 0, 0.0, LogWindow()
            if ckpt is not None:
                extra = restore_training(ckpt, optimizers)
                start, elapsed0 = extra["step"], float(extra.get("elapsed_s", 0.0))
                window = LogWindow.resumed(extra.get("log_window"), start, cfg.log_every)
                restore_rng_state(extra["rng"])  # last: nothing may draw random numbers after it
        if start > cfg.steps:
            raise UserError(
                f"the checkpoint is at step {start}, past steps={cfg.steps}; "
                f"raise steps to train longer",
                fields=("steps",),
            )
        with clock.phase("model"):
            net = _wrap(model, cfg.compile, data.kind, info, device)
        parts = StepParts(net, model, optimizers, data, cfg, info, device, amp)
        result = TrainResult(
            setup.run_dir,
            start,
            start,
            [],
            {},
            [],
            None,
            None,
            elapsed0,
            model,
            data.tokenizer,
            data.labels,
            ckpt.path if ckpt else None,
            summary=data.summary,
            runtime=runtime_line(cfg, device, amp),
            phases=clock,
        )
        result.checkpoint = result.resumed_from
        run = cls(run_config, setup, parts, result, window, on_event, elapsed0=elapsed0)
        if info.is_main:
            run_dir = setup.run_dir
            with clock.phase("logs"):
                config_text = dump_toml(RunConfig(setup.model_config, cfg))
                atomic_write_text(run_dir / CONFIG_FILE, config_text)
                run.log = MetricsLog(run_dir / METRICS_FILE, keep_until=start if ckpt else None)
                run.board = open_boards(run_dir, run_config, resumed=ckpt is not None)
                run.plotter = LossPlotter(
                    run_dir / PLOT_FILE, str(run_dir.name), separate_process=device.type == "cuda"
                )
            on_event("runtime", {"line": result.runtime})
            if ckpt is not None:
                on_event("resumed", {"path": ckpt.path, "step": start})
        return run

    # The loop ----------------------------------------------------------------------------
    def go(self, progress: bool, stop_at: int | None) -> TrainResult:
        """Run steps up to ``train.steps`` (or ``stop_at``), then finish."""
        cfg, info, result = self.parts.cfg, self.parts.info, self.result
        enabled = progress and cfg.progress and info.is_main
        bar = make_progress_bar(cfg.steps, result.start_step, enabled, cfg.log_every)
        try:
            self.steps(bar, stop_at)
        except BaseException:
            if self.plotter is not None:
                self.plotter.discard()
            raise
        return self.finish()

    def steps(self, bar: Any, stop_at: int | None) -> None:
        """The steps of this call, each followed by what is due: evaluation, log, checkpoint."""
        cfg, result, phases = self.parts.cfg, self.result, self.result.phases
        end = cfg.steps if stop_at is None else min(cfg.steps, max(stop_at, result.start_step))
        with GracefulStop() as stop, bar:
            for step in range(result.start_step, end):
                began = time.perf_counter()
                stats = train_step(self.parts, step, stop.requested)  # ends reading the loss
                self.time_step(step, time.perf_counter() - began)
                done = self.account(step + 1, stats)
                final = done == cfg.steps
                metrics = self.evaluate(done) if self.wants_eval(done) else {}
                if metrics or done % cfg.log_every == 0:
                    with phases.phase("metrics log"):
                        record = self.write_log(done, stats, metrics)
                    loss, rate = record["train_loss"], record["tokens_per_s"]
                    bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{rate:.0f}", refresh=False)
                bar.update(1)  # after the postfix: the bar shows this step's logged loss
                if metrics and self.plotter is not None and self.log is not None:
                    self.plotter.request(self.log.records)  # drawn while the steps go on
                stopping, paused = stats.stop_votes > 0, done == end and not final
                if final or stopping or paused or (cfg.save_every and done % cfg.save_every == 0):
                    with phases.phase("checkpoints"):
                        self.save(done, metrics)
                if stopping:
                    result.stopped_by = stop.name or "SIGTERM"
                    result.exit_code = stop.exit_code
                    break
                if paused:
                    break

    def time_step(self, step: int, seconds: float) -> None:
        """Add one step's wall time: the first of this call apart (it compiles, warms up)."""
        first = step == self.result.start_step
        self.result.phases.add("first step" if first else TRAINING, seconds)

    def account(self, done: int, stats: StepStats) -> int:
        """Record a finished step; stop on a non-finite loss."""
        result = self.result
        result.step = done
        result.elapsed_s = self.elapsed0 + time.perf_counter() - self.started
        if not math.isfinite(stats.loss):
            raise TrainingDiverged(done, stats.loss)
        result.losses.append((done, stats.loss))
        self.window.add(stats)
        return done

    def wants_eval(self, done: int) -> bool:
        cfg = self.parts.cfg
        return done == cfg.steps or bool(cfg.eval_every and done % cfg.eval_every == 0)

    # Named steps -------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        """Validation metrics on rank 0 (``eval_batches`` batches of the global batch)."""
        p = self.parts
        metrics: dict[str, float] = {}
        with self.result.phases.phase("evaluation"):
            if p.info.is_main:
                size = p.cfg.batch_size * p.info.world_size  # the same set whatever the ranks
                batches = self.eval_batches or evaluation_batches(
                    p.data, batch_size=size, max_batches=p.cfg.eval_batches, device=p.device
                )
                if sum(t.nbytes for b in batches for t in b) <= EVAL_KEPT_BYTES:
                    self.eval_batches = batches  # kept on the device for the next evaluations
                res = evaluate(
                    p.model,
                    p.data,
                    batch_size=size,
                    max_batches=p.cfg.eval_batches,
                    device=p.device,
                    autocast_dtype=p.amp,
                    batches=batches,
                )
                metrics = res.metrics
                self.result.metrics, self.result.predictions = res.metrics, res.predictions
            self.evaluated_at = step
            barrier(p.info)
        return metrics

    def write_log(self, step: int, stats: StepStats, metrics: dict[str, float]) -> dict[str, Any]:
        """Close the logging window into one metrics line (rank 0 writes it)."""
        record = {
            "step": step,
            **self.window.close(),
            "lr": stats.lr,
            "elapsed_s": self.result.elapsed_s,
            "grad_norm": stats.grad_norm,
            **metrics,
        }
        if self.log is not None:
            self.log.append(record)
            if self.board is not None:
                self.board.log(record)
            self.on_event("record", record)
        return record

    def save(self, step: int, metrics: dict[str, float]) -> None:
        """A checkpoint written by rank 0; if that fails, every rank raises."""
        p, result, error = self.parts, self.result, None
        if p.info.is_main:
            extra = {
                "elapsed_s": result.elapsed_s,
                "world_size": p.info.world_size,
                "log_window": self.window.state(),
            }
            try:
                result.checkpoint = save_checkpoint(
                    self.setup.run_dir,
                    model=p.model,
                    config=self.setup.model_config,
                    tokenizer=p.data.tokenizer,
                    labels=p.data.labels,
                    step=step,
                    optimizer=p.optimizers,
                    extra_state=extra,
                    train_config=p.cfg.to_dict(),
                    keep_last=p.cfg.keep_last,
                    metric=metrics.get(p.cfg.best_metric),
                    higher_is_better=p.cfg.higher_is_better,
                )
            except (UserError, OSError) as err:
                error = err
        if broadcast_flag(error is not None, p.info, p.device):
            raise error or UserError("rank 0 failed to save a checkpoint; see its error above")

    def finish(self) -> TrainResult:
        """The last evaluation (if the loop had none at the end), plot, best checkpoint."""
        p, result = self.parts, self.result
        ended = result.stopped_by is None and result.step == p.cfg.steps
        if self.evaluated_at != result.step and ended:  # e.g. resumed at the very end
            self.evaluate(result.step)
        with result.phases.phase("finish"):
            if p.info.is_main:
                if self.plotter is not None:
                    if self.log is not None and self.log.records:
                        self.plotter.request(self.log.records)
                    with result.phases.phase("loss plot"):
                        self.plotter.close()
                result.best_checkpoint = best_checkpoint(self.setup.run_dir)
                if self.board is not None:
                    self.board.close()
            p.model.eval()
        return result


def _wrap(
    model: nn.Module, compile: bool, kind: str, info: DistInfo, device: torch.device
) -> nn.Module:
    """The module the steps call: DistributedDataParallel across processes, torch.compile."""
    net: nn.Module = model
    if info.enabled:
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if compile:
        if kind != "lm":
            warnings.warn(
                FieldWarning(
                    f"compile=True on padded {kind} batches: their shapes change from batch to "
                    "batch and torch.compile recompiles for them; it pays off for LM windows, "
                    "whose shape is fixed (measured in benchmarks/)",
                    fields=("compile",),
                ),
                stacklevel=3,
            )
        compile_fn = getattr(torch, "compile", None)
        if compile_fn is None:  # a PyTorch without torch.compile: train eagerly, say so once
            warnings.warn(
                FieldWarning(
                    f"compile=True needs torch.compile, which PyTorch {torch.__version__} lacks; "
                    "training runs eagerly (same results, without the compiled speed-up)",
                    fields=("compile",),
                ),
                stacklevel=3,
            )
        else:
            net = compile_fn(net)
    return net
