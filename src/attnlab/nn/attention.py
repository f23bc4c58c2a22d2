"""Self-attention and scaled dot-product attention (001, 000, 004 eq. 9-12).

Shapes: B batch, H heads, T query length (N in 004), S key length (M in 004),
Dk = d_q = d_k per head, Dv = d_v per head.
Masks are bool, broadcastable to (B, H, T, S); True = may attend (see ``attnlab.nn.masks``).

Two execution paths share one API, :func:`scaled_dot_product_attention`:
  * the *explicit* path forms A = a(Q K^T / sqrt(d_q)) and returns it (needed for plots and for hard
    attention);
  * the *fused* path calls ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-
    efficient kernels, no (T, S) matrix kept for backward) and is chosen automatically when the
    weights are not requested;
  * on the CPU, for masked attention over short key sequences (S <= 128: padded batches), the
    explicit form as one autograd node with its gradient written out
    (``attnlab.nn.short_attention``) replaces the fused kernel, whose masked path is slower there.

Deviations from the notes:
  * 004 writes A_ij = softmax(<q_i, k_1>, ..., <q_i, k_M>) / sqrt(d_q): the scale belongs *inside*
    the activation, a(Q K^T / sqrt(d_q)) as in its own eq. 9. We implement eq. 9.
  * A fully masked row (a query allowed to see no key) outputs zeros with zero weights instead of
    the NaN of -inf softmax or the uniform average of 003's ``masked_fill(mask == 0, -9e15)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.dropout import dropout
from attnlab.nn.masks import causal_mask, check_mask, combine_masks
from attnlab.nn.short_attention import short_key_attention, use_short_keys


class AttentionOutput(NamedTuple):
    """Attended values and, on the explicit path, the attention matrix (rows sum to 1)."""

    out: Tensor  # (B, H, T, Dv) or (B, T, D) for modules
    weights: Tensor | None  # (B, H, T, S), None on the fused path


def basic_self_attention(x: Tensor) -> Tensor:
    """Parameter-free self-attention of 001: Y = softmax(X X^T) X.

    w'_ij = x_i^T x_j, w_ij = softmax_j(w'_ij), y_i = sum_j w_ij x_j.
    x: (..., T, D) -> (..., T, D). Permutation equivariant: permuting rows of X permutes Y.
    """
    raw = x @ x.transpose(-2, -1)  # (..., T, T)
    return raw.softmax(dim=-1) @ x  # (..., T, D)


def hardmax(scores: Tensor, straight_through: bool = False) -> Tensor:
    """Hard attention row activation of 004: one-hot at argmax_j per row (first index on ties).

    With ``straight_through`` the forward value is the one-hot row but the gradient is that of the
    softmax (the straight-through estimator); without it the gradient is zero (argmax is flat).
    scores: (..., S) -> (..., S).
    """
    index = scores.argmax(dim=-1, keepdim=True)  # torch returns the first maximal index
    hard = torch.zeros_like(scores).scatter_(-1, index, 1.0)
    if not straight_through:
        return hard
    soft = scores.softmax(dim=-1)
    return hard + (soft - soft.detach())  # exactly one-hot forward (no 1 - ulp rounding)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    scale: bool | float = True,
    activation: str = "softmax",
    straight_through: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> AttentionOutput:
    """Attention(Q, K, V; a) = a(Q K^T / sqrt(d_q)) V   (004 eq. 9; Vaswani eq. 1).

    q: (B, H, T, Dk); k: (B, H, S, Dk); v: (B, H, S, Dv) -> out (B, H, T, Dv),
    weights (B, H, T, S) when ``need_weights`` (or when the activation is "hardmax").

    mask: bool, broadcastable to (B, H, T, S), True = may attend. ``causal`` adds the future mask
    of 000 (aligned bottom-right when T < S, i.e. queries are the last T positions).
    scale: True divides by sqrt(d_q), False leaves the logits unscaled (for the scaling
    experiment), a float multiplies by that factor.
    activation: "softmax" (soft attention) or "hardmax" (hard attention, explicit path only).
    """
    _check_qkv(q, k, v)
    b, h, t, dk = q.shape
    s = k.size(-2)
    if mask is not None:
        mask = check_mask(mask, b, h, t, s)
    if activation not in ("softmax", "hardmax"):
        raise ValueError(f"activation must be 'softmax' or 'hardmax', got {activation!r}")
    factor = _scale_factor(scale, dk)
    if causal and t == 1:
        causal = False  # a single query at the last position may see every key (decode step)
    if need_weights or activation == "hardmax" or _cpu_dropout(q, dropout_p):
        return _explicit(q, k, v, mask, causal, factor, activation, straight_through, dropout_p)
    if t == 1 and dropout_p == 0.0 and torch.compiler.is_compiling():
        return _one_query(q, k, v, mask, factor)
    if causal and (mask is not None or t != s):
        mask, causal = combine_masks(mask, causal_mask(t, s, device=q.device)), False
    if mask is not None and use_short_keys(q, k, dropout_p):
        return AttentionOutput(short_key_attention(q, k, v, mask, factor), None)
    return _fused(q, k, v, mask, causal, factor, dropout_p)


def _explicit(q, k, v, mask, causal, factor, activation, straight_through, dropout_p):
    """The notes' matrix form: scores, mask, row activation, weighted sum of values."""
    scores = (q @ k.transpose(-2, -1)) * factor  # (B, H, T, S)
    if causal:
        mask = combine_masks(mask, causal_mask(q.size(-2), k.size(-2), device=q.device))
    weights = _row_weights(scores, mask, activation, straight_through)  # (B, H, T, S)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return AttentionOutput(weights @ v, weights)  # (B, H, T, Dv)


