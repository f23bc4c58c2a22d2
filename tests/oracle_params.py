"""Weights of attnlab modules as the NumPy arrays ``attnlab.reference`` takes (float64 oracle)."""

from __future__ import annotations

import numpy as np
import torch

from attnlab import reference as ref


def to_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def attn_params(attn) -> dict:
    """W^Q, W^K, W^V split per head (H, D, Dk|Dv), their biases, and W^O, b^O, of a
    SelfAttention (packed ``qkv_proj``) or a CrossAttention (``q_proj`` + packed ``kv_proj``)."""
    h, hk, hv = attn.n_heads, attn.n_heads * attn.d_head, attn.n_heads * attn.d_v
    if hasattr(attn, "qkv_proj"):
        w, b = attn.qkv_proj.weight.split([hk, hk, hv]), attn.qkv_proj.bias.split([hk, hk, hv])
    else:
        kw, vw = attn.kv_proj.weight.split([hk, hv])
        kb, vb = attn.kv_proj.bias.split([hk, hv])
        w, b = (attn.q_proj.weight, kw, vw), (attn.q_proj.bias, kb, vb)
    out = {"Wo": to_np(attn.out_proj.weight.T), "bo": to_np(attn.out_proj.bias)}
    for name, wi, bi in zip("qkv", w, b):
        out[f"W{name}"] = ref.split_heads_weights(to_np(wi.T), h)
        out[f"b{name}"] = ref.split_heads_weights(to_np(bi), h)
    return out
