"""The sandwich block of Gemma 2/3: a pre-norm causal block whose sublayer outputs are normed too.

    h  = x + LN_post_attn(MultiHead(LN_attn(x)))
    x' = h + LN_post_ffn(FFN(LN_ffn(h)))

(pre-norm, ``attnlab.nn.blocks``, without the two outer norms; Gemma Team 2024, "Gemma 2"). The
extra norms bound what each sublayer adds to the residual stream.

Shapes: B batch, T query length, S key length, D d_model, H heads. Hook points as in
``CausalBlock`` (x, attn_norm, resid_mid, ffn_norm, resid_post).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from attnlab.nn.blocks import BlockOutput, CausalBlock


class SandwichBlock(CausalBlock):
    """A causal block with a norm on each sublayer's output as well as its input (Gemma 2/3)."""

    def __init__(self, *, post_attn_norm: nn.Module, post_ffn_norm: nn.Module, **parts):
        super().__init__(**parts, norm_first=True)
        self.post_attn_norm, self.post_ffn_norm = post_attn_norm, post_ffn_norm

    def forward(self, x: Tensor, mask: Tensor | None = None, **opts: Any) -> BlockOutput:
        """x: (B, T, D); mask broadcastable to (B, H, T, S); ``opts`` the keywords of
        :meth:`CausalBlock.forward` (positions (B, T), cache, need_weights) -> BlockOutput with
        x (B, T, D)."""
        x = self.hook_x(x)
        a = self.self_attn(self.hook_attn_norm(self.self_attn_norm(x)), mask, causal=True, **opts)
        h = self.hook_resid_mid(x + self.drop(self.post_attn_norm(a.out)))  # (B, T, D)
        f = self.ffn(self.hook_ffn_norm(self.ffn_norm(h)))  # (B, T, D)
        x = self.hook_resid_post(h + self.drop(self.post_ffn_norm(f)))  # (B, T, D)
        return BlockOutput(x, a.weights, None)
