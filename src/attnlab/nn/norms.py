"""Normalisation layers: LayerNorm (004 eq. 17, Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019).

Shapes: (..., D) -> (..., D); statistics are taken over the last axis (one token's features).

Deviations from the notes: 004 eq. 17 has no epsilon and no gain/bias. We add eps inside the square
root (so a constant vector does not divide by zero) and the learned gain g and bias b of Ba et al.,
as every Transformer does; with g = 1, b = 0, eps -> 0 it is exactly eq. 17. The result equals
``torch.nn.LayerNorm`` (tested).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class LayerNorm(nn.Module):
    """LN(a) = g (a - mu) / sqrt(sigma^2 + eps) + b, mu = mean(a), sigma^2 = mean((a - mu)^2)."""

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gain g
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, a: Tensor) -> Tensor:
        # The fused kernel computes exactly the formula above (biased variance, eps inside sqrt).
        return nn.functional.layer_norm(a, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm(a) = g * a / sqrt(mean_h a_h^2 + eps): LayerNorm without re-centering or bias."""

    def __init__(self, d_model: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model)) if affine else None

    def forward(self, a: Tensor) -> Tensor:
        g: Tensor | None = self.weight
        if g is not None and g.dtype != a.dtype:
            # Under bf16 autocast q and k arrive in bf16 while g stays fp32; the fused kernel
            # needs one dtype (else PyTorch warns and takes the slow composite path). The cast
            # is differentiable: g's gradient still accumulates in fp32.
            g = g.to(a.dtype)
        return nn.functional.rms_norm(a, (a.size(-1),), g, self.eps)


def make_norm(kind: str, d_model: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """Build the norm named by a config ("layernorm" or "rmsnorm"; "none": the identity, for
    ablations such as ``attnlab experiment layernorm``)."""
    if kind == "none":
        return nn.Identity()
    if kind == "layernorm":
        return LayerNorm(d_model, eps, bias)
    if kind == "rmsnorm":
        return RMSNorm(d_model, eps)
    raise ValueError(f"unknown norm {kind!r}; choose 'layernorm', 'rmsnorm' or 'none'")
