"""Encoder-only models: the Transformer encoder (000) and a BERT-like classifier (003).

Shapes: B batch, T length, D d_model, C classes, H heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.models.base import (
    Classifier,
    LayerAttention,
    ModelOutput,
    check_ids,
    check_not_all_padding,
    check_padding_mask,
)
from attnlab.models.layers import Embeddings, init_weights, make_encoder_block, make_final_norm
from attnlab.nn.hooks import HookPoint
from attnlab.nn.masks import padding_mask


class EncoderOutput(NamedTuple):
    hidden: Tensor  # (B, T, D) contextual representations h_{1:n}
    attentions: tuple[LayerAttention, ...] | None


class EncoderStack(nn.Module):
    """A stack of encoder blocks plus an optional final norm, on embeddings (B, T, D)."""

    def __init__(self, blocks: Sequence[nn.Module], final_norm: nn.Module):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.hook_final = HookPoint()  # the final norm's output, (B, T, D)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        need_weights: bool = False,
    ) -> EncoderOutput:
        """x: (B, T, D), mask broadcastable to (B, H, T, T) -> hidden (B, T, D)."""
        weights = []
        for block in self.blocks:
            x, w, _ = block(x, mask, positions=positions, need_weights=need_weights)
            weights.append(LayerAttention(w, None))
        hidden = self.hook_final(self.final_norm(x))  # (B, T, D)
        return EncoderOutput(hidden, tuple(weights) if need_weights else None)


class TransformerEncoder(nn.Module):
    """h^(x)_{1:n} = TransformerEncoder(w_{1:n}): embed, add positions, apply N encoder blocks
    with no future mask (000 "Transformer Encoder")."""

    def __init__(self, cfg: ModelConfig, vocab_size: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size or cfg.vocab_size
        self.max_len = cfg.max_len
        self.embed = Embeddings(self.vocab_size, cfg)
        blocks = [make_encoder_block(cfg, self.embed.pos_enc) for _ in range(cfg.n_layers)]
        self.stack = EncoderStack(blocks, make_final_norm(cfg))
        # BERT's pooler: tanh(W_p h_CLS + b_p), the sentence vector its classifier reads.
        self.pooler = nn.Linear(cfg.d_model, cfg.d_model) if cfg.pooler else None
        init_weights(self, cfg.n_layers)

    def forward(
        self,
        ids: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        token_types: Tensor | None = None,
    ) -> EncoderOutput:
        """ids (B, T), key_padding_mask (B, T) True = real -> hidden (B, T, D).
        token_types (B, T): segment ids for models with ``n_token_types`` (BERT), default 0."""
        self.check_input(ids, key_padding_mask)
        x = self.embed(ids, token_types=token_types)  # (B, T, D)
        return self.stack(x, padding_mask(key_padding_mask), need_weights=need_weights)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooled vector tanh(W_p h_0 + b_p) of the first ([CLS]) position: (B, T, D) ->
        (B, D). Needs ``pooler=True``."""
        if self.pooler is None:
            raise ValueError("this encoder has no pooler; build it with ModelConfig(pooler=True)")
        return torch.tanh(self.pooler(hidden[:, 0]))  # (B, D)

    def check_input(self, ids: Tensor, key_padding_mask: Tensor | None) -> None:
        """ids (B, T) in the vocabulary and within max_len; a mask with a real token per row."""
        check_ids(ids, self.vocab_size, "ids", self.max_len)
        check_padding_mask(key_padding_mask, ids)
        check_not_all_padding(key_padding_mask)


class EncoderClassifier(Classifier):
    """BERT-like classifier: p(c | x) = softmax(W pool(TransformerEncoder(x)) + b).

    pooling "cls": the representation of position 0 (the data layer puts a <bos>/CLS token there),
    through BERT's tanh pooler when ``pooler``; "mean": the average over non-padding positions.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.n_classes is None:
            raise ValueError("a classifier needs n_classes (>= 2) in its ModelConfig")
        self.cfg = cfg
        self.vocab_size, self.n_classes, self.max_len = cfg.vocab_size, cfg.n_classes, cfg.max_len
        self.pooling = cfg.pooling
        self.encoder = TransformerEncoder(cfg)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        nn.init.normal_(self.head.weight, 0.0, 0.02)
        nn.init.zeros_(self.head.bias)

    def forward(
        self, ids: Tensor, *, key_padding_mask: Tensor | None = None, **inputs
    ) -> ModelOutput:
        """ids (B, T) -> class logits (B, C); the other keywords (``need_weights``,
        ``token_types``) go to :meth:`TransformerEncoder.forward` unchanged."""
        hidden, attentions = self.encoder(ids, key_padding_mask=key_padding_mask, **inputs)
        if self.encoder.pooler is not None:
            pooled = self.encoder.pool(hidden)  # (B, D)
        elif self.pooling == "cls":
            pooled = hidden[:, 0]  # (B, D)
        elif key_padding_mask is None:
            pooled = hidden.mean(dim=1)  # (B, D)
        else:
            m = key_padding_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)  # (B, D)
        return ModelOutput(self.head(pooled), attentions)  # (B, C)
