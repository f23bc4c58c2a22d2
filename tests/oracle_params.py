"""Weights of attnlab modules as the NumPy arrays ``attnlab.reference`` takes (float64 oracle)."""

from __future__ import annotations

import numpy as np
import torch

from attnlab import reference as ref
from attnlab.config import ModelConfig

# How close a module must come to the NumPy oracle: in float64 (the math itself) and in float32.
TOL64 = {"rtol": 1e-10, "atol": 1e-10}
TOL32 = {"rtol": 1e-5, "atol": 1e-5}


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


def block_params(block, cfg: ModelConfig | None = None) -> dict:
    """A Transformer block's weights as ``ref.encoder_block`` / ``ref.decoder_block`` take them:
    self- (and cross-) attention, the feed-forward W1, b1, W2, b2 and every norm's gain (and
    bias), with ``cfg``'s activation, norm kind and eps (default ModelConfig(): ReLU, LayerNorm,
    eps 1e-5)."""
    cfg = cfg or ModelConfig()
    params = {
        "self_attn": attn_params(block.self_attn),
        "ffn": {
            "W1": to_np(block.ffn.up.weight.T),
            "b1": to_np(block.ffn.up.bias),
            "W2": to_np(block.ffn.down.weight.T),
            "b2": to_np(block.ffn.down.bias),
            "activation": cfg.activation,
        },
        "eps": cfg.norm_eps,
        "norm": "layer" if cfg.norm == "layernorm" else "rms",
    }
    norms = ["self_attn_norm", "ffn_norm"]
    if hasattr(block, "cross_attn"):
        params["cross_attn"] = attn_params(block.cross_attn)
        norms.append("cross_attn_norm")
    for name in norms:
        norm = getattr(block, name)
        params[name] = {"gain": to_np(norm.weight)}
        if getattr(norm, "bias", None) is not None:
            params[name]["bias"] = to_np(norm.bias)
    return params
