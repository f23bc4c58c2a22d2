"""Tests of the NumPy oracle ``attnlab.reference`` itself.

The oracle is checked three independent ways: (a) hand-computed tiny cases, (b) invariants the
notes state (rows sum to 1, permutation equivariance, causality, LayerNorm statistics, sinusoid
rotations, 000's two-layer collapse), and (c) parity with torch's own modules in float64
(torch is imported here only; reference.py is NumPy only).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import reference as ref

FAST = settings(max_examples=25, deadline=None)
TOL = {"rtol": 1e-10, "atol": 1e-10}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


# --------------------------------------------------------------------------- softmax / hardmax


@FAST
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 10_000))
def test_softmax_rows_sum_to_one_and_match_closed_form(rows, cols, seed):
    a = _rng(seed).normal(size=(rows, cols)) * 5
    p = ref.softmax(a)
    np.testing.assert_allclose(p.sum(axis=-1), np.ones(rows), **TOL)
    e = np.exp(a)
    np.testing.assert_allclose(p, e / e.sum(axis=-1, keepdims=True), **TOL)
    assert np.all(p > 0)


def test_softmax_is_stable_and_handles_minus_inf():
    p = ref.softmax(np.array([1000.0, 1001.0]))
    np.testing.assert_allclose(p, [1 / (1 + math.e), math.e / (1 + math.e)], **TOL)
    p = ref.softmax(np.array([[0.0, -np.inf, 0.0], [-np.inf, -np.inf, -np.inf]]))
    np.testing.assert_array_equal(p, [[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]])


def test_softmax_over_last_axis_of_3d_tensor():
    b = _rng().normal(size=(2, 3, 4))
    np.testing.assert_allclose(ref.softmax(b), _np(torch.from_numpy(b).softmax(-1)), **TOL)


def test_hardmax_is_one_hot_of_first_maximum():
    a = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [-1.0, -5.0, -2.0], [-np.inf] * 3])
    expected = [[0, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]]
    np.testing.assert_array_equal(ref.hardmax(a), expected)


@FAST
@given(st.integers(1, 5), st.integers(0, 10_000))
def test_hardmax_matches_argmax_on_integer_ties(cols, seed):
    a = _rng(seed).integers(0, 3, size=(4, cols)).astype(float)  # many ties
    h = ref.hardmax(a)
    np.testing.assert_array_equal(h.sum(-1), np.ones(4))
    np.testing.assert_array_equal(h.argmax(-1), a.argmax(-1))  # numpy also returns the first


# --------------------------------------------------------------------------- basic self-attention


def test_basic_self_attention_by_hand():
    X = np.array([[1.0, 0.0], [0.0, 2.0]])
    # w' = X X^T = [[1, 0], [0, 4]]; softmax rows; Y = W X
    w0 = np.array([math.e, 1.0]) / (math.e + 1.0)
    w1 = np.array([1.0, math.e**4]) / (1.0 + math.e**4)
    expected = np.array([w0[0] * X[0] + w0[1] * X[1], w1[0] * X[0] + w1[1] * X[1]])
    np.testing.assert_allclose(ref.basic_self_attention(X), expected, **TOL)


@FAST
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 10_000))
def test_basic_self_attention_is_permutation_equivariant(t, k, seed):
    rng = _rng(seed)
    X = rng.normal(size=(t, k))
    P = np.eye(t)[rng.permutation(t)]
    np.testing.assert_allclose(
        ref.basic_self_attention(P @ X), P @ ref.basic_self_attention(X), **TOL
    )
    # 001's basic self-attention is attention with Q = K = V = X and no scaling.
    np.testing.assert_allclose(
        ref.basic_self_attention(X), ref.attention(X, X, X, scale=False).out, **TOL
    )


# --------------------------------------------------------------------------- attention


def test_attention_two_by_two_by_hand():
    Q = np.array([[1.0, 0.0], [0.0, 1.0]])
    K = np.array([[1.0, 0.0], [1.0, 1.0]])
    V = np.array([[1.0, 2.0], [3.0, 4.0]])
    # scores / sqrt(2): row 0 [1, 1] / sqrt 2 -> uniform; row 1 [0, 1] / sqrt 2
    s = 1.0 / math.sqrt(2.0)
    a10, a11 = 1.0 / (1.0 + math.exp(s)), math.exp(s) / (1.0 + math.exp(s))
    weights = np.array([[0.5, 0.5], [a10, a11]])
    out = np.array([[2.0, 3.0], [a10 * 1 + a11 * 3, a10 * 2 + a11 * 4]])
    got = ref.attention(Q, K, V)
    np.testing.assert_allclose(got.weights, weights, **TOL)
    np.testing.assert_allclose(got.out, out, **TOL)


def test_attention_scale_sits_inside_the_softmax():
    rng = _rng(1)
    Q, K, V = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    w = ref.attention(Q, K, V).weights
    np.testing.assert_allclose(w, ref.softmax(Q @ K.T / 2.0), **TOL)  # sqrt(d_q) = 2
    np.testing.assert_allclose(w.sum(-1), np.ones(3), **TOL)  # 004's prose form would sum to 1/2
    np.testing.assert_allclose(
        ref.attention(Q, K, V, scale=False).weights, ref.softmax(Q @ K.T), **TOL
    )
    np.testing.assert_allclose(
        ref.attention(Q, K, V, scale=0.3).weights, ref.softmax(0.3 * Q @ K.T), **TOL
    )


@FAST
@given(
    st.integers(1, 5),
    st.integers(1, 5),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(0, 10_000),
)
def test_attention_matches_torch_sdpa(n, m, d_q, d_v, seed):
    rng = _rng(seed)
    Q, K, V = rng.normal(size=(n, d_q)), rng.normal(size=(m, d_q)), rng.normal(size=(m, d_v))
    mask = rng.random((n, m)) < 0.7
    mask[:, 0] = True  # torch gives NaN on fully masked rows; those are tested separately
    expected = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (Q, K, V)), attn_mask=torch.from_numpy(mask)
    )
    got = ref.attention(Q, K, V, mask=mask)
    np.testing.assert_allclose(got.out, _np(expected), **TOL)
    assert np.all(got.weights[~mask] == 0.0)


def test_masked_weights_are_zero_and_rows_renormalise():
    rng = _rng(2)
    Q, K, V = rng.normal(size=(2, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    mask = np.array([True, False, True, False])  # (M,) key mask broadcasts over queries
    w = ref.attention(Q, K, V, mask=mask).weights
    np.testing.assert_array_equal(w[:, [1, 3]], 0.0)
    np.testing.assert_allclose(w.sum(-1), [1.0, 1.0], **TOL)
    sub = ref.attention(Q, K[[0, 2]], V[[0, 2]])  # same as dropping the masked keys
    np.testing.assert_allclose(w[:, [0, 2]], sub.weights, **TOL)


def test_fully_masked_row_gives_zero_output_and_weights():
    rng = _rng(3)
    Q, K, V = rng.normal(size=(2, 3)), rng.normal(size=(3, 3)), rng.normal(size=(3, 2))
    mask = np.array([[False, False, False], [True, True, False]])
    for activation in ("softmax", "hardmax"):
        out, w = ref.attention(Q, K, V, mask=mask, activation=activation)
        np.testing.assert_array_equal(out[0], 0.0)
        np.testing.assert_array_equal(w[0], 0.0)
        np.testing.assert_allclose(w[1].sum(), 1.0, **TOL)


def test_causal_mask_zeros_future_weights_and_blocks_future_values():
    rng = _rng(4)
    n = 5
    X = rng.normal(size=(n, 3))
    out, w = ref.attention(X, X, X, mask=ref.causal_mask(n))
    assert np.all(np.triu(w, k=1) == 0.0)
    X2 = X.copy()
    X2[3:] += 10.0  # change only the future of positions 0..2
    out2, _ = ref.attention(X2, X2, X2, mask=ref.causal_mask(n))
    np.testing.assert_allclose(out2[:3], out[:3], **TOL)
    assert not np.allclose(out2[3:], out[3:])


@FAST
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 10_000))
def test_self_attention_permutation_equivariance_eq14(n, d, seed):
    """004 eq. 14: Attention(PQ, PK, PV) = P Attention(Q, K, V) when Q, K, V come from one X."""
    rng = _rng(seed)
    Q, K, V = rng.normal(size=(n, d)), rng.normal(size=(n, d)), rng.normal(size=(n, 2))
    P = np.eye(n)[rng.permutation(n)]
    base = ref.attention(Q, K, V)
    perm = ref.attention(P @ Q, P @ K, P @ V)
    np.testing.assert_allclose(perm.out, P @ base.out, **TOL)
    np.testing.assert_allclose(perm.weights, P @ base.weights @ P.T, **TOL)
    # eq. 14 itself (queries only) and invariance to re-ordering the key/value pairs
    np.testing.assert_allclose(ref.attention(P @ Q, K, V).out, P @ base.out, **TOL)
    np.testing.assert_allclose(ref.attention(Q, P @ K, P @ V).out, base.out, **TOL)


def test_hard_attention_returns_best_matching_value():
    Q = np.array([[1.0, 0.0], [0.0, 1.0]])
    K = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 1.0]])  # query 1 ties keys 1 and 2
    V = np.array([[10.0], [20.0], [30.0]])
    out, w = ref.attention(Q, K, V, activation="hardmax")
    np.testing.assert_array_equal(w, [[1, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(out, [[10.0], [20.0]])


def test_attention_rejects_bad_input():
    with pytest.raises(ValueError, match="d_q"):
        ref.attention(np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 1)))
    with pytest.raises(TypeError, match="bool"):
        ref.attention(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 1)), mask=np.ones((2, 2)))
    with pytest.raises(ValueError, match="activation"):
        ref.attention(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 1)), activation="max")


# --------------------------------------------------------------------------- multi-head


def _mha_params(mha: torch.nn.MultiheadAttention) -> dict:
    """Per-head reference weights from torch's fused (3D, D) in_proj (row-vector convention)."""
    D, H = mha.embed_dim, mha.num_heads
    W = _np(mha.in_proj_weight).T  # (D, 3D): columns [Q | K | V]
    b = _np(mha.in_proj_bias)
    return {
        "Wq": ref.split_heads_weights(W[:, :D], H),
        "Wk": ref.split_heads_weights(W[:, D : 2 * D], H),
        "Wv": ref.split_heads_weights(W[:, 2 * D :], H),
        "bq": ref.split_heads_weights(b[:D], H),
        "bk": ref.split_heads_weights(b[D : 2 * D], H),
        "bv": ref.split_heads_weights(b[2 * D :], H),
        "Wo": _np(mha.out_proj.weight).T,
        "bo": _np(mha.out_proj.bias),
    }


