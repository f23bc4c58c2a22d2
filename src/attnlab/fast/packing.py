"""Packing: run position-wise layers on real tokens only, and attention on groups of similar rows.

Everything in a Transformer except attention acts on each position independently (projections,
the feed-forward net, norms, residual adds). On a padded batch those layers would spend their
FLOPs on padding; packing gathers the N real tokens of a (B, T) batch into one (N, D) matrix for
them. Attention needs the sequence layout, so it scatters the tokens back to (rows, length, .),
one *group* of rows at a time: with right padding the rows are sorted by length and cut into
groups of ``GROUP_ROWS``, each padded only to its own longest row. Attention costs O(T^2) per
row, so on a batch of sentences whose lengths vary (Multi30k-like: median 14, longest ~30-40)
the padded layout does ~3x the necessary attention work and the grouped one ~1.4x (timings in
benchmarks/ANALYSIS.md, "Fast paths"). Results at real positions are identical (tested); outputs at
padding positions are defined as zero.

Inside a group, row j holds its tokens at positions 0..l_j-1, the same positions as in the
original right-padded batch, so masks and positions are sliced, not re-derived. Batches that
cannot be grouped (left padding, at most ``GROUP_ROWS`` rows) are not packed: the fast models
run them through the plain forward.

Shapes: B batch, T length, N real tokens, D features; per group b rows and length T_g.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnlab.nn.masks import is_right_padded

# Rows per attention group: fewer groups pad more, more groups cost more calls (benchmarks/
# ANALYSIS.md, "Fast paths").
GROUP_ROWS = 16


class Group(NamedTuple):
    """Rows that attention processes together, and where their tokens are."""

    start: int  # the group's tokens are packed rows [start, end)
    end: int
    rows: Tensor  # (b,) int64, the group's rows in the (B, T) batch
    length: int  # T_g: the group's rows are padded to this length
    flat_index: Tensor  # (end - start,) flat positions j * T_g + t in the group's (b, T_g) layout


class Packing(NamedTuple):
    """Where the real tokens of a (B, T) batch live, in packed order (group by group)."""

    flat_index: Tensor  # (N,) int64, flat positions b * T + t
    batch: int
    length: int
    groups: tuple[Group, ...]


def length_groups(key_padding_mask: Tensor, *others: Tensor | None) -> list[Tensor] | None:
    """Rows sorted by length (of the first mask) in chunks of GROUP_ROWS, or None for one group.

    Grouping needs right padding (real tokens first) in every given (B, T) mask, True = real.
    """
    masks = [m for m in (key_padding_mask, *others) if m is not None]
    b = key_padding_mask.size(0)
    if b <= GROUP_ROWS or not all(is_right_padded(m) for m in masks):
        return None
    order = key_padding_mask.sum(dim=1).argsort(stable=True)  # (B,) shortest first
    return list(order.split(GROUP_ROWS))


def make_packing(key_padding_mask: Tensor, row_groups: list[Tensor]) -> Packing:
    """A Packing of a right-padded (B, T) mask (True = real token) into ``row_groups`` (from
    :func:`length_groups`): one group per entry, even when nothing is padding, so that a source
    and a target packing share their groups."""
    if not is_right_padded(key_padding_mask):
        raise ValueError("row groups need right padding: every row's real tokens first")
    b, t = key_padding_mask.shape
    lengths = key_padding_mask.sum(dim=1)  # (B,)
    groups, flat, start = [], [], 0
    for rows in row_groups:
        length = max(int(lengths[rows].max()), 1)
        real = key_padding_mask[rows, :length]  # (b, T_g)
        local = real.reshape(-1).nonzero().squeeze(1)  # (n_g,) j * T_g + t
        flat.append(rows[local // length] * t + local % length)  # (n_g,) b * T + t
        groups.append(Group(start, start + local.numel(), rows, length, local))
        start += local.numel()
    return Packing(torch.cat(flat), b, t, tuple(groups))


def pack(x: Tensor, packing: Packing) -> Tensor:
    """(B, T, D) -> (N, D): the rows of real tokens, in packed order."""
    return x.reshape(packing.batch * packing.length, x.size(-1)).index_select(0, packing.flat_index)


def unpack(x: Tensor, packing: Packing) -> Tensor:
    """(N, D) -> (B, T, D), zeros at padding positions."""
    out = x.new_zeros(packing.batch * packing.length, x.size(-1))
    out = out.index_copy(0, packing.flat_index, x)
    return out.view(packing.batch, packing.length, x.size(-1))


def row_major(x: Tensor, packing: Packing) -> Tensor:
    """Packed (N, D) -> the same rows in the batch's row-major order, as ``x_padded[mask]``."""
    return x.index_select(0, packing.flat_index.argsort())


