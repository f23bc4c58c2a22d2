"""Training objectives of the three task kinds, as *sums* over targets plus their count.

Returning (sum, count) instead of a mean lets the loop weight every target token equally across
gradient-accumulation steps and across processes, whatever the padding of each micro-batch:
the step's loss is sum over all micro-batches and ranks / total count.

* LM (000 "Transformer Decoder"): L = -sum_t log p(w_{t+1} | w_{<=t}) over every window position.
* seq2seq (004 eq. 1, teacher forcing): L = -sum_l log p(y_l | y_{<l}, x) over real target tokens
  (the shifted-right decoder input is ``tgt_in``; padding positions are ignored). With label
  smoothing eps (Szegedy et al. 2016; Vaswani 5.4) the one-hot target becomes
  (1 - eps) * onehot + eps / V.
* classification (003 "Encoder-only Models"): L = -sum_i log p(c_i | x_i).

Label smoothing applies to seq2seq and classification training only; evaluation always reports
the plain negative log-likelihood, so validation perplexity keeps its meaning.

Shapes: B batch, T target length, S source length, V vocabulary, C classes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LossSum(NamedTuple):
    """A summed loss, the number of targets it sums over, and the input tokens processed."""

    total: Tensor  # scalar, sum over targets (differentiable)
    n_targets: int  # targets in the sum
    n_tokens: int  # tokens read (source + target), for throughput


def batch_loss(model: nn.Module, batch: Any, task: str, label_smoothing: float = 0.0) -> LossSum:
    """The summed cross-entropy of one batch for ``task`` in ``{"lm", "seq2seq", "classify"}``.

    ``batch`` is an ``LMBatch`` (x, y), ``Seq2SeqBatch`` or ``ClassificationBatch`` from
    ``attnlab.data``; ``model`` may be wrapped (DDP, torch.compile): only its forward is called.
    """
    if task == "lm":
        logits = model(batch.x).logits  # (B, T, V)
        total = F.cross_entropy(logits.flatten(0, 1).float(), batch.y.flatten(), reduction="sum")
        return LossSum(total, batch.y.numel(), batch.x.numel())
    if task == "seq2seq":
        # The head, softmax and loss run on the N real target positions only, not on padding.
        logits = model(
            batch.src,
            batch.tgt_in,
            src_mask=batch.src_mask,
            tgt_mask=batch.tgt_mask,
            real_only=True,
        ).logits  # (N, V)
        targets = batch.tgt_out[batch.tgt_mask]  # (N,), the same row-major order
        total = F.cross_entropy(
            logits.float(), targets, reduction="sum", label_smoothing=label_smoothing
        )
        count = targets.numel()
        return LossSum(total, count, count + int(batch.src_mask.sum()))
    if task == "classify":
        logits = model(batch.ids, key_padding_mask=batch.mask).logits  # (B, C)
        total = F.cross_entropy(
            logits.float(), batch.labels, reduction="sum", label_smoothing=label_smoothing
        )
        return LossSum(total, batch.labels.numel(), int(batch.mask.sum()))
    raise ValueError(f"unknown task {task!r}; choose 'lm', 'seq2seq' or 'classify'")


def target_count(batch: Any, task: str) -> int:
    """How many targets :func:`batch_loss` will sum over, known before the forward pass."""
    if task == "lm":
        return batch.y.numel()
    if task == "seq2seq":
        return int(batch.tgt_mask.sum())
    if task == "classify":
        return batch.labels.numel()
    raise ValueError(f"unknown task {task!r}; choose 'lm', 'seq2seq' or 'classify'")


def move_batch(batch: Any, device: Any) -> Any:
    """The same batch (a NamedTuple of tensors) on ``device``.

    To CUDA through page-locked memory: a copy from ordinary (pageable) memory makes the host wait
    for every kernel queued before it, a pinned one is queued like a kernel.
    """
    if torch.device(device).type == "cuda":
        return type(batch)(*(t.pin_memory().to(device, non_blocking=True) for t in batch))
    return type(batch)(*(t.to(device, non_blocking=True) for t in batch))


def correct_predictions(logits: Tensor, batch: Any, task: str) -> Tensor:
    """Per-example correctness under teacher forcing: (B,) bool.

    seq2seq: every real target position predicted right. By induction this equals greedy
    exact match (greedy decoding reproduces y iff argmax p(. | y_{<l}, x) = y_l for all l), so it
    checks :func:`attnlab.train.evaluate.greedy_decode`. classify: argmax = label.
    """
    if task == "seq2seq":
        hit = (logits.argmax(-1) == batch.tgt_out) | ~batch.tgt_mask  # (B, T)
        return hit.all(dim=1)
    if task == "classify":
        return logits.argmax(-1) == batch.labels
    raise ValueError(f"correct_predictions applies to seq2seq and classify, not {task!r}")
