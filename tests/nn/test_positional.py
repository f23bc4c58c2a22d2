"""Position representations (000, 003, 004 eq. 14-16; RoPE).

Sinusoids against the NumPy oracle and Vaswani's closed form, learned tables and their bound,
concatenation [x; PE] + projection, rotary against the oracle and its relative-position property,
and the identity. Shapes: B batch, H heads, T positions, D width, Dh head width.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab import reference as ref
from attnlab.nn import (
    ConcatPositions,
    LearnedPositions,
    NoPositions,
    RotaryPositions,
    SinusoidalPositions,
    sinusoidal_table,
)
from attnlab.nn.positional import (
    ALiBiPositions,
    PositionSizes,
    default_positions,
    make_positions,
)
from oracle_params import TOL64

TOL32 = {"rtol": 1e-6, "atol": 1e-6}


def _vaswani(n_positions: int, d: int) -> np.ndarray:
    """Vaswani et al. 3.5 closed form, vectorised: PE(pos, 2i) = sin(pos / 10000^(2i/d)), ..."""
    pos = np.arange(n_positions)[:, None]
    two_i = np.arange(0, d, 2)[None, :]
    angle = pos / np.power(10000.0, two_i / d)
    pe = np.zeros((n_positions, d))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe


# --------------------------------------------------------------------------- sinusoids


@pytest.mark.parametrize("d", [16, 7])
def test_sinusoidal_table_matches_reference_and_closed_form(d):
    expected = ref.sinusoidal_encoding(60, d)
    np.testing.assert_allclose(expected, _vaswani(60, d), **TOL64)  # the two oracles agree
    got = sinusoidal_table(torch.arange(60), d, dtype=torch.float64)
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), expected, **TOL64)
    got32 = sinusoidal_table(torch.arange(60), d)  # float32 by default
    assert got32.dtype == torch.float32
    np.testing.assert_allclose(got32.double().numpy(), expected, **TOL32)


def test_sinusoid_values_by_hand_and_003_corrected_example():
    pe = sinusoidal_table(torch.arange(2), 4)
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    # 003's worked example, corrected (docs/notes_errata.md E1): [sin 1, cos 1, sin .01, cos .01]
    expected = torch.tensor([math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)])
    torch.testing.assert_close(pe[1], expected)


def test_sinusoidal_positions_add_the_table_for_batched_positions():
    enc = SinusoidalPositions(8)
    x = torch.randn(2, 5, 8)
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]])  # (B, T), e.g. left padding
    out = enc(x, positions)
    table = torch.from_numpy(ref.sinusoidal_encoding(8, 8)).float()
    torch.testing.assert_close(out, x + table[positions], **TOL32)
    # defined far beyond any training length (no table)
    far = enc(x[:1, :1], torch.tensor([100_000]))
    assert torch.isfinite(far).all()


def test_sinusoidal_positions_float64_matches_reference():
    enc = SinusoidalPositions(16)
    x = torch.zeros(1, 40, 16, dtype=torch.float64)
    got = enc(x, torch.arange(40))[0].numpy()
    np.testing.assert_allclose(got, ref.sinusoidal_encoding(40, 16), **TOL64)


# --------------------------------------------------------------------------- learned


def test_learned_positions_add_table_rows_and_train():
    enc = LearnedPositions(10, 4)
    x = torch.randn(2, 6, 4, requires_grad=True)
    out = enc(x, torch.arange(6))
    torch.testing.assert_close(out, x + enc.table.weight[:6])
    out.sum().backward()
    assert torch.equal(enc.table.weight.grad[:6], torch.full((6, 4), 2.0))  # B rows each
    assert torch.equal(enc.table.weight.grad[6:], torch.zeros(4, 4))  # unused rows untouched


def test_learned_positions_raise_beyond_the_table():
    enc = LearnedPositions(5, 4)
    enc(torch.randn(1, 5, 4), torch.arange(5))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"position 5 is beyond the learned position table"):
        enc(torch.randn(1, 6, 4), torch.arange(6))
    with pytest.raises(ValueError, match="max_len=5"):
        enc(torch.randn(1, 1, 4), torch.tensor([7]))


# --------------------------------------------------------------------------- concatenation


def test_concat_positions_project_x_and_pe():
    """004 eq. 15: x~_i = W [x_i; PE(i)] + b with PE of width d_pos."""
    enc = ConcatPositions(6, d_pos=4).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    out = enc(x, torch.arange(5))
    assert out.shape == (2, 5, 6)
    pe = ref.sinusoidal_encoding(5, 4)  # (T, d_pos)
    W, b = enc.proj.weight.detach().numpy().T, enc.proj.bias.detach().numpy()
    for i in range(2):
        cat = np.concatenate([x[i].detach().numpy(), pe], axis=-1)  # (T, D + d_pos)
        np.testing.assert_allclose(out[i].detach().numpy(), cat @ W + b, **TOL64)
    out.sum().backward()
    assert x.grad.shape == x.shape and enc.proj.weight.grad.shape == (6, 10)
    # positions matter: the same token at two positions maps to different vectors
    same = x[:, :1].detach().expand(2, 5, 6)
    y = enc(same, torch.arange(5))
    assert not torch.allclose(y[:, 0], y[:, 1])


# --------------------------------------------------------------------------- rotary


def test_rotary_matches_reference_fp32():
    rot = RotaryPositions(8)
    x = torch.randn(2, 3, 5, 8)
    positions = torch.tensor([0, 1, 2, 7, 30])
    got = rot.rotate(x, positions).double().numpy()
    expected = ref.rotary(x.double().numpy(), positions.numpy())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_rotary_float64_matches_reference():
    rot = RotaryPositions(8).double()
    x = torch.randn(1, 2, 6, 8, dtype=torch.float64)
    positions = torch.arange(6) * 5
    np.testing.assert_allclose(
        rot.rotate(x, positions).numpy(), ref.rotary(x.numpy(), positions.numpy()), **TOL64
    )


def test_rotary_batched_positions_rotate_each_row_by_its_own_position():
    rot = RotaryPositions(4)
    x = torch.randn(2, 3, 4, 4)
    positions = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])  # (B, T)
    got = rot.rotate(x, positions)
    for b in range(2):
        torch.testing.assert_close(got[b : b + 1], rot.rotate(x[b : b + 1], positions[b]))


def test_rotary_table_is_reused_only_for_the_same_unchanged_positions():
    """Layers share one table per forward; new or in-place edited positions get a fresh one."""
    rot = RotaryPositions(8)
    x = torch.randn(1, 2, 4, 8)
    positions = torch.arange(4)
    first = rot.rotate(x, positions)
    assert rot.cos_sin(positions, x.dtype)[0] is rot._last[3]  # reused, not recomputed
    positions += 3  # the same tensor, edited in place
    np.testing.assert_allclose(
        rot.rotate(x, positions).numpy(),
        ref.rotary(x.double().numpy(), positions.numpy()),
        rtol=1e-5,
        atol=1e-5,
    )
    torch.testing.assert_close(rot.rotate(x, torch.arange(4)), first)  # another tensor, same values
    with torch.inference_mode():  # no version counter: never cached
        shifted = torch.arange(4) + 1
        rot.rotate(x, shifted)
        assert rot._last is None


def test_compiled_rotary_gathers_its_table_instead_of_computing_cos_sin():
    """Compiled, inductor would inline float64 cos/sin into the kernel rotating q and k and
    recompute them per element (issue 37): the traced graph must gather the table instead, with
    the eager values, in float64 and (B, T) positions too; a table too big is not kept."""
    graphs = []

    def record(gm, _inputs):  # a dynamo backend that keeps the traced graph and runs it as is
        graphs.append(gm)
        return gm.forward

    rot = RotaryPositions.build(PositionSizes(d_model=16, d_head=8, n_heads=2, max_len=32))
    x = torch.randn(2, 2, 6, 8, dtype=torch.float64)
    for positions in (torch.arange(6) + 20, torch.tensor([[0, 1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4]])):
        torch._dynamo.reset()
        graphs.clear()
        got = torch.compile(rot.rotate, backend=record, fullgraph=True)(x, positions)
        torch.testing.assert_close(got, rot.rotate(x, positions), rtol=0, atol=0)  # eager's values
        called = {n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"}
        assert not called & {torch.cos, torch.sin}, called
    assert rot._table is not None and rot._table[0].shape == (32, 4)
    wide = RotaryPositions(8, max_len=RotaryPositions.TABLE_ENTRIES // 4 + 1)
    assert wide._table is None  # compiled, it computes cos/sin as the eager path does


def test_rotary_scores_depend_only_on_relative_position():
    """<R_m q, R_n k> = <q, R_{n-m} k>: shifting both positions by c leaves every score fixed."""
    rot = RotaryPositions(16).double()
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 16, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        qm = rot.rotate(q, torch.tensor([m]))
        kn = rot.rotate(k, torch.tensor([n]))
        return float((qm * kn).sum())

    for m, n in [(0, 0), (3, 1), (2, 9), (40, 17)]:
        base = score(m, n)
        for c in (1, 11, 250):
            assert math.isclose(score(m + c, n + c), base, rel_tol=1e-9, abs_tol=1e-9)
    assert not math.isclose(score(0, 1), score(0, 2), abs_tol=1e-6)  # but distance matters
    # rotations preserve norms
    r = rot.rotate(q, torch.tensor([123]))
    torch.testing.assert_close(r.norm(), q.norm())


def test_rotary_leaves_embeddings_untouched_and_needs_even_width():
    rot = RotaryPositions(4)
    x = torch.randn(2, 3, 8)
    assert rot(x, torch.arange(3)) is x
    torch.testing.assert_close(rot.rotate(x[:, None, :, :4], torch.zeros(3)), x[:, None, :, :4])
    with pytest.raises(ValueError, match="even head width"):
        RotaryPositions(5)


# --------------------------------------------------------------------------- none, factory


def test_no_positions_is_identity_and_factory_builds_every_kind():
    x = torch.randn(2, 3, 8)
    assert NoPositions()(x, torch.arange(3)) is x
    kinds = {
        "learned": LearnedPositions,
        "sinusoidal": SinusoidalPositions,
        "concat": ConcatPositions,
        "rotary": RotaryPositions,
        "none": NoPositions,
        "alibi": ALiBiPositions,  # ALiBi acts on the attention logits, not on the embeddings
    }
    for kind, cls in kinds.items():
        module = make_positions(kind, 8, 4, 16, 10000.0, n_heads=2)
        assert isinstance(module, cls)
        assert module(x, default_positions(3)).shape == x.shape
    with pytest.raises(ValueError, match="unknown positional 'xpos'"):
        make_positions("xpos", 8, 4, 16, 10000.0)
    assert torch.equal(default_positions(3, offset=4), torch.tensor([4, 5, 6]))


def test_learned_positions_name_a_negative_position():
    enc = LearnedPositions(max_len=5, d_model=4)
    with pytest.raises(ValueError, match="positions must be >= 0, got -1"):
        enc(torch.randn(1, 2, 4), torch.tensor([0, -1]))
