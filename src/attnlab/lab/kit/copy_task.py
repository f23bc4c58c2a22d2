"""The copy task with a separator, and its position-scheme models (used by ``extrapolation`` and
``concat_positions``).

A decoder-only LM reads ``<bos> x_1 .. x_n | x_1 .. x_n <eos>`` with distinct random symbols x_i;
the loss and the accuracy count only the copy half, which the first half fully determines.
Shapes: N examples, B batch, T sequence length (2 n + 3), V vocabulary, D width.
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models import build_model
from attnlab.models.layers import Embeddings
from attnlab.nn.positional import Positions

LARGE_BASE = 500_000.0  # Llama 3's rotary base, vs the default 10 000
ROTARY_LARGE = f"rotary, base {LARGE_BASE:g}"


PAD, BOS, EOS, SEP = 0, 1, 2, 3
FIRST_SYMBOL = 4  # symbols are ids 4 .. 4 + n_symbols - 1


def copy_examples(
    n: int, lengths: np.ndarray | list[int], n_symbols: int, rng: np.random.Generator
) -> tuple[Tensor, Tensor]:
    """``n`` copy sequences (ids (N, T), right-padded) and their targets (N, T - 1), -100
    everywhere except the copy half: target t is ids[t + 1] for t + 1 inside the copy."""
    lengths = np.asarray(lengths)
    longest = 2 * int(lengths.max()) + 3
    ids = np.full((n, longest), PAD, dtype=np.int64)
    targets = np.full((n, longest - 1), -100, dtype=np.int64)
    for row, k in enumerate(lengths[:n]):
        symbols = FIRST_SYMBOL + rng.permutation(n_symbols)[:k]  # distinct symbols
        seq = [BOS, *symbols, SEP, *symbols, EOS]
        ids[row, : len(seq)] = seq
        targets[row, k + 1 : 2 * k + 2] = seq[k + 2 : 2 * k + 3]  # x_1 .. x_n <eos> after SEP
    return torch.from_numpy(ids), torch.from_numpy(targets)


def copy_loss(model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
    """-log p(copy token | prefix), averaged over the copy half (000 LM loss, masked)."""
    ids, targets = batch
    logits = model(ids[:, :-1]).logits  # (B, T - 1, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


@torch.no_grad()
def copy_accuracy(model: nn.Module, ids: Tensor, targets: Tensor) -> tuple[float, float]:
    """(per-token accuracy on the copy half, exact match of whole copies), teacher-forced."""
    model.eval()
    pred = model(ids[:, :-1]).logits.argmax(-1)  # (N, T - 1)
    keep = targets != -100
    hit = (pred == targets) | ~keep
    return float((pred == targets)[keep].float().mean()), float(hit.all(dim=1).float().mean())


def model_config(kind: str, vocab_size: int, max_len: int, quick: bool) -> ModelConfig:
    d = 32 if quick else 64
    return ModelConfig(
        kind="decoder_lm",
        vocab_size=vocab_size,
        d_model=d,
        n_heads=4,
        n_layers=2,
        d_ff=4 * d,
        max_len=max_len,
        positional=kind,
    )


def position_table(model: nn.Module) -> Tensor | None:
    """The learned position table P (max_len, D) of a decoder LM, or None for other kinds."""
    table = getattr(_embeddings(model).pos_enc, "table", None)
    return table.weight if isinstance(table, nn.Embedding) else None


class ScaledPositions(Positions):
    """x~_i = x_i + c PE(i): the sinusoids of ``inner`` scaled by a fixed c (not trained); the
    signal c PE(i) is what the embedding's hook point P shows."""

    def __init__(self, inner: Positions, scale: float):
        super().__init__()
        self.inner, self.scale = inner, scale

    def signal(self, positions: Tensor, x: Tensor) -> Tensor:
        signal = self.inner.signal(positions, x)  # (T|B,T, D)
        if signal is None:
            raise ValueError("ScaledPositions needs an additive position signal (sinusoids)")
        return self.scale * signal


def _embeddings(model: nn.Module) -> Embeddings:
    """The embedding layer of a decoder LM (token table, scale and position scheme)."""
    return cast(Embeddings, model.embed)


def rms(t: Tensor) -> float:
    return float(t.detach().pow(2).mean().sqrt())


def signal_scales(model: nn.Module, max_len: int) -> dict[str, float]:
    """RMS per coordinate of the token embeddings and of the position signal added to them."""
    emb = _embeddings(model)
    x = emb.tok_emb.weight * emb.scale  # (V, D): what the model adds positions to
    pos = torch.arange(max_len)
    p = emb.pos_enc(torch.zeros(1, max_len, x.size(-1)), pos)[0]  # (T, D); zeros for rotary
    return {"tokens": rms(x), "positions": rms(p)}


def build_arm(arm: str, vocab: int, max_len: int, quick: bool) -> nn.Module:
    """The model of one arm. "sinusoidal" adds the sinusoids at the token scale: PE(i) has RMS
    1/sqrt(2) per coordinate, the N(0, 0.02) token embeddings 0.02, so raw sinusoids carry 35x
    the token signal and swamp it (measured in the report); "sinusoidal, unit" keeps them raw."""
    kind = arm.split(",")[0]  # "rotary, base 500000" -> rotary with that base
    cfg = model_config(kind, vocab, max_len, quick)
    if arm == ROTARY_LARGE:
        cfg = dataclasses.replace(cfg, rope_base=LARGE_BASE)
    model = build_model(cfg)
    if arm == "sinusoidal":
        emb = _embeddings(model)
        tokens = rms(emb.tok_emb.weight)
        emb.pos_enc = ScaledPositions(emb.pos_enc, tokens * math.sqrt(2.0))
    return model
