"""Builders that turn a :class:`ModelConfig` into ``attnlab.nn`` parts, and the weight init.

Initialisation (documented, GPT-2 style): every Linear and Embedding weight ~ N(0, 0.02), biases 0,
norm gains 1; the last projection of each residual branch (attention W^O and the feed-forward W2)
~ N(0, 0.02 / sqrt(2 * n_layers)) so the residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.nn.blocks import CausalBlock, DecoderBlock, EncoderBlock
from attnlab.nn.dropout import Dropout
from attnlab.nn.feedforward import FeedForward
from attnlab.nn.hooks import HookPoint
from attnlab.nn.multihead import CrossAttention, SelfAttention
from attnlab.nn.norms import make_norm
from attnlab.nn.positional import RotaryPositions, default_positions, make_positions


class Embeddings(nn.Module):
    """x_i = E w_i (optionally * sqrt(D), Vaswani 3.4), then a position representation and dropout.

    ids (B, T) -> (B, T, D). Rotary positions leave x unchanged here and act in attention.
    Hook points: X (the token embeddings), P (the position signal, where one is added or
    concatenated), embed (the first block's input).
    """

    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos_enc = make_positions(
            cfg.positional, cfg.d_model, cfg.head_dim, cfg.max_len, cfg.rope_base
        )
        self.scale = math.sqrt(cfg.d_model) if cfg.embed_scale else 1.0
        self.drop = Dropout(cfg.dropout)
        self.hook_X, self.hook_P, self.hook_embed = HookPoint(), HookPoint(), HookPoint()

    @property
    def rotary(self) -> RotaryPositions | None:
        return self.pos_enc if isinstance(self.pos_enc, RotaryPositions) else None

    def forward(self, ids: Tensor, positions: Tensor | None = None, offset: int = 0) -> Tensor:
        if positions is None:
            positions = default_positions(ids.size(1), offset, ids.device)  # (T,)
        x = self.tok_emb(ids)  # (B, T, D)
        if self.scale != 1.0:
            x = x * self.scale
        x = self.hook_X(x)
        p = self.pos_enc.signal(positions, x)  # (T|B,T, .) or None
        if p is not None:
            x = self.pos_enc.combine(x, self.hook_P(p))  # (B, T, D)
        return self.hook_embed(self.drop(x))


def _attention_options(cfg: ModelConfig) -> dict:
    """The ModelConfig fields that every attention layer of a model shares."""
    return dict(
        d_head=cfg.d_head,
        d_v=cfg.d_v,
        bias=cfg.bias,
        out_proj=cfg.out_proj,
        dropout=cfg.dropout,
        activation=cfg.attention,
        scale=cfg.scale_logits,
        qk_norm=cfg.qk_norm,
        d_out=cfg.d_model,
        straight_through=cfg.straight_through,
    )


def make_self_attention(cfg: ModelConfig, rotary: RotaryPositions | None) -> SelfAttention:
    return SelfAttention(cfg.d_model, cfg.n_heads, rotary=rotary, **_attention_options(cfg))


def make_cross_attention(cfg: ModelConfig, d_memory: int | None = None) -> CrossAttention:
    return CrossAttention(cfg.d_model, cfg.n_heads, d_memory=d_memory, **_attention_options(cfg))


def _norm(cfg: ModelConfig) -> nn.Module:
    return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)


def _ffn(cfg: ModelConfig) -> FeedForward:
    return FeedForward(
        cfg.d_model, cfg.ff_dim, activation=cfg.activation, bias=cfg.bias, dropout=cfg.dropout
    )


def make_encoder_block(
    cfg: ModelConfig, rotary: RotaryPositions | None, block_cls: type[EncoderBlock] = EncoderBlock
) -> EncoderBlock:
    return block_cls(
        self_attn=make_self_attention(cfg, rotary),
        ffn=_ffn(cfg),
        self_attn_norm=_norm(cfg),
        ffn_norm=_norm(cfg),
        norm_first=cfg.norm_placement == "pre",
        dropout=cfg.dropout,
    )


def make_causal_block(cfg: ModelConfig, rotary: RotaryPositions | None) -> CausalBlock:
    return make_encoder_block(cfg, rotary, CausalBlock)


def make_decoder_block(cfg: ModelConfig, rotary: RotaryPositions | None) -> DecoderBlock:
    return DecoderBlock(
        self_attn=make_self_attention(cfg, rotary),
        cross_attn=make_cross_attention(cfg),
        ffn=_ffn(cfg),
        self_attn_norm=_norm(cfg),
        cross_attn_norm=_norm(cfg),
        ffn_norm=_norm(cfg),
        norm_first=cfg.norm_placement == "pre",
        dropout=cfg.dropout,
    )


def make_final_norm(cfg: ModelConfig) -> nn.Module:
    return _norm(cfg) if cfg.final_norm else nn.Identity()


def init_weights(model: nn.Module, n_layers: int, std: float = 0.02) -> None:
    """The documented initialisation (module docstring)."""
    residual_std = std / math.sqrt(2 * max(n_layers, 1))
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = name.endswith("out_proj") or name.endswith("ffn.down")
            nn.init.normal_(module.weight, 0.0, residual_std if last else std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