@pytest.mark.parametrize("n_heads", [1, 2, 4])
def test_multi_head_attention_matches_torch(n_heads):
    torch.manual_seed(n_heads)
    D, N, M = 8, 4, 5
    mha = torch.nn.MultiheadAttention(D, n_heads, batch_first=True, dtype=torch.float64).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    x, mem = torch.randn(1, N, D, dtype=torch.float64), torch.randn(1, M, D, dtype=torch.float64)
    mask = np.ones((N, M), dtype=bool)
    mask[0, 2:] = False
    mask[2, 1] = False
    out, w = mha(
        x,
        mem,
        mem,
        attn_mask=torch.from_numpy(~mask),
        need_weights=True,
        average_attn_weights=False,
    )
    got = ref.multi_head_attention(_np(x[0]), _np(mem[0]), **_mha_params(mha), mask=mask)
    np.testing.assert_allclose(got.out, _np(out[0]), **TOL)
    np.testing.assert_allclose(got.weights, _np(w[0]), **TOL)
    # self-attention: memory=None
    out, _ = mha(x, x, x, need_weights=False)
    got = ref.multi_head_attention(_np(x[0]), None, **_mha_params(mha))
    np.testing.assert_allclose(got.out, _np(out[0]), **TOL)


def test_one_head_equals_single_head_attention():
    rng = _rng(5)
    x, D = rng.normal(size=(4, 6)), 6
    Wq, Wk, Wv = (rng.normal(size=(D, 3)) for _ in range(3))
    got = ref.multi_head_attention(x, None, [Wq], [Wk], [Wv], None)
    expected = ref.attention(x @ Wq, x @ Wk, x @ Wv)
    np.testing.assert_allclose(got.out, expected.out, **TOL)
    np.testing.assert_allclose(got.weights[0], expected.weights, **TOL)


