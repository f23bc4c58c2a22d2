"""Packing (attnlab.nn.packing): real tokens only for position-wise layers, row groups for
attention, and models whose grouped forward equals the one-group layout in value and gradient.

Shapes: B batch, T length, N real tokens, D features.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig
from attnlab.models import build_model
from attnlab.nn.masks import padding_mask
from attnlab.nn.packing import (
    GROUP_ROWS,
    grouped_heads,
    length_groups,
    make_packing,
    pack,
    pack_group,
    packed_heads,
    row_major,
    unpack,
    unpack_group,
)

TOL64 = {"rtol": 1e-10, "atol": 1e-10}


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
    assert not packing.whole and packing.index.numel() == int(lengths.sum())
    order = torch.cat(groups)
    assert torch.equal(lengths[order], lengths.sort(stable=True).values)
    for g in packing.groups:
        assert g.length == int(lengths[g.rows].max())
    x = torch.randn(*mask.shape, 3)  # (B, T, D)
    packed = pack(x, packing)  # (N, D)
    assert torch.equal(unpack(packed, packing)[mask], x[mask])
    assert torch.equal(row_major(packed, packing), x[mask])
    for g in packing.groups:  # each group's layout holds its rows' tokens at positions 0..l-1
        layout = unpack_group(packed, g)  # (b, T_g, D)
        sub = mask[g.rows, : g.length]
        assert torch.equal(layout[sub], x[g.rows, : g.length][sub])
        assert torch.equal(layout[~sub], torch.zeros_like(layout[~sub]))
        assert torch.equal(pack_group(layout, g), packed[g.start : g.end])


def test_one_group_when_rows_are_few_left_padded_or_unpadded():
    small = _right_padded(torch.randint(1, 9, (GROUP_ROWS,)), 9)
    assert length_groups(small) is None
    left = _right_padded(torch.randint(1, 9, (GROUP_ROWS + 4,)), 9).flip(1)
    assert length_groups(left) is None
    right = left.flip(1)
    assert length_groups(right) is not None and length_groups(right, left) is None
    packing = make_packing(left)  # one group: every row in order, full length
    assert packing.whole and len(packing.groups) == 1 and packing.groups[0].length == 9
    assert make_packing(torch.ones(3, 4, dtype=torch.bool)) is None
    with pytest.raises(ValueError, match="right padding"):
        make_packing(left, length_groups(right))
    full = torch.ones(GROUP_ROWS + 4, 4, dtype=torch.bool)
    shared = make_packing(full, length_groups(full))
    assert shared is not None and len(shared.groups) == 2  # grouped even with no padding


def _batch(b: int, vocab: int, max_len: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (b,), generator=gen)
    ids = torch.randint(3, vocab, (b, int(lengths.max())), generator=gen)
    return ids, _right_padded(lengths)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("positional", ["learned", "rotary"])
def test_grouped_encoder_decoder_equals_one_group_in_value_and_gradient(positional):
    """need_weights=True keeps one group (the batch layout); the default groups rows."""
    torch.manual_seed(0)
    cfg = ModelConfig(kind="encoder_decoder", vocab_size=40, d_model=16, n_heads=2, n_layers=2,
                      d_ff=32, max_len=24, positional=positional)  # fmt: skip
    model = build_model(cfg).double()
    src, src_mask = _batch(2 * GROUP_ROWS + 7, 40, 20, seed=1)
    tgt, tgt_mask = _batch(2 * GROUP_ROWS + 7, 40, 15, seed=2)
    outs, grads = [], []
    for need_weights in (False, True):
        model.zero_grad()
        out = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=need_weights)
        logits = out.logits[tgt_mask]  # (N, V)
        (logits.sin().sum()).backward()  # position-dependent: a mix-up of rows would show
        outs.append(logits.detach())
        grads.append(_grads(model))
    torch.testing.assert_close(outs[0], outs[1], **TOL64)
    for name in grads[1]:
        torch.testing.assert_close(grads[0][name], grads[1][name], **TOL64)
    real_only = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask, real_only=True).logits
    torch.testing.assert_close(real_only, outs[1], **TOL64)  # the order of logits[tgt_mask]


def test_grouped_classifier_equals_one_group():
    torch.manual_seed(0)
    cfg = ModelConfig(kind="classifier", vocab_size=40, d_model=16, n_heads=2, n_layers=2,
                      n_classes=3, max_len=24, pooling="mean")  # fmt: skip
    model = build_model(cfg).double().eval()
    ids, mask = _batch(3 * GROUP_ROWS, 40, 20, seed=3)
    grouped = model(ids, key_padding_mask=mask).logits
    one_group = model(ids, key_padding_mask=mask, need_weights=True).logits
    torch.testing.assert_close(grouped, one_group, **TOL64)


def test_weights_with_row_groups_and_a_cache_with_packing_are_refused():
    from attnlab.nn.multihead import SelfAttention

    mask = _right_padded(torch.arange(1, GROUP_ROWS + 3))
    packing = make_packing(mask, length_groups(mask))
    attn = SelfAttention(8, 2)
    x = torch.randn(packing.index.numel(), 8)
    with pytest.raises(ValueError, match="one group"):
        attn(x, packing=packing, need_weights=True)
    from attnlab.nn.cache import KVCache

    with pytest.raises(ValueError, match="KV cache cannot be used with a packed batch"):
        attn(x, packing=packing, cache=KVCache(packing.batch, 2, 32, 4, 4))


def test_grouped_heads_put_each_token_head_at_its_row_and_position():
    """grouped_heads: packed (N, parts*H*D) -> per part and group (b, H, T_g, D), every real
    token's head h at [row, h, t]; packed_heads takes the real slots back in packed order."""
    torch.manual_seed(0)
    lengths = torch.randint(1, 12, (2 * GROUP_ROWS + 3,))
    mask = _right_padded(lengths)
    packing = make_packing(mask, length_groups(mask))
    n, parts, h, d = packing.index.numel(), 3, 2, 4
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


