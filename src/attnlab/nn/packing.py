"""Packing: run position-wise layers on real tokens only, skipping padding.

Everything in a Transformer except attention acts on each position independently (projections,
the feed-forward net, norms, residual adds). On a padded batch those layers would spend their
FLOPs on padding; packing gathers the N real tokens of a (B, T) batch into one (N, D) matrix for
them, and attention scatters back to (B, T, .) only where it needs the sequence layout. The result
is identical at real positions (tested); outputs at padding positions are defined as zero.

Shapes: B batch, T length, N real tokens, D features.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class Packing(NamedTuple):
    """Where the real tokens of a (B, T) batch live: flat indices b * T + t, (N,) int64."""

    index: Tensor
    batch: int
    length: int


def make_packing(key_padding_mask: Tensor | None) -> Packing | None:
    """A Packing for a (B, T) mask (True = real token), or None when nothing is padding."""
    if key_padding_mask is None or bool(key_padding_mask.all()):
        return None
    b, t = key_padding_mask.shape
    index = key_padding_mask.reshape(-1).nonzero().squeeze(1)  # (N,)
    return Packing(index, b, t)


def pack(x: Tensor, packing: Packing) -> Tensor:
    """(B, T, D) -> (N, D): the rows of real tokens."""
    return x.reshape(packing.batch * packing.length, x.size(-1)).index_select(0, packing.index)


def unpack(x: Tensor, packing: Packing) -> Tensor:
    """(N, D) -> (B, T, D), zeros at padding positions."""
    out = x.new_zeros(packing.batch * packing.length, x.size(-1))
    out = out.index_copy(0, packing.index, x)
    return out.view(packing.batch, packing.length, x.size(-1))
