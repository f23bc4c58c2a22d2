"""A minimal, explicit training helper for the experiments' small in-memory tasks.

Each step samples a minibatch of rows from tensors held in memory, computes ``loss_fn(model,
batch)``, clips the gradient and takes one AdamW step (Loshchilov & Hutter 2019) under the
project's warm-up + cosine schedule (:mod:`attnlab.train.optim`):

    lr_s = lr * (s + 1) / warmup                                        s < warmup
    lr_s = min_lr + (lr - min_lr) * (1 + cos(pi (s - warmup) / (S - warmup))) / 2   otherwise

It works with every model interface of :mod:`attnlab.models.base` because the caller supplies the
loss; ready-made losses for classifiers, language models and seq2seq models are below. CPU,
seeded (the batch order comes from its own generator), no checkpoints, no logging: the full
training loop with resume lives in :mod:`attnlab.train`.

Shapes: N examples, B batch, T length, V vocabulary, C classes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.lab.kit.tasks import TaskData
from attnlab.train.optim import clip_gradients, lr_multiplier, parameter_groups

Batch = tuple[Tensor, ...]
LossFn = Callable[[nn.Module, Batch], Tensor]


@dataclass(frozen=True)
class FitConfig:
    """Optimisation settings of one experiment run (names as in ``TrainConfig``)."""

    steps: int = 300
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 20
    min_lr: float = 0.0
    lr_schedule: str = "cosine"  # "cosine", "linear" or "constant" after warm-up
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0  # 0 = measure the norm, do not clip

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"FitConfig.{name}={getattr(self, name)!r} must be an int >= 1")
        if not self.lr > 0:
            raise ValueError(f"FitConfig.lr={self.lr} must be > 0")
        if self.warmup_steps < 0 or self.min_lr < 0 or self.grad_clip < 0:
            raise ValueError("FitConfig warmup_steps, min_lr and grad_clip must be >= 0")

    @classmethod
    def sized(cls, quick: bool, steps: int, warmup_steps: int, **fields: Any) -> FitConfig:
        """A full run's budget (``steps`` of batch 64 after ``warmup_steps``), or its CI-sized
        ``--quick`` form: 40 steps of batch 32 after 10."""
        if quick:
            return cls(steps=40, batch_size=32, warmup_steps=10, **fields)
        return cls(steps=steps, batch_size=64, warmup_steps=warmup_steps, **fields)


class FitResult(NamedTuple):
    """Per-step training history of one run."""

    losses: list[float]  # training loss of each step (stops at the first non-finite one)
    grad_norms: list[float]  # global gradient norm before clipping
    lrs: list[float]
    seconds: float  # wall time of the optimisation steps
    diverged: bool  # a loss or gradient became NaN/inf and training stopped
    evals: list[tuple[int, float]] = []  # (step, evaluate(model)) at the requested steps

    def final_loss(self, window: int = 20) -> float:
        """Mean of the last ``window`` losses (inf when the run diverged)."""
        if self.diverged or not self.losses:
            return math.inf
        tail = self.losses[-window:]
        return sum(tail) / len(tail)

    def loss_at(self, frac: float, window: int = 11) -> float:
        """Mean of up to ``window`` losses ending at fraction ``frac`` of the run (nan if empty)."""
        if not self.losses:
            return math.nan
        i = min(len(self.losses) - 1, int(frac * len(self.losses)))
        part = self.losses[max(0, i - window + 1) : i + 1]
        return sum(part) / len(part)


def fit(
    model: nn.Module,
    data: Sequence[Tensor],
    loss_fn: LossFn,
    cfg: FitConfig,
    *,
    seed: int = 0,
    evaluate: Callable[[nn.Module], float] | None = None,
    eval_at: Sequence[int] = (),
    eval_every: int = 0,
) -> FitResult:
    """Train ``model`` in place on rows of ``data`` (tensors sharing their first dim N).

    ``evaluate(model)`` (e.g. test accuracy) is called after each step count in ``eval_at`` and
    every ``eval_every`` steps (0: never); the values land in ``FitResult.evals`` as (step,
    value). Returns the loss history; the model is left in eval mode.
    """
    n = _rows(data)
    optimizer = torch.optim.AdamW(
        parameter_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas
    )
    gen = torch.Generator().manual_seed(seed)
    losses, norms, lrs = [], [], []
    evals: list[tuple[int, float]] = []
    diverged = False
    model.train()
    start = time.perf_counter()
    for step in range(cfg.steps):
        lr = cfg.lr * lr_multiplier(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        index = torch.randint(0, n, (min(cfg.batch_size, n),), generator=gen)  # (B,)
        loss = loss_fn(model, tuple(t[index] for t in data))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = clip_gradients(model.parameters(), cfg.grad_clip)
        value = float(loss.detach())
        if not (math.isfinite(value) and math.isfinite(norm)):
            diverged = True
            break
        optimizer.step()
        losses.append(value)
        norms.append(norm)
        lrs.append(lr)
        due = step + 1 in eval_at or (eval_every > 0 and (step + 1) % eval_every == 0)
        if evaluate is not None and due:
            evals.append((step + 1, evaluate(model)))  # its time counts in ``seconds``
            model.train()
    seconds = time.perf_counter() - start
    model.eval()
    return FitResult(losses, norms, lrs, seconds, diverged, evals)


def _rows(data: Sequence[Tensor]) -> int:
    if not data or not all(isinstance(t, Tensor) for t in data):
        raise TypeError("data must be a non-empty tuple of tensors (e.g. (ids, labels))")
    n = data[0].size(0)
    if n == 0 or any(t.size(0) != n for t in data):
        raise ValueError(
            f"data tensors must share a non-zero first dim, got {[tuple(t.shape) for t in data]}"
        )
    return n


# Losses for the three model interfaces ------------------------------------------------------


def classification_loss(model: nn.Module, batch: Batch) -> Tensor:
    """batch = (ids (B, T), labels (B,)): cross-entropy of a Classifier's logits (B, C)."""
    ids, labels = batch
    return F.cross_entropy(model(ids).logits, labels)