@pytest.mark.parametrize("d_v", [None, 3], ids=["d_v=d_head", "d_v!=d_head"])
def test_grouped_attention_modules_equal_the_padded_computation(d_v):
    """SelfAttention and CrossAttention on packed row groups give, at the real tokens, what they
    give on the padded batch (value and input gradient, float64)."""
    from attnlab.nn.multihead import CrossAttention, SelfAttention

    torch.manual_seed(0)
    b, d = 2 * GROUP_ROWS + 5, 8
    tgt_mask = _right_padded(torch.randint(1, 10, (b,)))
    src_mask = _right_padded(torch.randint(1, 13, (b,)))
    groups = length_groups(tgt_mask, src_mask)
    packing, memory_packing = make_packing(tgt_mask, groups), make_packing(src_mask, groups)
    x = torch.randn(b, tgt_mask.size(1), d, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(b, src_mask.size(1), d, dtype=torch.float64, requires_grad=True)
    self_attn = SelfAttention(d, 2, d_v=d_v).double()
    cross = CrossAttention(d, 2, d_v=d_v).double()
    key_mask = padding_mask(tgt_mask)  # (B, 1, 1, T)

    def both(packed: bool):
        if packed:
            y = self_attn(pack(x, packing), key_mask, causal=True, packing=packing).out
            z = cross(y, pack(memory, memory_packing), padding_mask(src_mask), packing=packing,
                      memory_packing=memory_packing).out  # (N, D)  # fmt: skip
            return row_major(z, packing)
        y = self_attn(x, key_mask, causal=True).out
        return cross(y, memory, padding_mask(src_mask)).out[tgt_mask]  # (N, D)

    grads = []
    for packed in (True, False):
        out = both(packed)
        gx, gm = torch.autograd.grad(out.sin().sum(), (x, memory))
        grads.append((out.detach(), gx[tgt_mask], gm[src_mask]))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **TOL64)