def grouped_heads(x: Tensor, packing: Packing, parts: int, n_heads: int) -> list[list[Tensor]]:
    """Packed (N, parts * H * D), e.g. [Q | K | V] -> for each part, each group's (b, H, T_g, D).

    One ``index_select`` for every part and group (and one scatter-add in backward): row
    (i, part, h) of the (N * parts * H, D) view of x goes to slot (j, h, t) of its group's block,
    which is already the head-major layout the attention products want (no per-head copies).
    Slots beyond a row's length hold a copy of the group's first token instead of zeros: they are
    padding keys (masked: weight exactly 0, so a finite value contributes nothing, in value or
    gradient) and padding queries (whose outputs :func:`packed_heads` drops).
    """
    n, width = x.shape
    d = width // (parts * n_heads)
    heads = torch.arange(n_heads, device=x.device)
    rows, shapes = [], []
    for g in packing.groups:  # row of part 0 for every slot (j, h, t): (i * parts * H + h)
        b = g.rows.numel()
        token = torch.full((b * g.length,), g.start, dtype=torch.long, device=x.device)
        token[g.flat_index] = torch.arange(g.start, g.end, device=x.device)  # (b T_g,) packed row
        slots = token.view(b, 1, g.length) * (parts * n_heads) + heads.view(1, -1, 1)
        rows.append(slots.reshape(-1))  # (b H T_g,)
        shapes.append((b, n_heads, g.length, d))
    first = torch.cat(rows)  # (M,) every group's slots, part 0
    offsets = torch.arange(parts, device=x.device) * n_heads  # part p: rows shifted by p * H
    index = (offsets[:, None] + first[None, :]).reshape(-1)  # (parts M,) part-major
    blocks = x.reshape(n * parts * n_heads, d).index_select(0, index)
    sizes = [r.numel() for r in rows] * parts
    out = [blk.view(shape) for blk, shape in zip(blocks.split(sizes), shapes * parts)]
    k = len(packing.groups)
    return [out[part * k : (part + 1) * k] for part in range(parts)]


def packed_heads(per_group: list[Tensor], packing: Packing) -> Tensor:
    """Each group's attention output (b, H, T_g, D) -> packed (N, H * D), real tokens only."""
    rows = []
    for out, g in zip(per_group, packing.groups):
        _, h, t, d = out.shape
        j, col = g.flat_index // t, g.flat_index % t  # (n_g,) each token's row and position
        heads = torch.arange(h, device=out.device)
        index = ((j[:, None] * h + heads) * t + col[:, None]).reshape(-1)  # (n_g H,)
        rows.append(out.reshape(-1, d).index_select(0, index))  # (n_g H, D), token-major
    return torch.cat(rows).view(packing.flat_index.numel(), -1)


def group_mask(mask: Tensor | None, group: Group, key_group: Group) -> Tensor | None:
    """A (B|1, H|1, T|1, S) attention mask cut to the group: its rows, T_g queries, S_g keys."""
    if mask is None:
        return mask
    if mask.size(0) > 1:
        mask = mask.index_select(0, group.rows)
    if mask.size(-2) > 1:
        mask = mask[..., : group.length, :]
    return mask[..., : key_group.length]


def group_positions(positions: Tensor, group: Group) -> Tensor:
    """Positions (T,) or (B, T) cut to the group's rows and T_g columns."""
    if positions.dim() == 2:
        positions = positions.index_select(0, group.rows)
    return positions[..., : group.length]
