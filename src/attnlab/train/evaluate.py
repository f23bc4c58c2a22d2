"""Evaluation during and after training: loss, perplexity, exact match, BLEU/chrF, accuracy.

* loss: the mean negative log-likelihood per target (nats), ppl = exp(loss) (000, 003).
* exact match (generated seq2seq tasks and pair files): the share of sources whose *greedy*
  decoding equals the reference exactly, decoded by the one decode loop of ``attnlab.generate``
  (``train`` sits above it):

      y_l = argmax_v p(v | y_{<l}, x),  y_0 = <bos>,  stop at <eos> or after ``max_new_tokens``.

* BLEU and chrF (corpus level, ``sacrebleu``) for text pairs read from files.
* accuracy for classification.

Shapes: B batch, S source length, T target length, V vocabulary, C classes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from attnlab.generate import GenerationConfig, generate_seq2seq_padded
from attnlab.models.base import Seq2SeqModel
from attnlab.train.objectives import batch_loss, move_batch


class Prediction(NamedTuple):
    """One evaluated example as text."""

    source: str
    prediction: str
    target: str
    correct: bool


class EvalResult(NamedTuple):
    metrics: dict[str, float]  # e.g. {"val_loss": .., "val_ppl": .., "val_exact_match": ..}
    predictions: list[Prediction]  # every evaluated example (seq2seq / classify), else empty


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqModel,
    src: Tensor,
    src_mask: Tensor | None,
    *,
    bos_id: int,
    eos_id: int,
    max_new_tokens: int,
) -> list[list[int]]:
    """Greedy outputs of a batch of sources (src (B, S), src_mask (B, S) True = real token),
    decoded by the one decode loop, :func:`attnlab.generate.generate_seq2seq_padded`.

    Returns one id list per row, without <bos> and cut before the first <eos>.
    """
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be positive")
    if src_mask is None:
        src_mask = torch.ones_like(src, dtype=torch.bool)  # (B, S): every token real
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        bos_token_id=bos_id,
        stop_token_ids=(eos_id,),
    )
    return generate_seq2seq_padded(model, src, src_mask, config).tokens


def decode_limit(model: nn.Module, data: Any) -> int:
    """How many tokens greedy decoding may produce: 1.5x the longest training target + 2
    (a longer output cannot match), capped by the model's max_len when it has one."""
    limit = int(1.5 * getattr(data, "longest_target", 64)) + 2
    max_len = getattr(model, "max_len", None)
    return min(limit, max_len) if max_len else limit


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Switch dropout off for the block and restore the previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


# On a GPU a validation batch of nanoGPT's size (64 x 256 tokens) is too small to keep it busy:
# language-model windows are evaluated in chunks of up to this many tokens (the same windows,
# so the same mean loss up to the order of float32 sums).
GPU_EVAL_TOKENS = 1 << 17


def merged_lm_batches(batches: list[Any], max_tokens: int) -> list[Any]:
    """Consecutive LM batches (x, y of (B, T)) concatenated into ones of at most ``max_tokens``
    tokens (a batch larger than that stays as it is)."""
    out: list[Any] = []
    group: list[Any] = []
    for batch in batches:
        if group and sum(b.x.numel() for b in group) + batch.x.numel() > max_tokens:
            out.append(_concat(group))
            group = []
        group.append(batch)
    if group:
        out.append(_concat(group))
    return out


def _concat(group: list[Any]) -> Any:
    if len(group) == 1:
        return group[0]
    return type(group[0])(*(torch.cat(parts) for parts in zip(*group)))


