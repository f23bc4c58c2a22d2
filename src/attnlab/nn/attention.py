"""Self-attention and scaled dot-product attention (001, 000, 004 eq. 9-12).

Shapes: B batch, H heads, T query length (N in 004), S key length (M in 004),
Dk = d_q = d_k per head, Dv = d_v per head.
Masks are bool, broadcastable to (B, H, T, S); True = may attend (see ``attnlab.nn.masks``).

:func:`scaled_dot_product_attention` is the one place 004 eq. 9 is written out; every attention
module of ``attnlab.nn`` (multi-head, cross, grouped-query, windowed, ALiBi, rotary) calls it.
It computes the equation one of two ways, with the same result:
  * the *explicit* form writes the equation out -- scores Q K^T, the scale, the bias, the mask,
    the row activation a, the weighted sum of values -- passing each value through its hook point
    and returning the weights A (for plots, for hard attention, whenever they are asked for or a
    hook point is active);
  * otherwise :func:`fused_attention`, beside it, calls PyTorch's fused kernel
    ``torch.nn.functional.scaled_dot_product_attention``, which never keeps the (T, S) matrix for
    backward (memory O(T) instead of O(T S)).
The row activation a is a small object (:class:`Softmax`, :class:`Hardmax`) called on the scores
and the mask; :func:`row_activation` maps a config's name to it.

Logit soft-capping (Gemma 2, Team Gemma 2024 §2.2; Grok-1), an option of the kernel: the logits
pass through cap(s) = c tanh(s / c) (:func:`soft_cap`) before the mask and the activation, so
every logit lies in (-c, c). PyTorch's fused kernel cannot cap, so a capped call always takes
the explicit form; ``hook_scaled`` then holds the capped logits (what the activation gets).

Deviations from the notes:
  * 004 writes A_ij = softmax(<q_i, k_1>, ..., <q_i, k_M>) / sqrt(d_q): the scale belongs *inside*
    the activation, a(Q K^T / sqrt(d_q)) as in its own eq. 9. We implement eq. 9.
  * A fully masked row (a query allowed to see no key) outputs zeros with zero weights instead of
    the NaN of -inf softmax or the uniform average of 003's ``masked_fill(mask == 0, -9e15)``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.nn.dropout import dropout
from attnlab.nn.grouped import repeat_kv
from attnlab.nn.hooks import HookPoint
from attnlab.nn.masks import broadcasts_to, causal_mask, check_mask, combine_masks


class AttentionOutput(NamedTuple):
    """Attended values and, on the explicit path, the attention matrix (rows sum to 1; a row with
    no admissible key is 0; while training, the weights after dropout; ``hook_A`` holds them
    before)."""

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


# --------------------------------------------------------------------------- row activations a


class RowActivation:
    """The row activation a of 004 eq. 9: A_i. = a(s_i1, ..., s_iS) over the admissible keys.

    ``activation(scores, mask)``: scores (..., T, S), mask broadcastable to them (True = may
    attend) or None -> weights (..., T, S); a row with no admissible key gets zero weights.
    ``fusable``: PyTorch's fused kernel computes this activation (then the weights need not exist).
    """

    name: str
    fusable = False

    def __call__(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        raise NotImplementedError


class Softmax(RowActivation):
    """Soft attention: A_ij = exp(s_ij) / sum_j' exp(s_ij') (000 'Notation'; 004 eq. 9)."""

    name, fusable = "softmax", True

    def __call__(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        return keep_admissible(masked_scores(scores, mask).softmax(dim=-1), mask)


class Hardmax(RowActivation):
    """Hard attention: A_i. = one-hot(argmax_j s_ij) (004), gradients by ``straight_through``
    (see :func:`hardmax`)."""

    name = "hardmax"

    def __init__(self, straight_through: bool = False):
        self.straight_through = straight_through

    def __call__(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        return keep_admissible(hardmax(masked_scores(scores, mask), self.straight_through), mask)


def row_activation(
    activation: str | RowActivation, straight_through: bool = False
) -> RowActivation:
    """The activation object for a config choice ("softmax" or "hardmax"); objects pass through."""
    if isinstance(activation, RowActivation):
        return activation
    if activation == "hardmax":
        return Hardmax(straight_through)
    if activation == "softmax":
        return Softmax()
    raise ValueError(f"activation must be 'softmax' or 'hardmax', got {activation!r}")


def masked_scores(scores: Tensor, mask: Tensor | None) -> Tensor:
    """Forbidden pairs get the lowest finite score: (..., T, S). A finite fill keeps fully masked
    rows finite in value and gradient; :func:`keep_admissible` zeroes them afterwards."""
    if mask is None:
        return scores
    return scores.masked_fill(~mask, torch.finfo(scores.dtype).min)


def keep_admissible(weights: Tensor, mask: Tensor | None) -> Tensor:
    """Rows with no admissible key -> zero weights: (..., T, S)."""
    if mask is None:
        return weights
    return weights * mask.any(dim=-1, keepdim=True)


# --------------------------------------------------------------------------- eq. 9


class AttentionPoints(Protocol):
    """The hook points eq. 9 passes its values through (``attnlab.nn.multihead.MultiHeadBase``
    owns them; ``attnlab.nn.hooks``): identity unless a hook reads or replaces the value."""

    hook_scores: HookPoint  # Q K^T, (B, H, T, S)
    hook_scaled: HookPoint  # the logits cap(Q K^T / sqrt(d_k) + bias), (B, H, T, S)
    hook_mask: HookPoint  # read-only: the applied mask, (B, H|1, T, S)
    hook_A: HookPoint  # the weights A, (B, H, T, S)
    hook_heads: HookPoint  # A V, (B, H, T, Dv)


class _Unhooked:
    """Points that are never hooked (a plain function call): every value passes unchanged."""

    hook_scores = hook_scaled = hook_mask = hook_A = hook_heads = HookPoint()


INNER_POINTS = ("hook_scores", "hook_scaled", "hook_mask", "hook_A", "hook_heads")


def soft_cap(x: Tensor, cap: float | None) -> Tensor:
    """Soft-capping (Gemma 2 §2.2): cap(x) = c tanh(x / c), elementwise, in (-c, c); slope 1 at
    0, so small logits pass almost unchanged. ``cap`` None returns x itself. x: any shape."""
    if cap is None:
        return x
    return torch.tanh(x / cap) * cap


def check_softcap(cap: float | None, name: str = "softcap") -> float | None:
    """A soft-cap c must be a finite number > 0 (or None: no cap); returns it as a float."""
    if cap is None:
        return None
    ok = isinstance(cap, (int, float)) and not isinstance(cap, bool)
    if not ok or not math.isfinite(cap) or cap <= 0:
        raise ValueError(
            f"{name}={cap!r} must be a finite number > 0 (logits are capped to (-c, c)) or None"
        )
    return float(cap)


def points_active(points: AttentionPoints) -> bool:
    """True while a hook reads or replaces a value only the explicit form computes."""
    return any(getattr(points, name).active for name in INNER_POINTS)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    scale: bool | float = True,
    activation: str | RowActivation = "softmax",
    straight_through: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    bias: Tensor | None = None,
    softcap: float | None = None,
    points: AttentionPoints | None = None,
) -> AttentionOutput:
    """Attention(Q, K, V; a) = a(cap(Q K^T / sqrt(d_q) + bias)) V   (004 eq. 9; Vaswani eq. 1).

    q: (B, H, T, Dk); k: (B, H, S, Dk); v: (B, H, S, Dv) -> out (B, H, T, Dv),
    (k and v may have H_kv heads, H a multiple of H_kv: grouped-query attention, query head h
    reading key/value head h // (H / H_kv); the fused kernel shares them without copying,
    the explicit form repeats them, ``attnlab.nn.grouped.repeat_kv``; keys and values held in
    a narrower float dtype than q, a bf16 KV cache under fp32 queries, are widened to q's)
    weights (B, H, T, S) on the explicit path, else None.

    mask: bool, broadcastable to (B, H, T, S), True = may attend. ``causal`` adds the future mask
    of 000 (aligned bottom-right when T < S, i.e. queries are the last T positions).
    scale: True divides by sqrt(d_q), False leaves the logits unscaled (for the scaling
    experiment), a float multiplies by that factor.
    activation: the row activation a, a :class:`RowActivation` or its name ("softmax"; "hardmax"
    with ``straight_through`` gradients or not).
    bias: a float logit bias broadcastable to (B, H, T, S) added after the scale (ALiBi's
    -m_h |i - j|, ``attnlab.nn.positional.ALiBiPositions``); None adds nothing.
    softcap: c > 0 soft-caps the logits, cap(s) = c tanh(s / c) (:func:`soft_cap`; Gemma 2),
    before the mask; None leaves them as they are.
    points: the hook points the explicit form passes its values through (a module's).

    The equation is written out -- its values at the hook points, the weights returned -- when
    the weights are wanted, the activation has no fused kernel, the logits are soft-capped (the
    fused kernel cannot cap), or one of the points is hooked; otherwise PyTorch's fused kernel
    computes it (:func:`fused_attention`).
    """
    activation = row_activation(activation, straight_through)
    points = points if points is not None else _Unhooked
    k, v = _check_qkv(q, k, v)
    b, h, t, dk = q.shape
    s = k.size(-2)
    if mask is not None:
        mask = check_mask(mask, b, h, t, s)  # (B|1, H|1, T|1, S)
    factor = scale_factor(scale, dk)
    softcap = check_softcap(softcap)
    check_options(bias, dropout_p, (b, h, t, s))
    explicit = need_weights or not activation.fusable or softcap is not None
    if not (explicit or points_active(points)):
        return AttentionOutput(
            fused_attention(q, k, v, mask, causal, factor, dropout_p, bias), None
        )
    k, v = repeat_kv(k, h), repeat_kv(v, h)  # (B, H, S, Dk|Dv): head h reads h // G
    scores = points.hook_scores(q @ k.transpose(-2, -1))  # (B, H, T, S)
    scaled = scores * factor  # (B, H, T, S)
    if bias is not None:
        scaled = scaled + bias  # the logits, ALiBi's distance penalty included
    scaled = points.hook_scaled(soft_cap(scaled, softcap))  # (B, H, T, S), in (-c, c) if capped
    # One place where the scores get their mask: the given one AND the future mask.
    mask = attention_mask(mask, causal, t, s, q.device)  # (.., T, S) or None
    if points.hook_mask.active:  # read-only: the applied mask, (B, H|1, T, S)
        points.hook_mask(applied_mask(mask, b, t, s, q.device))
    weights = dropout(points.hook_A(activation(scaled, mask)), dropout_p)  # (B, H, T, S)
    return AttentionOutput(points.hook_heads(weights @ v), weights)  # (B, H, T, Dv)


def attention_mask(mask: Tensor | None, causal: bool, t: int, s: int, device) -> Tensor | None:
    """The one mask the scores get: the given mask AND (when ``causal``) the future mask of 000,
    bottom-right aligned. A single query (a decode step) sits at the last position and sees every
    key, so it needs no future mask. -> (.., T, S) bool or None."""
    if not causal or t == 1:
        return mask
    return combine_masks(mask, causal_mask(t, s, device=device))


def applied_mask(mask: Tensor | None, b: int, t: int, s: int, device) -> Tensor:
    """The mask the scores got, as (B, H|1, T, S) bool (all True when there was none)."""
    if mask is None:
        mask = torch.ones(t, s, dtype=torch.bool, device=device)
    mask = mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B|1, H|1, T, S)
    return mask.expand(b, mask.size(1), t, s)


def fused_attention(q, k, v, mask, causal, factor, dropout_p, bias=None) -> Tensor:
    """Eq. 9 through PyTorch's fused kernel: (B, H, T, Dv); the weights are never materialised.

    Rows with no admissible key would be NaN in the kernel: they attend everywhere there and
    their output is zeroed, so value and gradient stay finite (and match the explicit form).
    A logit ``bias`` goes in as the kernel's float mask, -inf where the bool mask forbids.
    """
    t, s = q.size(-2), k.size(-2)
    if k.size(1) != q.size(1):  # grouped key/value heads: the kernel shares them (no copy)
        return _fused_grouped(
            q, k, v, attention_mask(mask, causal, t, s, q.device), factor, dropout_p, bias
        )
    if bias is not None:
        return _fused_with_bias(
            q, k, v, attention_mask(mask, causal, t, s, q.device), factor, dropout_p, bias
        )
    if causal and (mask is not None or t != s):  # the kernel's is_causal is top-left aligned
        mask, causal = attention_mask(mask, causal, t, s, q.device), False
    if mask is None:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=causal and t > 1, scale=factor
        )
    row_any = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
    if not torch.compiler.is_compiling() and bool(row_any.all()):  # (compiled: no host sync)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=factor
        )
    safe = mask | ~row_any
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, dropout_p=dropout_p, scale=factor)
    return out * row_any  # (B, H, T, Dv)


def _fused_with_bias(q, k, v, mask, factor, dropout_p, bias, enable_gqa=False) -> Tensor:
    """The fused kernel with an additive float mask: bias where allowed, -inf elsewhere."""
    bias = bias.to(q.dtype)
    opts = dict(dropout_p=dropout_p, scale=factor, enable_gqa=enable_gqa)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, **opts)
    row_any = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
    logits_bias = bias.masked_fill(~(mask | ~row_any), float("-inf"))  # (B|1, H, T, S)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=logits_bias, **opts)
    return out * row_any  # (B, H, T, Dv); rows with no admissible key -> 0


def _fused_grouped(q, k, v, mask, factor, dropout_p, bias) -> Tensor:
    """Grouped key/value heads (B, H_kv, S, .) through the kernel's ``enable_gqa``: each is read
    by its H / H_kv query heads in place, so a decode step reads the small cache once."""
    if bias is not None:
        return _fused_with_bias(q, k, v, mask, factor, dropout_p, bias, enable_gqa=True)
    opts = dict(dropout_p=dropout_p, scale=factor, enable_gqa=True)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, **opts)
    row_any = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~row_any, **opts)
    return out * row_any  # (B, H, T, Dv)


def scale_factor(scale: bool | float, dk: int) -> float:
    """The factor on Q K^T: 1/sqrt(d_k) (True), 1 (False) or the given finite number."""
    if scale is True:
        return 1.0 / math.sqrt(dk)
    if scale is False:
        return 1.0
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(
            f"scale={scale!r}: give True (divide by sqrt(d_k)), False (no scaling) or a finite "
            "number to multiply the logits by"
        )
    return float(scale)


def check_options(bias: Tensor | None, dropout_p: float, scores: tuple[int, ...]) -> None:
    """A logit bias must be a float tensor broadcasting to the scores (B, H, T, S); the
    dropout probability a number in [0, 1)."""
    ok = isinstance(dropout_p, (int, float)) and not isinstance(dropout_p, bool)
    if not ok or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p!r} must be a probability in [0, 1)")
    if bias is None:
        return
    if not isinstance(bias, Tensor) or not bias.is_floating_point():
        got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
        raise TypeError(f"bias must be a float tensor of logit offsets, got {got}")
    if not broadcasts_to(bias.shape, scores):
        raise ValueError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to the attention scores "
            f"(B, H, T, S) = {scores}"
        )


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Checks q, k, v; returns k, v in q's dtype."""
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
    grouped = k.size(1) > 0 and q.size(1) % k.size(1) == 0  # H_kv key/value heads, H = G H_kv
    if q.size(0) != k.size(0) or not grouped or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"q, k, v must agree on (B, H), except that q may have a multiple of k's heads "
            f"(grouped-query attention): got {tuple(q.shape[:2])}, {tuple(k.shape[:2])}, "
            f"{tuple(v.shape[:2])}"
        )
    if k.size(-2) == 0:
        raise ValueError("attention over an empty key sequence (S=0) is undefined")
    if k.dtype != v.dtype or (k.dtype != q.dtype and not _narrower(k.dtype, q.dtype)):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if k.dtype != q.dtype:  # a KV cache stored in a smaller dtype: compute in q's
        k, v = k.to(q.dtype), v.to(q.dtype)  # (B, H_kv, S, Dk|Dv)
    return k, v


def _narrower(small: torch.dtype, wide: torch.dtype) -> bool:
    return torch.finfo(small).bits < torch.finfo(wide).bits
