"""Transformer blocks: encoder block, decoder block, decoder-only (causal) block.

Each sublayer f (attention or feed-forward) is wrapped in a residual connection and a norm, with the
placement chosen by one switch, ``norm_first`` (000 "Add & Norm"); every block's ``forward``
writes both placements out, as two visible branches:

    pre-norm   h = f(LN(h)) + h          (Xiong et al. 2020: better gradients at initialisation)
    post-norm  h = LN(f(h) + h)          (Vaswani et al. 2017; 004 "Add&Norm")

Shapes: B batch, T target/query length, S source/key length, D d_model, H heads.
Blocks receive their parts (attention, feed-forward, norms) ready-made; ``attnlab.models`` builds
them. Dropout is applied to each sublayer's output before the residual add (Vaswani 5.4).

Hook points: x (the block's input), attn_norm (the norm's output in the self-attention
sublayer), resid_mid (the stream after it), in decoder blocks cross_norm and resid_cross, then
ffn_norm and resid_post (the block's output). With post-norm a sublayer's norm output is the
stream after it, so both names show the same value.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from attnlab.nn.cache import KVCache
from attnlab.nn.dropout import Dropout
from attnlab.nn.hooks import HookPoint
from attnlab.nn.multihead import CrossAttention, SelfAttention


class BlockOutput(NamedTuple):
    x: Tensor  # (B, T, D) the residual stream after the block
    self_weights: Tensor | None  # (B, H, T, S) when requested
    cross_weights: Tensor | None  # (B, H, T, S_src) when requested (decoder blocks)


class EncoderBlock(nn.Module):
    """Self-attention + Add & Norm, then feed-forward + Add & Norm (000 "Transformer Encoder")."""

    causal = False  # the encoder sees the whole sequence

    def __init__(
        self,
        *,
        self_attn: SelfAttention,
        ffn: nn.Module,
        self_attn_norm: nn.Module,
        ffn_norm: nn.Module,
        norm_first: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.self_attn, self.ffn = self_attn, ffn
        self.self_attn_norm, self.ffn_norm = self_attn_norm, ffn_norm
        self.norm_first = norm_first
        self.drop = Dropout(dropout)
        self.hook_x, self.hook_attn_norm, self.hook_resid_mid = (
            HookPoint(),
            HookPoint(),
            HookPoint(),
        )
        self.hook_ffn_norm, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> BlockOutput:
        """x: (B, T, D); mask broadcastable to (B, H, T, S) -> BlockOutput with x (B, T, D)."""
        x = self.hook_x(x)
        opts = dict(causal=self.causal, positions=positions, cache=cache, need_weights=need_weights)
        if self.norm_first:  # pre-norm: h = x + f(LN(x))
            a = self.self_attn(self.hook_attn_norm(self.self_attn_norm(x)), mask, **opts)
            h = self.hook_resid_mid(x + self.drop(a.out))
            ffn_in = self.hook_ffn_norm(self.ffn_norm(h))
            out = self.hook_resid_post(h + self.drop(self.ffn(ffn_in)))
        else:  # post-norm: h = LN(x + f(x))
            a = self.self_attn(x, mask, **opts)
            h = self.hook_resid_mid(self.hook_attn_norm(self.self_attn_norm(x + self.drop(a.out))))
            out = self.hook_resid_post(
                self.hook_ffn_norm(self.ffn_norm(h + self.drop(self.ffn(h))))
            )
        return BlockOutput(out, a.weights, None)


class CausalBlock(EncoderBlock):
    """The decoder-only (GPT) block: an encoder block with the future mask (000)."""

    causal = True


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, feed-forward; each with
    Add & Norm (000 "Transformer Encoder-Decoder"; 003 "Decoder")."""

    def __init__(
        self,
        *,
        self_attn: SelfAttention,
        cross_attn: CrossAttention,
        ffn: nn.Module,
        self_attn_norm: nn.Module,
        cross_attn_norm: nn.Module,
        ffn_norm: nn.Module,
        norm_first: bool = True,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.self_attn, self.cross_attn, self.ffn = self_attn, cross_attn, ffn
        self.self_attn_norm, self.cross_attn_norm = self_attn_norm, cross_attn_norm
        self.ffn_norm = ffn_norm
        self.norm_first = norm_first
        self.drop = Dropout(dropout)
        self.hook_x, self.hook_attn_norm, self.hook_resid_mid = (
            HookPoint(),
            HookPoint(),
            HookPoint(),
        )
        self.hook_cross_norm, self.hook_resid_cross = HookPoint(), HookPoint()
        self.hook_ffn_norm, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        *,
        self_mask: Tensor | None = None,
        cross_mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: KVCache | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
    ) -> BlockOutput:
        """x: (B, T, D) target stream; memory: (B, S, D) encoder output (or its projected
        ``memory_kv``); self_mask ~ (B, H, T, T), or (B, H, T, S_cache) over a cache's keys;
        cross_mask ~ (B, H, T, S)."""
        x = self.hook_x(x)
        opts = dict(causal=True, positions=positions, cache=cache, need_weights=need_weights)
        cross_opts = dict(memory_kv=memory_kv, need_weights=need_weights)
        if self.norm_first:  # pre-norm: h = x + f(LN(x)) for each sublayer f
            a = self.self_attn(self.hook_attn_norm(self.self_attn_norm(x)), self_mask, **opts)
            h = self.hook_resid_mid(x + self.drop(a.out))
            c_in = self.hook_cross_norm(self.cross_attn_norm(h))
            c = self.cross_attn(c_in, memory, cross_mask, **cross_opts)
            h = self.hook_resid_cross(h + self.drop(c.out))
            ffn_in = self.hook_ffn_norm(self.ffn_norm(h))
            out = self.hook_resid_post(h + self.drop(self.ffn(ffn_in)))
        else:  # post-norm: h = LN(x + f(x)) for each sublayer f
            a = self.self_attn(x, self_mask, **opts)
            h = self.hook_resid_mid(self.hook_attn_norm(self.self_attn_norm(x + self.drop(a.out))))
            c = self.cross_attn(h, memory, cross_mask, **cross_opts)
            h = self.hook_resid_cross(
                self.hook_cross_norm(self.cross_attn_norm(h + self.drop(c.out)))
            )
            out = self.hook_resid_post(
                self.hook_ffn_norm(self.ffn_norm(h + self.drop(self.ffn(h))))
            )
        return BlockOutput(out, a.weights, c.weights)
