"""Packing (attnlab.fast.packing): real tokens only for position-wise layers, row groups for
attention, and models whose grouped forward equals the one-group layout in value and gradient.

Shapes: B batch, T length, N real tokens, D features.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.fast.packing import (
    GROUP_ROWS,
    grouped_heads,
    length_groups,
    make_packing,
    pack,
    packed_heads,
    row_major,
    unpack,
)


def _right_padded(lengths: torch.Tensor, t: int | None = None) -> torch.Tensor:
    t = int(lengths.max()) if t is None else t
    return torch.arange(t)[None, :] < lengths[:, None]  # (B, T) True = real


def test_groups_sort_rows_by_length_and_pad_each_to_its_longest():
    torch.manual_seed(0)
    lengths = torch.randint(1, 30, (3 * GROUP_ROWS + 5,))
    mask = _right_padded(lengths)
    groups = length_groups(mask)
    assert [g.numel() for g in groups] == [GROUP_ROWS] * 3 + [5]
    packing = make_packing(mask, groups)
    assert packing.flat_index.numel() == int(lengths.sum())
    order = torch.cat(groups)
    assert torch.equal(lengths[order], lengths.sort(stable=True).values)
    for g in packing.groups:
        assert g.length == int(lengths[g.rows].max())
    x = torch.randn(*mask.shape, 3)  # (B, T, D)
    packed = pack(x, packing)  # (N, D)
    assert torch.equal(unpack(packed, packing)[mask], x[mask])
    assert torch.equal(row_major(packed, packing), x[mask])


def test_no_groups_when_rows_are_few_or_left_padded():
    small = _right_padded(torch.randint(1, 9, (GROUP_ROWS,)), 9)
    assert length_groups(small) is None
    left = _right_padded(torch.randint(1, 9, (GROUP_ROWS + 4,)), 9).flip(1)
    assert length_groups(left) is None
    right = left.flip(1)
    assert length_groups(right) is not None and length_groups(right, left) is None
    with pytest.raises(ValueError, match="right padding"):
        make_packing(left, length_groups(right))
    full = torch.ones(GROUP_ROWS + 4, 4, dtype=torch.bool)
    shared = make_packing(full, length_groups(full))
    assert len(shared.groups) == 2  # grouped even with no padding


def test_grouped_heads_put_each_token_head_at_its_row_and_position():
    """grouped_heads: packed (N, parts*H*D) -> per part and group (b, H, T_g, D), every real
    token's head h at [row, h, t]; packed_heads takes the real slots back in packed order."""
    torch.manual_seed(0)
    lengths = torch.randint(1, 12, (2 * GROUP_ROWS + 3,))
    mask = _right_padded(lengths)
    packing = make_packing(mask, length_groups(mask))
    n, parts, h, d = packing.flat_index.numel(), 3, 2, 4
    x = torch.randn(n, parts * h * d)
    per_part = grouped_heads(x, packing, parts, h)
    assert len(per_part) == parts and all(len(p) == len(packing.groups) for p in per_part)
    for part, blocks in enumerate(per_part):
        want_part = x.view(n, parts, h, d)[:, part]  # (N, H, D)
        for g, block in zip(packing.groups, blocks):
            assert block.shape == (g.rows.numel(), h, g.length, d) and block.is_contiguous()
            real = mask[g.rows, : g.length]  # (b, T_g)
            got = block.permute(0, 2, 1, 3)[real]  # (n_g, H, D) in the group's token order
            torch.testing.assert_close(got, want_part[g.start : g.end], rtol=0, atol=0)
            assert torch.isfinite(block).all()  # padding slots hold finite values
        back = packed_heads(blocks, packing)  # (N, H*D)
        torch.testing.assert_close(back, want_part.reshape(n, h * d), rtol=0, atol=0)