def test_heads_without_output_projection_concatenate_and_scale_per_head():
    rng = _rng(6)
    x, mem = rng.normal(size=(3, 8)), rng.normal(size=(5, 8))
    Wq, Wk, Wv = ([rng.normal(size=(8, 4)) for _ in range(2)] for _ in range(3))
    out, w = ref.multi_head_attention(x, mem, Wq, Wk, Wv)
    assert out.shape == (3, 8) and w.shape == (2, 3, 5)
    for l in range(2):
        head = ref.attention(x @ Wq[l], mem @ Wk[l], mem @ Wv[l])  # scaled by sqrt(d_head) = 2
        np.testing.assert_allclose(out[:, 4 * l : 4 * (l + 1)], head.out, **TOL)


def test_per_head_mask():
    rng = _rng(7)
    x = rng.normal(size=(3, 4))
    W = [rng.normal(size=(4, 2)) for _ in range(2)]
    mask = np.stack([ref.causal_mask(3), np.ones((3, 3), dtype=bool)])
    _, w = ref.multi_head_attention(x, None, W, W, W, mask=mask)
    assert np.all(np.triu(w[0], k=1) == 0) and np.all(w[1] > 0)


def test_split_heads_weights_round_trip():
    W = np.arange(24.0).reshape(2, 12)
    blocks = ref.split_heads_weights(W, 3)
    assert [b.shape for b in blocks] == [(2, 4)] * 3
    np.testing.assert_array_equal(np.concatenate(blocks, axis=1), W)
    np.testing.assert_array_equal(ref.split_heads_weights(np.arange(6.0), 3)[1], [2.0, 3.0])
    with pytest.raises(ValueError, match="divisible"):
        ref.split_heads_weights(W, 5)


