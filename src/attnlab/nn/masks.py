"""Attention masks: one convention everywhere.

A mask is a bool tensor broadcastable to (B, H, T, S); **True = the query may attend to the key**
(the convention of ``torch.nn.functional.scaled_dot_product_attention``). 004 writes it as
M in {0, 1}^{N x M} with M_ij = 0 forcing A_ij = 0; our ``True`` is its 1.

Shapes: B batch, H heads, T query length, S key length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(t: int, s: int | None = None, device: torch.device | None = None) -> Tensor:
    """Future mask of 000: alpha_ij = 0 for j > i. Returns (T, S) bool.

    When the queries are the *last* T of S positions (decoding with a KV cache, T < S) the mask is
    aligned bottom-right: query i sits at absolute position S - T + i and sees keys j <= S - T + i.
    """
    s = t if s is None else s
    if t < 0:
        raise ValueError(f"a causal mask needs T >= 0 queries, got T={t}")
    if s < t:
        raise ValueError(f"a causal mask needs at least as many keys as queries, got T={t} S={s}")
    rows = torch.arange(t, device=device).unsqueeze(1) + (s - t)  # (T, 1) absolute positions
    cols = torch.arange(s, device=device).unsqueeze(0)  # (1, S)
    return cols <= rows  # (T, S)


def sliding_window_mask(
    t: int, s: int | None = None, window: int = 1, device: torch.device | None = None
) -> Tensor:
    """Causal attention within a window of W keys (local attention; Child et al. 2019,
    Beltagy et al. 2020, Mistral): query i may attend to key j iff i - W < j <= i. (T, S) bool.

    Each query sees itself and the W - 1 tokens before it, so a layer mixes information over W
    positions and L layers over about L (W - 1) + 1. Aligned bottom-right like :func:`causal_mask`
    (the T queries are the last T of S positions). W >= S is the plain causal mask.
    """
    s = t if s is None else s
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"the attention window must be a positive int, got {window!r}")
    rows = torch.arange(t, device=device).unsqueeze(1) + (s - t)  # (T, 1) absolute positions
    cols = torch.arange(s, device=device).unsqueeze(0)  # (1, S)
    return causal_mask(t, s, device) & (cols > rows - window)  # (T, S)


def padding_mask(key_padding_mask: Tensor | None) -> Tensor | None:
    """Key padding mask (B, S) with True = real token -> attention mask (B, 1, 1, S); None (no
    padding) stays None."""
    if key_padding_mask is None:
        return None
    if key_padding_mask.dim() != 2:
        raise ValueError(
            f"key padding mask must be (B, S), got shape {tuple(key_padding_mask.shape)}"
        )
    return key_padding_mask[:, None, None, :]  # (B, 1, 1, S)


def is_right_padded(key_padding_mask: Tensor) -> bool:
    """True when every row of a (B, T) mask (True = real token) is real tokens followed only by
    padding: no real token comes after a padding position."""
    return not bool((key_padding_mask[:, 1:] & ~key_padding_mask[:, :-1]).any())


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of broadcastable bool masks; None entries mean "no constraint"."""
    out: Tensor | None = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True when a tensor of ``shape`` broadcasts to ``target`` without enlarging it (a mask of
    batch 2 against scores of batch 1 would silently double the output's batch)."""
    try:
        return torch.broadcast_shapes(shape, target) == torch.Size(target)
    except RuntimeError:
        return False


def check_mask(mask: Tensor, b: int, h: int, t: int, s: int) -> Tensor:
    """Validate a user mask against scores (B, H, T, S); return it as a 4-D bool tensor."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}; "
            "convert a {0,1} matrix with mask.bool()"
        )
    if mask.dim() > 4:
        raise ValueError(f"mask has {mask.dim()} dims; it must broadcast to (B, H, T, S)")
    if not broadcasts_to(mask.shape, (b, h, t, s)):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention scores "
            f"(B, H, T, S) = {(b, h, t, s)} (each of its sizes must be 1 or the scores' size)"
        )
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask
