"""Builders that turn a :class:`ModelConfig` into ``attnlab.nn`` parts, and the weight init.

Initialisation (documented, GPT-2 style): every Linear and Embedding weight ~ N(0, 0.02), biases 0,
norm gains 1; the last projection of each residual branch (attention W^O and the feed-forward W2)
~ N(0, 0.02 / sqrt(2 * n_layers)) so the residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch
from torch import Tensor, nn

from attnlab.config import ModelConfig
from attnlab.nn.blocks import CausalBlock, DecoderBlock, EncoderBlock
from attnlab.nn.dropout import Dropout
from attnlab.nn.feedforward import make_feedforward
from attnlab.nn.hooks import HookPoint
from attnlab.nn.multihead import CrossAttention, SelfAttention
from attnlab.nn.norms import make_norm
from attnlab.nn.positional import Positions, RopeScaling, default_positions, make_positions
from attnlab.nn.sandwich import SandwichBlock


class Embeddings(nn.Module):
    """x_i = E w_i (optionally * sqrt(D), Vaswani 3.4), then a position representation and dropout.

    ids (B, T) -> (B, T, D). ``pos_enc`` is the model's position scheme
    (``attnlab.nn.positional``): its embedding side acts here; rotary positions and ALiBi leave x
    unchanged here and act in attention, which receives the same scheme. BERT adds two things:
    segment embeddings T_type (``n_token_types``; token types (B, T), default all 0) and a norm
    on the sum (``embed_norm``): x = LN(E w + P_pos + T_type).
    Hook points: X (the token embeddings), P (the position signal, where one is added or
    concatenated), embed (the first block's input).
    """

    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        rope = RopeScaling(
            cfg.rope_scaling,
            cfg.rope_factor,
            cfg.rope_low_freq_factor,
            cfg.rope_high_freq_factor,
            cfg.rope_original_max_len,
        )
        self.pos_enc = make_positions(  # the position scheme; its attention sides act in blocks
            cfg.positional,
            cfg.d_model,
            cfg.head_dim,
            cfg.max_len,
            cfg.rope_base,
            n_heads=cfg.n_heads,
            rope=rope,
        )
        n_types = cfg.n_token_types
        self.type_emb = nn.Embedding(n_types, cfg.d_model) if n_types else None  # T_type
        self.norm = _norm(cfg) if cfg.embed_norm else None
        self.scale = math.sqrt(cfg.d_model) if cfg.embed_scale else 1.0
        self.drop = Dropout(cfg.dropout)
        self.hook_X, self.hook_P, self.hook_embed = HookPoint(), HookPoint(), HookPoint()

    def forward(
        self,
        ids: Tensor,
        positions: Tensor | None = None,
        offset: int = 0,
        token_types: Tensor | None = None,
    ) -> Tensor:
        if token_types is not None and (self.type_emb is None or token_types.shape != ids.shape):
            raise ValueError(
                "token_types must have the ids' shape (B, T) and the model segment embeddings "
                f"(n_token_types > 0); got {tuple(token_types.shape)} for ids "
                f"{tuple(ids.shape)} and n_token_types="
                f"{0 if self.type_emb is None else self.type_emb.num_embeddings}"
            )
        if positions is None:
            positions = default_positions(ids.size(1), offset, ids.device)  # (T,)
        x = self.tok_emb(ids)  # (B, T, D)
        if self.scale != 1.0:
            x = x * self.scale
        x = self.hook_X(x)
        p = self.pos_enc.signal(positions, x)  # (T|B,T, .) or None
        if p is not None:
            x = self.pos_enc.combine(x, self.hook_P(p))  # (B, T, D)
        if self.type_emb is not None:
            types = token_types if token_types is not None else torch.zeros_like(ids)
            try:  # the lookup bounds-checks (on the CPU; CUDA asserts inside the kernel)
                x = x + self.type_emb(types)  # (B, T, D)
            except IndexError:
                raise ValueError(
                    f"token_types must be segment ids in [0, {self.type_emb.num_embeddings}), "
                    f"got values from {int(types.min())} to {int(types.max())}"
                ) from None
        if self.norm is not None:
            x = self.norm(x)
        return self.hook_embed(self.drop(x))


def _attention_options(cfg: ModelConfig) -> dict:
    """The ModelConfig fields that every attention layer of a model shares."""
    return dict(
        d_head=cfg.d_head,
        d_v=cfg.d_v,
        bias=cfg.attention_bias,
        out_proj=cfg.out_proj,
        dropout=cfg.dropout,
        activation=cfg.attention,
        scale=cfg.scale_logits,
        softcap=cfg.attn_logit_softcap,
        qk_norm=cfg.qk_norm,
        qk_norm_eps=cfg.norm_eps,
        out_bias=cfg.attention_out_bias,
        d_out=cfg.d_model,
        straight_through=cfg.straight_through,
    )


def make_self_attention(
    cfg: ModelConfig, pos_enc: Positions | None, layer: int = 0
) -> SelfAttention:
    """The self-attention of layer ``layer``: its window is ``cfg.layer_window(layer)``."""
    return SelfAttention(
        cfg.d_model,
        cfg.n_heads,
        pos_enc=pos_enc,
        n_kv_heads=cfg.n_kv_heads,
        window=cfg.layer_window(layer),
        qkv_proj=cfg.qkv_proj,
        **_attention_options(cfg),
    )


def make_cross_attention(cfg: ModelConfig, d_memory: int | None = None) -> CrossAttention:
    return CrossAttention(cfg.d_model, cfg.n_heads, d_memory=d_memory, **_attention_options(cfg))


def _norm(cfg: ModelConfig) -> nn.Module:
    return make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)


def _ffn_norm(cfg: ModelConfig) -> nn.Module:
    """The feed-forward sublayer's norm; none before a pre-norm sublayer that is absent
    (``ffn="none"``: its norm would feed nothing)."""
    return nn.Identity() if cfg.ffn == "none" and cfg.norm_placement == "pre" else _norm(cfg)


def _ffn(cfg: ModelConfig) -> nn.Module:
    return make_feedforward(
        cfg.ffn,
        cfg.d_model,
        cfg.ff_dim,
        activation=cfg.activation,
        bias=cfg.feedforward_bias,
        dropout=cfg.dropout,
    )


def make_encoder_block(cfg: ModelConfig, pos_enc: Positions | None, layer: int = 0) -> EncoderBlock:
    return _self_attention_block(EncoderBlock, cfg, pos_enc, layer)


_Block = TypeVar("_Block", bound=EncoderBlock)


def _self_attention_block(
    block_cls: type[_Block], cfg: ModelConfig, pos_enc: Positions | None, layer: int = 0
) -> _Block:
    """An encoder or causal block (number ``layer``): self-attention and feed-forward, each with
    Add & Norm."""
    return block_cls(
        self_attn=make_self_attention(cfg, pos_enc, layer),
        ffn=_ffn(cfg),
        self_attn_norm=_norm(cfg),
        ffn_norm=_ffn_norm(cfg),
        norm_first=cfg.norm_placement == "pre",
        dropout=cfg.dropout,
    )


def make_causal_block(cfg: ModelConfig, pos_enc: Positions | None, layer: int = 0) -> CausalBlock:
    """Decoder-only block number ``layer`` (0-based; its attention window depends on it)."""
    if cfg.norm_placement == "sandwich":  # Gemma 2/3: a norm after each sublayer too
        return SandwichBlock(
            self_attn=make_self_attention(cfg, pos_enc, layer),
            ffn=_ffn(cfg),
            self_attn_norm=_norm(cfg),
            ffn_norm=_norm(cfg),
            post_attn_norm=_norm(cfg),
            post_ffn_norm=_norm(cfg),
            dropout=cfg.dropout,
        )
    return _self_attention_block(CausalBlock, cfg, pos_enc, layer)


def make_decoder_block(cfg: ModelConfig, pos_enc: Positions | None) -> DecoderBlock:
    return DecoderBlock(
        self_attn=make_self_attention(cfg, pos_enc),
        cross_attn=make_cross_attention(cfg),
        ffn=_ffn(cfg),
        self_attn_norm=_norm(cfg),
        cross_attn_norm=_norm(cfg),
        ffn_norm=_ffn_norm(cfg),
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