# --------------------------------------------------------------------------- masks


def test_causal_mask():
    np.testing.assert_array_equal(ref.causal_mask(4), np.tril(np.ones((4, 4), dtype=bool)))
    np.testing.assert_array_equal(ref.causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError):
        ref.causal_mask(3, 2)


def test_padding_mask():
    np.testing.assert_array_equal(ref.padding_mask([2, 0, 3], 3), [[1, 1, 0], [0, 0, 0], [1, 1, 1]])
    np.testing.assert_array_equal(ref.padding_mask(1, 3), [True, False, False])
    given_mask = np.array([[True, False]])
    np.testing.assert_array_equal(ref.padding_mask(given_mask, 2), given_mask)
    with pytest.raises(ValueError):
        ref.padding_mask([4], 3)
    # combined with a causal mask for one sequence
    m = ref.causal_mask(3) & ref.padding_mask([2], 3)[0]
    np.testing.assert_array_equal(m, [[1, 0, 0], [1, 1, 0], [1, 1, 0]])


# --------------------------------------------------------------------------- norms and FFN


@FAST
@given(st.integers(1, 4), st.integers(2, 8), st.integers(0, 10_000))
def test_layer_norm_rows_have_mean_zero_and_unit_variance(rows, H, seed):
    a = _rng(seed).normal(size=(rows, H)) * 3 + 1
    y = ref.layer_norm(a)
    np.testing.assert_allclose(y.mean(-1), np.zeros(rows), atol=1e-12)
    np.testing.assert_allclose(y.var(-1), np.ones(rows), rtol=1e-10)  # biased variance


