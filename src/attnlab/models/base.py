"""The three model interfaces every family implements (language model, seq2seq, classifier).

Training, generation, plots and benchmarks talk to models only through these, so they never branch
on the family (Transformer or recurrent).

Shapes: B batch, T target/query length, S source/key length, V vocabulary, C classes.
Masks passed to models are key padding masks of shape (B, S), True = a real token (may attend).

Decoding caches: ``new_cache`` returns a mutable object that ``forward``/``decode`` update in place
when given ``cache=``; calls with a cache process only the new tokens. Every cache has ``length``
(tokens consumed so far) and ``reorder(index)`` (select batch rows, for beam search).
"""

from __future__ import annotations

from typing import Generic, NamedTuple, Protocol, TypeVar

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig


class LayerAttention(NamedTuple):
    """Attention weights of one layer, each (B, H, T, S) or None when the layer has no such part."""

    self_attn: Tensor | None
    cross_attn: Tensor | None


class ModelOutput(NamedTuple):
    """What every model forward returns: logits, and per-layer weights only when asked."""

    logits: Tensor  # (B, T, V) for LMs and decoders, (B, C) for classifiers
    attentions: tuple[LayerAttention, ...] | None = None


class DecodeCache(Protocol):
    @property
    def length(self) -> int: ...  # tokens consumed so far

    def reorder(self, index: Tensor) -> None: ...


CacheT = TypeVar("CacheT", bound=DecodeCache)  # the cache type a model's ``new_cache`` returns


class Encoded(NamedTuple):
    """An encoded source: memory (B, S, D_mem), its padding mask (B, S), and the source ids."""

    memory: Tensor
    src_mask: Tensor
    src: Tensor


class LanguageModel(nn.Module, Generic[CacheT]):
    """p(w_t | w_{<t}) over a vocabulary (000 eq. w_t ~ softmax(f(w_{1:t-1}))); ``CacheT`` is
    the decoding cache it makes and takes."""

    vocab_size: int
    max_len: int | None  # context window; None = unbounded (recurrent)

    def forward(
        self,
        ids: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: CacheT | None = None,
        need_weights: bool = False,
    ) -> ModelOutput:
        """ids (B, T) -> logits (B, T, V). ``positions`` (B, T) override 0..T-1 (left padding)."""
        raise NotImplementedError

    def new_cache(
        self, batch_size: int, max_len: int | None = None, dtype: str | None = None
    ) -> CacheT:
        """Decoding state for ``batch_size`` rows and ``max_len`` positions (default: the context
        window); ``dtype`` ("fp32", "bf16") is the KV cache's, None the model's compute dtype
        (models without a KV cache accept only None)."""
        raise NotImplementedError


class Seq2SeqModel(nn.Module, Generic[CacheT]):
    """p(y_{1:L} | x_{1:T}) = prod_l p(y_l | y_{<l}, x) (004 eq. 1), teacher-forced or stepwise;
    ``CacheT`` is the decoding cache it makes and takes."""

    vocab_size: int  # source vocabulary
    tgt_vocab_size: int
    max_len: int | None

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Encoded:
        raise NotImplementedError

    def decode(
        self,
        tgt_in: Tensor,
        encoded: Encoded,
        *,
        tgt_mask: Tensor | None = None,
        cache: CacheT | None = None,
        need_weights: bool = False,
        real_only: bool = False,
    ) -> ModelOutput:
        """tgt_in (B, T) shifted-right target ids -> logits (B, T, V_tgt).

        real_only=True (teacher forcing): logits (N, V_tgt) of the N real target positions only,
        in row-major order, i.e. ``logits[tgt_mask]``; the head never runs on padding.
        """
        raise NotImplementedError

    def new_cache(
        self, encoded: Encoded, max_len: int | None = None, dtype: str | None = None
    ) -> CacheT:
        raise NotImplementedError

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        need_weights: bool = False,
        real_only: bool = False,
    ) -> ModelOutput:
        """Teacher forcing: decode(tgt_in, encode(src)); logits (B, T, V_tgt), or (N, V_tgt) at
        the real target positions with ``real_only`` (what a loss needs)."""
        return self.decode(
            tgt_in,
            self.encode(src, src_mask),
            tgt_mask=tgt_mask,
            need_weights=need_weights,
            real_only=real_only,
        )