def evaluation_batches(
    data: Any, *, batch_size: int, max_batches: int, device: torch.device | str = "cpu"
) -> list[Any]:
    """The validation batches :func:`evaluate` runs, on ``device``: at most ``max_batches`` of
    ``batch_size`` (LM windows on CUDA merged into chunks of up to ``GPU_EVAL_TOKENS`` tokens).
    A training run builds them once and passes them to every evaluation."""
    device = torch.device(device)
    batches = data.val_batches(batch_size, max_batches)
    if data.kind == "lm" and device.type == "cuda":
        batches = merged_lm_batches(batches, GPU_EVAL_TOKENS)
    return [move_batch(batch, device) for batch in batches]


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Any,
    *,
    batch_size: int,
    max_batches: int,
    device: torch.device | str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    prefix: str = "val",
    decode: bool = True,
    batches: list[Any] | None = None,
) -> EvalResult:
    """Metrics of ``model`` on the validation set of ``data`` (a :class:`TaskData`).

    At most ``max_batches`` batches of ``batch_size`` are used (the same ones every time), or
    ``batches`` when given (:func:`evaluation_batches` of the same arguments, built once).
    ``decode=False`` skips greedy decoding (loss and perplexity only).
    """
    device = torch.device(device)
    if batches is None:
        batches = evaluation_batches(
            data, batch_size=batch_size, max_batches=max_batches, device=device
        )
    totals: list[Tensor] = []  # read back once at the end: no wait for the GPU per batch
    count = 0
    predictions: list[Prediction] = []
    with eval_mode(model):
        for i, batch in enumerate(batches):
            with _autocast(device, autocast_dtype):
                loss = batch_loss(model, batch, data.kind)
            totals.append(loss.total.detach())
            count += loss.n_targets
            if data.kind == "seq2seq" and decode:
                predictions += _decode_batch(model, data, batch, i * batch_size)
            elif data.kind == "classify":
                predictions += _classify_batch(model, data, batch, i * batch_size)
    total = sum(torch.stack(totals).tolist()) if totals else 0.0  # summed in float64, in order
    mean = total / max(count, 1)
    metrics = {f"{prefix}_loss": mean}
    if data.kind != "classify":  # perplexity is a per-token notion
        metrics[f"{prefix}_ppl"] = math.exp(min(mean, 700.0))
    if predictions:
        name = "exact_match" if data.kind == "seq2seq" else "accuracy"
        metrics[f"{prefix}_{name}"] = sum(p.correct for p in predictions) / len(predictions)
    if data.kind == "seq2seq" and predictions and not getattr(data, "generated", True):
        metrics.update(text_scores(predictions, prefix))
    return EvalResult(metrics, predictions)


def _decode_batch(model: nn.Module, data: Any, batch: Any, offset: int) -> list[Prediction]:
    assert isinstance(model, Seq2SeqModel)  # seq2seq data: the run checked the model's kind
    tok = data.tokenizer
    outputs = greedy_decode(
        model,
        batch.src,
        batch.src_mask,
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
        max_new_tokens=decode_limit(model, data),
    )
    out = []
    for k, ids in enumerate(outputs):
        example = data.val_examples[offset + k]
        reference = data.val_ids[offset + k][1]
        out.append(Prediction(example.source, tok.decode(ids), example.target, ids == reference))
    return out


def _classify_batch(model: nn.Module, data: Any, batch: Any, offset: int) -> list[Prediction]:
    guesses = model(batch.ids, key_padding_mask=batch.mask).logits.argmax(-1).tolist()  # (B,)
    out = []
    for k, guess in enumerate(guesses):
        example = data.val_examples[offset + k]
        name = data.labels.decode(guess)
        out.append(Prediction(example.source, name, example.target, name == example.target))
    return out


def text_scores(predictions: list[Prediction], prefix: str = "val") -> dict[str, float]:
    """Corpus BLEU and chrF (sacrebleu defaults: 13a tokenisation, chrF with n=6, beta=2)."""
    import sacrebleu  # slow import: only for BLEU/chrF

    hyps = [p.prediction for p in predictions]
    refs = [[p.target for p in predictions]]
    return {
        f"{prefix}_bleu": float(sacrebleu.corpus_bleu(hyps, refs).score),
        f"{prefix}_chrf": float(sacrebleu.corpus_chrf(hyps, refs).score),
    }