def test_layer_norm_and_rms_norm_match_torch():
    rng = _rng(8)
    a, g, b = rng.normal(size=(2, 3, 6)), rng.normal(size=6), rng.normal(size=6)
    ta, tg, tb = (torch.from_numpy(t) for t in (a, g, b))
    np.testing.assert_allclose(
        ref.layer_norm(a, g, b, eps=1e-5), _np(F.layer_norm(ta, (6,), tg, tb, eps=1e-5)), **TOL
    )
    np.testing.assert_allclose(
        ref.layer_norm(a, eps=0.0), _np(F.layer_norm(ta, (6,), eps=0.0)), **TOL
    )
    np.testing.assert_allclose(
        ref.rms_norm(a, g, eps=1e-6), _np(F.rms_norm(ta, (6,), tg, eps=1e-6)), **TOL
    )
    with pytest.raises(ValueError, match="constant row"):
        ref.layer_norm(np.ones((1, 4)))
    np.testing.assert_array_equal(ref.layer_norm(np.ones((1, 4)), eps=1e-5), 0.0)


@pytest.mark.parametrize(
    "activation, torch_act",
    [("relu", F.relu), ("gelu", F.gelu), ("gelu_tanh", lambda z: F.gelu(z, approximate="tanh"))],
)
def test_feed_forward_matches_torch(activation, torch_act):
    rng = _rng(9)
    h = rng.normal(size=(3, 4))
    W1, b1, W2, b2 = (rng.normal(size=s) for s in [(4, 10), (10,), (10, 4), (4,)])
    th, tW1, tb1, tW2, tb2 = (torch.from_numpy(t) for t in (h, W1, b1, W2, b2))
    expected = torch_act(th @ tW1 + tb1) @ tW2 + tb2
    np.testing.assert_allclose(
        ref.feed_forward(h, W1, b1, W2, b2, activation), _np(expected), **TOL
    )


def test_feed_forward_relu_by_hand():
    W1 = np.array([[1.0, -1.0]])  # d_model = 1, d_ff = 2
    W2 = np.array([[2.0], [3.0]])
    # h = 2: hidden = relu([2, -2] + [0, 1]) = [2, 0]; out = 2*2 + 0 + 0.5
    np.testing.assert_allclose(
        ref.feed_forward(np.array([[2.0]]), W1, np.array([0.0, 1.0]), W2, np.array([0.5])),
        [[4.5]],
        **TOL,
    )


# --------------------------------------------------------------------------- positions


def test_sinusoid_corrected_003_example():
    """003's t = 1, d = 4 example, corrected: PE(1, 2) = sin(1 / 10000^(2/4)) = sin(1/100)."""
    pe = ref.sinusoidal_encoding(2, 4)
    expected = [math.sin(1.0), math.cos(1.0), math.sin(0.01), math.cos(0.01)]
    np.testing.assert_allclose(pe[1], expected, **TOL)
    assert not np.isclose(pe[1, 2], math.sin(1 / math.sqrt(1000)))  # 003's printed value
    np.testing.assert_array_equal(pe[0], [0.0, 1.0, 0.0, 1.0])  # Vaswani's position 0