def real_positions(x: Tensor, tgt_mask: Tensor | None) -> Tensor:
    """(B, T, D) -> (N, D): the rows of real target positions (row-major), all when no mask."""
    return x.flatten(0, 1) if tgt_mask is None else x[tgt_mask]


class Classifier(nn.Module):
    """p(c | x_{1:T}) from an encoder (003 "Encoder-only Models")."""

    vocab_size: int
    n_classes: int
    max_len: int | None

    def forward(
        self, ids: Tensor, *, key_padding_mask: Tensor | None = None, need_weights: bool = False
    ) -> ModelOutput:
        """ids (B, T) -> logits (B, C)."""
        raise NotImplementedError


def config_of(model: nn.Module) -> ModelConfig:
    """The ModelConfig an attnlab model was built from (its ``cfg``); TypeError for any other
    module (a transformers model, a bare nn.Module)."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"expected an attnlab model with .cfg, got {type(model).__name__}")
    return cfg


def check_ids(ids: Tensor, vocab_size: int, name: str = "ids", max_len: int | None = None) -> None:
    """Validate a (B, T) batch of token ids at a model boundary with messages that name the fix."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"{name} must hold integer token ids, got dtype {ids.dtype}; use int64 (ids.long())"
        )
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(ids.shape)}")
    if ids.size(1) == 0:
        raise ValueError(f"{name} is an empty sequence (T=0); give at least one token")
    if max_len is not None and ids.size(1) > max_len:
        raise ValueError(
            f"{name} has length {ids.size(1)} but the model accepts at most max_len={max_len}"
        )
    if torch.compiler.is_compiling():
        return  # the value check reads the ids on the host: a graph break (decode steps feed
        # sampled ids, in range by construction; the embedding lookup still bounds-checks)
    lo, hi = (int(v) for v in torch.aminmax(ids)) if ids.numel() else (0, 0)  # one reduction
    if lo < 0 or hi >= vocab_size:
        bad = hi if hi >= vocab_size else lo
        raise ValueError(f"{name} contains token id {bad} outside the vocabulary [0, {vocab_size})")


def check_padding_mask(mask: Tensor | None, ids: Tensor, name: str = "key_padding_mask") -> None:
    """A key padding mask must be boolean (B, S) with True = real token."""
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True = real token), got {mask.dtype}")
    if mask.shape != ids.shape:
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but the ids have shape {tuple(ids.shape)}"
        )


def check_positions(positions: Tensor | None, ids: Tensor) -> None:
    """Explicit positions must be non-negative integers of shape (T,) or (B, T) matching ids."""
    if positions is None:
        return
    if not isinstance(positions, Tensor) or positions.dtype not in (torch.int64, torch.int32):
        got = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
        raise TypeError(f"positions must be an int64 tensor of position indices, got {got}")
    b, t = ids.shape
    if tuple(positions.shape) not in ((t,), (b, t)):
        raise ValueError(
            f"positions has shape {tuple(positions.shape)}; expected ({t},) or ({b}, {t}) "
            "to match the ids"
        )
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0, got {int(positions.min())}")


def check_not_all_padding(mask: Tensor | None, name: str = "key_padding_mask") -> None:
    """Every sequence needs at least one real token, else attention has nothing to look at."""
    if mask is None:
        return
    empty = ~mask.any(dim=1)  # (B,)
    if bool(empty.any()):
        rows = empty.nonzero().flatten().tolist()
        raise ValueError(
            f"row(s) {rows} are entirely padding; every sequence needs at least one real token "
            f"(check {name}: True = real token)"
        )