def lm_loss(model: nn.Module, batch: Batch) -> Tensor:
    """batch = (ids (B, T),): next-token cross-entropy of a LanguageModel, -log p(w_t | w_<t)."""
    (ids,) = batch
    logits = model(ids[:, :-1]).logits  # (B, T-1, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


@torch.no_grad()
def eval_loss(model: nn.Module, data: Sequence[Tensor], loss_fn: LossFn) -> float:
    """``loss_fn(model, data)`` on all rows at once, in eval mode, without gradients."""
    model.eval()
    return float(loss_fn(model, tuple(data)))


def block_grad_norms(model: nn.Module, ids: Tensor) -> list[float]:
    """||dL/dtheta_l|| over the parameters theta_l of each block l of a LanguageModel, for the
    LM loss on one batch ``ids`` (B, T + 1) in train mode; the gradients stay on the model."""
    model.train()
    model.zero_grad()
    lm_loss(model, (ids,)).backward()
    return [
        math.sqrt(sum(float((p.grad**2).sum()) for p in block.parameters() if p.grad is not None))
        for block in cast(nn.ModuleList, model.blocks)
    ]


@torch.no_grad()
def predict(model: nn.Module, ids: Tensor, batch_size: int = 512) -> Tensor:
    """argmax of the model's logits over its last axis, in eval mode: (N, ...) int64."""
    model.eval()
    out = [
        model(ids[i : i + batch_size]).logits.argmax(-1) for i in range(0, ids.size(0), batch_size)
    ]
    return torch.cat(out)


def accuracy(model: nn.Module, ids: Tensor, labels: Tensor) -> float:
    """Fraction of examples (or positions) where the argmax equals the label (-100 ignored)."""
    pred = predict(model, ids)
    keep = labels != -100
    return float((pred[keep] == labels[keep]).float().mean())


def fit_classifier(
    model: nn.Module, train: TaskData, test: TaskData, cfg: FitConfig, *, seed: int
) -> tuple[FitResult, float]:
    """Train a Classifier on ``train`` with :func:`classification_loss`; returns the training
    history and the accuracy on ``test``."""
    result = fit(model, (train.ids, train.labels), classification_loss, cfg, seed=seed)
    return result, accuracy(model, test.ids, test.labels)