@pytest.mark.parametrize("d", [1, 5, 6])
def test_sinusoid_matches_vectorised_formula(d):
    n = np.arange(7.0)[:, None]
    i = np.arange(0, d, 2)
    angle = n / 10000.0 ** (i / d)  # columns 2i use exponent 2i/d
    pe = ref.sinusoidal_encoding(7, d)
    np.testing.assert_allclose(pe[:, 0::2], np.sin(angle), **TOL)
    np.testing.assert_allclose(pe[:, 1::2], np.cos(angle[:, : d // 2]), **TOL)
    assert pe.shape == (7, d)


def test_sinusoid_shift_is_a_fixed_rotation_per_frequency_pair():
    d, k = 8, 3
    pe = ref.sinusoidal_encoding(20, d)
    for i in range(d // 2):
        w = 1.0 / 10000.0 ** (2 * i / d)
        R = np.array([[math.cos(w * k), math.sin(w * k)], [-math.sin(w * k), math.cos(w * k)]])
        for n in range(20 - k):  # same R for every n: PE(n + k) = R_k PE(n)
            np.testing.assert_allclose(
                pe[n + k, 2 * i : 2 * i + 2], R @ pe[n, 2 * i : 2 * i + 2], **TOL
            )


def test_rotary_rotate_half_layout():
    rng = _rng(10)
    x, pos = rng.normal(size=(2, 4, 6)), np.array([0, 1, 5, 9])
    got = ref.rotary(x, pos)
    # independent vectorised form: x * cos + rotate_half(x) * sin, rotate_half = [-x2, x1]
    theta = pos[:, None] / 10000.0 ** (np.arange(3) * 2 / 6)  # (N, d/2)
    cos, sin = np.tile(np.cos(theta), 2), np.tile(np.sin(theta), 2)
    rot_half = np.concatenate([-x[..., 3:], x[..., :3]], axis=-1)
    np.testing.assert_allclose(got, x * cos + rot_half * sin, **TOL)
    np.testing.assert_allclose(got[:, 0], x[:, 0], **TOL)  # position 0 is the identity
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1), **TOL)
    # d = 2: a plain rotation of (x0, x1) by angle p
    np.testing.assert_allclose(
        ref.rotary(np.array([[1.0, 0.0]]), [0.5]), [[math.cos(0.5), math.sin(0.5)]], **TOL
    )
    with pytest.raises(ValueError, match="even"):
        ref.rotary(np.ones((2, 3)), [0, 1])


def test_rotary_scores_depend_on_relative_position_only():
    rng = _rng(11)
    q, k = rng.normal(size=(1, 8)), rng.normal(size=(1, 8))
    scores = [float(ref.rotary(q, [m])[0] @ ref.rotary(k, [m - 3])[0]) for m in (3, 7, 20)]
    np.testing.assert_allclose(scores, [scores[0]] * 3, **TOL)


# --------------------------------------------------------------------------- blocks vs torch


def _norm_params(ln: torch.nn.LayerNorm) -> dict:
    return {"gain": _np(ln.weight), "bias": _np(ln.bias)}


def _ffn_params(layer) -> dict:
    return {
        "W1": _np(layer.linear1.weight).T,
        "b1": _np(layer.linear1.bias),
        "W2": _np(layer.linear2.weight).T,
        "b2": _np(layer.linear2.bias),
    }


def _torch_block(cls, d: int, h: int, d_ff: int, norm_first: bool) -> tuple[torch.nn.Module, dict]:
    """A float64 torch.nn.TransformerEncoderLayer or TransformerDecoderLayer (``cls``) with random
    norm gains and biases, and its weights as ``ref.encoder_block`` / ``ref.decoder_block`` take
    them (the decoder's norm1, norm2, norm3 sit before self-, cross-attention and the FFN)."""
    layer = cls(
        d, h, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first, dtype=torch.float64
    ).eval()
    with torch.no_grad():
        for m in layer.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_()
                m.bias.normal_()
    params = {"self_attn": _mha_params(layer.self_attn), "ffn": _ffn_params(layer)}
    sites = ["self_attn", "ffn"]
    if hasattr(layer, "multihead_attn"):
        params["cross_attn"] = _mha_params(layer.multihead_attn)
        sites.insert(1, "cross_attn")
    for i, site in enumerate(sites, 1):
        params[f"{site}_norm"] = _norm_params(getattr(layer, f"norm{i}"))
    params["eps"] = layer.norm1.eps
    return layer, params


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_block_matches_torch(norm_first):
    D, H, Ff, N = 8, 2, 16, 5
    layer, params = _torch_block(torch.nn.TransformerEncoderLayer, D, H, Ff, norm_first)
    x = torch.randn(1, N, D, dtype=torch.float64)
    mask = ref.causal_mask(N)
    with torch.no_grad():
        expected = layer(x, src_mask=torch.from_numpy(~mask))
    got = ref.encoder_block(_np(x[0]), params, mask=mask, norm_first=norm_first)
    np.testing.assert_allclose(got, _np(expected[0]), **TOL)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_matches_torch(norm_first):
    D, H, Ff, T, S = 8, 2, 16, 4, 6
    layer, params = _torch_block(torch.nn.TransformerDecoderLayer, D, H, Ff, norm_first)
    x = torch.randn(1, T, D, dtype=torch.float64)
    memory = torch.randn(1, S, D, dtype=torch.float64)
    self_mask = ref.causal_mask(T)
    cross_mask = ref.padding_mask([4], S)[0]  # last two source positions are padding
    with torch.no_grad():
        expected = layer(
            x,
            memory,
            tgt_mask=torch.from_numpy(~self_mask),
            memory_key_padding_mask=torch.from_numpy(~cross_mask)[None],
        )
    got = ref.decoder_block(
        _np(x[0]),
        _np(memory[0]),
        params,
        self_mask=self_mask,
        cross_mask=cross_mask,
        norm_first=norm_first,
    )
    np.testing.assert_allclose(got, _np(expected[0]), **TOL)


def test_encoder_block_rms_norm_pre_norm_wiring():
    rng = _rng(12)
    D = 4
    W = [rng.normal(size=(D, 2)) for _ in range(2)]
    params = {
        "self_attn": {"Wq": W, "Wk": W, "Wv": W, "Wo": rng.normal(size=(D, D))},
        "ffn": {"W1": rng.normal(size=(D, 6)), "W2": rng.normal(size=(6, D))},
        "norm": "rms",
    }
    x = rng.normal(size=(3, D))
    h = x + ref.multi_head_attention(ref.rms_norm(x), None, **params["self_attn"]).out
    expected = h + ref.feed_forward(
        ref.rms_norm(h), params["ffn"]["W1"], None, params["ffn"]["W2"], None
    )
    np.testing.assert_allclose(ref.encoder_block(x, params), expected, **TOL)


# --------------------------------------------------------------------------- recurrent


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_rnn_cell_matches_torch(activation):
    cell = torch.nn.RNNCell(3, 5, nonlinearity=activation, dtype=torch.float64)
    x, h = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    with torch.no_grad():
        expected = cell(x, h)
    got = ref.rnn_cell(
        _np(h),
        _np(x),
        _np(cell.weight_hh).T,
        _np(cell.weight_ih).T,
        _np(cell.bias_ih + cell.bias_hh),
        activation=activation,
    )
    np.testing.assert_allclose(got, _np(expected), **TOL)


def test_rnn_cell_by_hand():
    # h = tanh(W h + U x) with scalars: tanh(0.5 * 1 + 2 * 0.25)
    got = ref.rnn_cell(np.array([1.0]), np.array([0.25]), np.array([[0.5]]), np.array([[2.0]]))
    np.testing.assert_allclose(got, [math.tanh(1.0)], **TOL)


def test_lstm_cell_matches_torch_lstmcell_and_lstm():
    cell = torch.nn.LSTMCell(3, 4, dtype=torch.float64)
    x = torch.randn(2, 3, dtype=torch.float64)
    h, c = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    with torch.no_grad():
        eh, ec = cell(x, (h, c))
    weights = [_np(t) for t in (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)]
    gh, gc = ref.lstm_cell(_np(x), _np(h), _np(c), *weights)
    np.testing.assert_allclose(gh, _np(eh), **TOL)
    np.testing.assert_allclose(gc, _np(ec), **TOL)
    # the same layout unrolls torch.nn.LSTM (004 eq. 2) step by step
    lstm = torch.nn.LSTM(3, 4, batch_first=True, dtype=torch.float64)
    xs = torch.randn(1, 5, 3, dtype=torch.float64)
    with torch.no_grad():
        outs, _ = lstm(xs)
    w = [_np(t) for t in (lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)]
    hh, cc = np.zeros(4), np.zeros(4)
    for t in range(5):
        hh, cc = ref.lstm_cell(_np(xs[0, t]), hh, cc, *w)
        np.testing.assert_allclose(hh, _np(outs[0, t]), **TOL)


def test_additive_attention_step_eq_6_to_8():
    rng = _rng(13)
    T, d_h, d_f, d_a = 5, 3, 4, 6
    h, Fe = rng.normal(size=d_h), rng.normal(size=(T, d_f))
    W, U, v = rng.normal(size=(d_h, d_a)), rng.normal(size=(d_f, d_a)), rng.normal(size=d_a)
    ctx, alpha = ref.additive_attention_step(h, Fe, W, U, v)
    e = np.tanh(h @ W + Fe @ U) @ v  # (T,) eq. 6, vectorised
    np.testing.assert_allclose(alpha, np.exp(e) / np.exp(e).sum(), **TOL)  # eq. 7
    np.testing.assert_allclose(ctx, alpha @ Fe, **TOL)  # eq. 8
    mask = np.array([True, True, False, True, False])
    ctx_m, alpha_m = ref.additive_attention_step(h, Fe, W, U, v, mask=mask)
    np.testing.assert_array_equal(alpha_m[~mask], 0.0)
    sub_ctx, sub_alpha = ref.additive_attention_step(h, Fe[mask], W, U, v)
    np.testing.assert_allclose(alpha_m[mask], sub_alpha, **TOL)
    np.testing.assert_allclose(ctx_m, sub_ctx, **TOL)
    ctx0, alpha0 = ref.additive_attention_step(h, Fe, W, U, v, mask=np.zeros(T, dtype=bool))
    np.testing.assert_array_equal(ctx0, 0.0)
    np.testing.assert_array_equal(alpha0, 0.0)


def test_luong_scores():
    rng = _rng(14)
    h, Fe, Wg = rng.normal(size=3), rng.normal(size=(4, 3)), rng.normal(size=(3, 3))
    _, alpha = ref.additive_attention_step(h, Fe, score="dot")
    np.testing.assert_allclose(alpha, ref.softmax(Fe @ h), **TOL)
    _, alpha = ref.additive_attention_step(h, Fe, W=Wg, score="general")
    np.testing.assert_allclose(alpha, ref.softmax(Fe @ (h @ Wg)), **TOL)
    assert ref.dot_score([1.0, 2.0], [3.0, 4.0]) == 11.0
    assert ref.general_score([1.0, 0.0], [0.0, 1.0], [[0.0, 2.0], [0.0, 0.0]]) == 2.0
    # additive by hand: v^T tanh(W h + U f) = 1 * tanh(1 * 0.5 + 1 * 0.25)
    assert math.isclose(ref.additive_score([0.5], [0.25], [[1.0]], [[1.0]], [1.0]), math.tanh(0.75))
    with pytest.raises(ValueError, match="score"):
        ref.additive_attention_step(h, Fe, score="cosine")


# --------------------------------------------------------------------------- 000's collapse


def test_two_stacked_attention_layers_collapse_to_one():
    rng = _rng(15)
    n, d = 5, 4
    x = rng.normal(size=(n, d))
    V1, V2 = rng.normal(size=(d, d)), rng.normal(size=(d, 3))
    Wq, Wk = rng.normal(size=(d, d)), rng.normal(size=(d, d))
    # two explicit layers (layer 2's weights are computed from layer 1's output)
    A1 = ref.attention(x @ Wq, x @ Wk, x).weights
    u = np.array([sum(A1[j, k] * (x[k] @ V1) for k in range(n)) for j in range(n)])
    A2 = ref.attention(u @ Wq, u @ Wk, u).weights
    o = np.array([sum(A2[i, j] * (u[j] @ V2) for j in range(n)) for i in range(n)])
    # one combined attention-weighted linear map
    alpha_star, V_star = ref.two_layer_attention_collapse(x, V1, V2, A1, A2)
    np.testing.assert_allclose(alpha_star @ x @ V_star, o, **TOL)
    np.testing.assert_allclose(alpha_star, A2 @ A1, **TOL)
    np.testing.assert_allclose(alpha_star.sum(-1), np.ones(n), **TOL)  # still row-stochastic
    np.testing.assert_allclose(V_star, V1 @ V2, **TOL)