def _row_weights(scores, mask, activation="softmax", straight_through=False):
    """A = a(scores) row by row over the admissible keys; a row with none gets zero weights.

    scores (..., T, S), mask broadcastable to it or None -> weights (..., T, S).
    """
    if mask is not None:
        # A finite fill keeps fully masked rows finite in value and gradient; they are zeroed below.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if activation == "softmax":
        weights = scores.softmax(dim=-1)
    else:
        weights = hardmax(scores, straight_through)
    if mask is not None:
        weights = weights * mask.any(dim=-1, keepdim=True)  # fully masked rows -> 0
    return weights


def _one_query(q, k, v, mask, factor):
    """Eq. 9 for one query per row (a decode step), written as reductions instead of matmuls:

        s_j = <q, k_j> * factor,  a = softmax_j(s),  out = sum_j a_j v_j.

    Used only under ``torch.compile``, where these become a few fused loops over the cache in the
    generated code; the fused kernel would be an opaque call per layer and token (measured on the
    2-core CPU: see benchmarks/ANALYSIS.md, generation). q: (B, H, 1, Dk) -> (B, H, 1, Dv).
    """
    scores = (q * k).sum(dim=-1).unsqueeze(-2) * factor  # (B, H, 1, S)
    weights = _row_weights(scores, mask)  # (B, H, 1, S)
    out = (weights.transpose(-2, -1) * v).sum(dim=-2, keepdim=True)  # (B, H, 1, Dv)
    return AttentionOutput(out, None)


def _cpu_dropout(q: Tensor, dropout_p: float) -> bool:
    """PyTorch's CPU kernels have no fused attention dropout (they fall back to the math path and
    materialise the weights anyway); there the explicit path with attnlab's cheaper dropout mask
    is faster (measured: 29 vs 32 ms forward + backward at B 128, H 8, T 36)."""
    return dropout_p > 0.0 and q.device.type == "cpu" and not torch.compiler.is_compiling()


def _fused(q, k, v, mask, causal, factor, dropout_p):
    """The same function through PyTorch's fused kernel; weights are never materialised.

    ``causal`` only without a mask and with T == S (the caller folds every other case into mask).
    """
    if mask is None:
        return AttentionOutput(
            F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=causal, scale=factor
            ),
            None,
        )
    # Rows with no admissible key would be NaN in the kernel: let them attend everywhere, then
    # zero their output, so value and gradient stay finite (and match the explicit path).
    row_any = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
    all_rows_ok = bool(row_any.all())
    safe = mask if all_rows_ok else mask | ~row_any
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, dropout_p=dropout_p, scale=factor)
    if not all_rows_ok:
        out = out * row_any
    return AttentionOutput(out, None)  # (B, H, T, Dv)


def _scale_factor(scale: bool | float, dk: int) -> float:
    if scale is True:
        return 1.0 / math.sqrt(dk)
    if scale is False:
        return 1.0
    return float(scale)


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, L, D), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if q.size(-1) != k.size(-1):
        raise ValueError(
            f"query width d_q={q.size(-1)} must equal key width d_k={k.size(-1)} "
            "(the dot product q_i^T k_j needs equal lengths)"
        )
    if k.size(-2) != v.size(-2):
        raise ValueError(f"keys ({k.size(-2)}) and values ({v.size(-2)}) must have equal length S")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"q, k, v must agree on (B, H): got {tuple(q.shape[:2])}, {tuple(k.shape[:2])}, "
            f"{tuple(v.shape[:2])}"
        )
    if k.size(-2) == 0:
        raise ValueError("attention over an empty key sequence (S=0) is undefined")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
