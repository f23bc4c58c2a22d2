"""Scaled dot-product attention (004 eq. 9-12), masks, hardmax and the two execution paths.

Checked three ways: against the NumPy loop-form oracle ``attnlab.reference`` in float64 (1e-10),
explicit path against fused path in float32 (1e-5) under every mask kind, and
``torch.autograd.gradcheck`` in float64. Shapes: B batch, H heads, T queries, S keys.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import reference as ref
from attnlab.nn import (
    SelfAttention,
    basic_self_attention,
    hardmax,
    scaled_dot_product_attention,
    soft_cap,
)
from attnlab.nn.masks import causal_mask, combine_masks, padding_mask
from oracle_params import TOL32, TOL64

B, H, T, S, DK, DV = 2, 2, 3, 5, 4, 3


@pytest.fixture(params=["explicit", "fused"])
def path(request):
    """The two forms of eq. 9; "explicit" = weights requested."""
    return request.param


@pytest.fixture(params=["fused"])
def fast_path(request):
    """The weight-free form."""
    return request.param


def _qkv(t=T, s=S, dtype=torch.float64, b=B, h=H, dk=DK, dv=DV):
    return (
        torch.randn(b, h, t, dk, dtype=dtype),
        torch.randn(b, h, s, dk, dtype=dtype),
        torch.randn(b, h, s, dv, dtype=dtype),
    )


def _oracle(q, k, v, mask=None, **kw):
    """Loop the NumPy oracle over (B, H): out (B, H, T, Dv), weights (B, H, T, S)."""
    b, h, t, _ = q.shape
    s = k.size(-2)
    full = None if mask is None else mask.expand(b, h, t, s).numpy()
    out = np.zeros((b, h, t, v.size(-1)))
    weights = np.zeros((b, h, t, s))
    for i in range(b):
        for j in range(h):
            m = None if full is None else full[i, j]
            out[i, j], weights[i, j] = ref.attention(
                q[i, j].numpy(), k[i, j].numpy(), v[i, j].numpy(), mask=m, **kw
            )
    return out, weights


def _masks(t=T, s=S, b=B, h=H):
    """Every mask kind of the issue, each broadcastable to (B, H, T, S), True = may attend."""
    lengths = torch.tensor([s, s - 2])[:b]  # the second sequence ends in 2 pads
    key_pad = padding_mask(torch.arange(s)[None, :] < lengths[:, None])  # (B, 1, 1, S)
    arbitrary = torch.rand(b, h, t, s) < 0.6
    arbitrary[..., 0] = True
    fully = arbitrary.clone()
    fully[0, 1, 1] = False  # one query that may attend to nothing
    fully[-1, :, -1] = False  # and a row blocked in every head
    return {
        "none": None,
        "causal": causal_mask(t, s),  # bottom-right aligned when T < S
        "key_padding": key_pad,
        "arbitrary": arbitrary,
        "combined": combine_masks(causal_mask(t, s), key_pad, arbitrary),
        "fully_masked_rows": fully,
        "2d": torch.rand(t, s) < 0.5,
    }


# --------------------------------------------------------------------------- against the oracle


def test_basic_self_attention_matches_reference():
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    got = basic_self_attention(x)
    for i in range(2):
        np.testing.assert_allclose(got[i].numpy(), ref.basic_self_attention(x[i].numpy()), **TOL64)


@pytest.mark.parametrize("kind", list(_masks()))
def test_attention_matches_reference_under_every_mask(kind, path):
    need_weights = path == "explicit"
    q, k, v = _qkv()
    mask = _masks()[kind]
    got = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    out, weights = _oracle(q, k, v, mask)
    np.testing.assert_allclose(got.out.numpy(), out, **TOL64)
    if need_weights:
        np.testing.assert_allclose(got.weights.numpy(), weights, **TOL64)
    else:
        assert got.weights is None


@pytest.mark.parametrize(
    "t,s", [(4, 4), (2, 5), (1, 4)], ids=["square", "bottom_right", "decode_step"]
)
def test_causal_flag_equals_reference_causal_mask(t, s, path):
    need_weights = path == "explicit"
    q, k, v = _qkv(t, s)
    got = scaled_dot_product_attention(q, k, v, causal=True, need_weights=need_weights)
    out, weights = _oracle(q, k, v, torch.from_numpy(ref.causal_mask(t, s)))
    np.testing.assert_allclose(got.out.numpy(), out, **TOL64)
    if need_weights:
        np.testing.assert_allclose(got.weights.numpy(), weights, **TOL64)


@pytest.mark.parametrize("scale", [True, False, 0.37], ids=["sqrt_dk", "unscaled", "float"])
def test_scale_switch_matches_reference(scale, path):
    need_weights = path == "explicit"
    q, k, v = _qkv()
    got = scaled_dot_product_attention(q, k, v, scale=scale, need_weights=need_weights)
    out, _ = _oracle(q, k, v, scale=scale)
    np.testing.assert_allclose(got.out.numpy(), out, **TOL64)


def test_unscaled_attention_is_the_plain_softmax_of_dot_products():
    q, k, v = _qkv()
    got = scaled_dot_product_attention(q, k, v, scale=False, need_weights=True)
    torch.testing.assert_close(got.weights, (q @ k.transpose(-2, -1)).softmax(-1))
    scaled = scaled_dot_product_attention(q, k, v, need_weights=True)
    torch.testing.assert_close(scaled.weights, (q @ k.transpose(-2, -1) / DK**0.5).softmax(-1))


def test_hardmax_attention_matches_reference():
    q, k, v = _qkv()
    mask = _masks()["fully_masked_rows"]
    got = scaled_dot_product_attention(q, k, v, mask, activation="hardmax")
    out, weights = _oracle(q, k, v, mask, activation="hardmax")
    np.testing.assert_allclose(got.out.numpy(), out, **TOL64)
    np.testing.assert_allclose(got.weights.numpy(), weights, **TOL64)


def test_masks_match_reference():
    for t, s in [(4, 4), (2, 6), (1, 3)]:
        np.testing.assert_array_equal(causal_mask(t, s).numpy(), ref.causal_mask(t, s))
    lengths = np.array([4, 1, 0])
    real = torch.arange(4)[None, :] < torch.from_numpy(lengths)[:, None]
    np.testing.assert_array_equal(real.numpy(), ref.padding_mask(lengths, 4))
    assert padding_mask(real).shape == (3, 1, 1, 4)
    assert combine_masks(None, None) is None
    a, b = torch.rand(3, 4) < 0.5, torch.rand(3, 4) < 0.5
    torch.testing.assert_close(combine_masks(a, None, b), a & b)


# --------------------------------------------------------------------------- explicit vs fused


@pytest.mark.parametrize("t,s", [(5, 5), (3, 7)], ids=["T==S", "T<S"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("kind", list(_masks()))
def test_explicit_and_fused_paths_agree_fp32(kind, causal, t, s, fast_path):
    q, k, v = _qkv(t, s, torch.float32)
    mask = _masks(t, s)[kind]
    explicit = scaled_dot_product_attention(q, k, v, mask, causal=causal, need_weights=True)
    fused = scaled_dot_product_attention(q, k, v, mask, causal=causal)
    assert fused.weights is None and explicit.weights.shape == (B, H, t, s)
    torch.testing.assert_close(fused.out, explicit.out, **TOL32)
    assert torch.isfinite(fused.out).all() and torch.isfinite(explicit.out).all()


@pytest.mark.parametrize("activation", ["softmax", "hardmax"])
def test_fully_masked_rows_give_zero_output_and_finite_gradient(path, activation):
    need_weights = path == "explicit"
    q, k, v = (x.float().requires_grad_() for x in _qkv())
    mask = torch.ones(B, H, T, S, dtype=torch.bool)
    mask[0, 1, 1] = False
    mask[1, :, 2] = False
    got = scaled_dot_product_attention(
        q, k, v, mask, activation=activation, straight_through=True, need_weights=need_weights
    )
    assert torch.equal(got.out[0, 1, 1], torch.zeros(DV))
    assert torch.equal(got.out[1, :, 2], torch.zeros(H, DV))
    if got.weights is not None:
        assert torch.equal(got.weights[0, 1, 1], torch.zeros(S))
    (got.out**2).sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert torch.equal(q.grad[0, 1, 1], torch.zeros(DK))  # the blocked query influences nothing


def test_everything_masked_is_zero_in_every_path(fast_path):
    q, k, v = _qkv(dtype=torch.float32)
    mask = torch.zeros(T, S, dtype=torch.bool)
    for need_weights in (True, False):
        out = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights).out
        assert torch.equal(out, torch.zeros_like(out))


# --------------------------------------------------------------------------- hardmax


def test_hardmax_rows_are_one_hot_with_first_index_ties():
    scores = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [-1.0, -5.0, -2.0], [0.0, 0.0, 9.0]])
    expected = torch.tensor([[0, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float32)
    assert torch.equal(hardmax(scores), expected)
    ties = torch.randint(0, 3, (6, 7)).double()  # many ties
    np.testing.assert_array_equal(hardmax(ties).numpy(), ref.hardmax(ties.numpy()))


def test_hardmax_gradient_zero_or_straight_through_softmax():
    scores = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(3, 5, dtype=torch.float64)
    assert not hardmax(scores).requires_grad  # argmax is flat: no gradient at all

    st_scores = scores.detach().clone().requires_grad_()
    out = hardmax(st_scores, straight_through=True)
    assert torch.equal(out.detach(), hardmax(scores.detach()))  # forward value is one-hot
    (out * upstream).sum().backward()
    soft = scores.detach().clone().requires_grad_()
    (soft.softmax(-1) * upstream).sum().backward()
    torch.testing.assert_close(st_scores.grad, soft.grad, rtol=1e-12, atol=1e-12)


def test_straight_through_forward_value_is_exactly_one_hot():
    scores = torch.randn(1000, 7)
    assert torch.equal(hardmax(scores, straight_through=True), hardmax(scores))


def test_hardmax_attention_straight_through_reaches_queries():
    q, k, v = (x.requires_grad_() for x in _qkv())
    out = scaled_dot_product_attention(q, k, v, activation="hardmax", straight_through=True).out
    out.sum().backward()
    assert q.grad.abs().sum() > 0  # soft gradient flows although the weights are one-hot
    q2 = q.detach().clone().requires_grad_()
    out2 = scaled_dot_product_attention(q2, k, v, activation="hardmax").out
    torch.testing.assert_close(out2, out.detach())
    (grad,) = torch.autograd.grad(out2.sum(), q2, allow_unused=True, materialize_grads=True)
    assert torch.equal(grad, torch.zeros_like(q2))  # without the estimator: zero gradient


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("kind", ["none", "combined", "fully_masked_rows"])
def test_gradcheck_both_paths(kind, path):
    need_weights = path == "explicit"
    q, k, v = (x.requires_grad_() for x in _qkv(b=1, h=2, t=3, s=4, dk=3, dv=2))
    mask = _masks(3, 4, 1, 2)[kind]
    if mask is not None:
        mask = mask[:1]

    def f(q, k, v):
        return scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights).out

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_gradcheck_causal_bottom_right_fused(fast_path):
    q, k, v = (x.requires_grad_() for x in _qkv(b=1, h=1, t=2, s=4, dk=3, dv=2))
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, causal=True).out, (q, k, v)
    )


# --------------------------------------------------------------------------- logit soft-capping


@pytest.mark.parametrize("kind", ["none", "causal", "combined", "fully_masked_rows"])
@pytest.mark.parametrize("biased", [False, True], ids=["plain", "logit_bias"])
def test_softcapped_attention_matches_reference(kind, biased, path):
    """a(c tanh(s / c)) V against the oracle's loop; large logits, so the cap bends them."""
    need_weights = path == "explicit"
    q, k, v = _qkv()
    q = 4.0 * q  # logits of several c: the cap is far from the identity
    mask = _masks()[kind]
    bias = torch.randn(1, H, T, S, dtype=torch.float64) if biased else None
    got = scaled_dot_product_attention(
        q, k, v, mask, softcap=1.5, bias=bias, need_weights=need_weights
    )
    kw = dict(softcap=1.5)
    if bias is None:
        out, weights = _oracle(q, k, v, mask, **kw)
    else:  # the oracle takes one head's (T, S) bias
        out, weights = np.zeros((B, H, T, DV)), np.zeros((B, H, T, S))
        full = None if mask is None else mask.expand(B, H, T, S).numpy()
        for i in range(B):
            for j in range(H):
                m = None if full is None else full[i, j]
                out[i, j], weights[i, j] = ref.attention(
                    q[i, j].numpy(), k[i, j].numpy(), v[i, j].numpy(), mask=m,
                    bias=bias[0, j].numpy(), **kw,
                )  # fmt: skip
    np.testing.assert_allclose(got.out.numpy(), out, **TOL64)
    assert got.weights is not None  # the fused kernel cannot cap: the explicit form ran
    np.testing.assert_allclose(got.weights.numpy(), weights, **TOL64)
    uncapped, _ = _oracle(q, k, v, mask)
    assert not np.allclose(out, uncapped, atol=1e-3)  # the cap changed the result


def test_softcapped_attention_gradcheck():
    q, k, v = (x.requires_grad_() for x in _qkv(b=1, h=2, t=3, s=4, dk=3, dv=2))
    mask = causal_mask(3, 4)
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask, softcap=0.7).out, (q, k, v)
    )


@pytest.mark.parametrize("cap", [0, -1.0, float("inf"), float("nan"), True, "50"])
def test_a_bad_softcap_is_one_clear_error(cap):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"softcap=.* must be a finite number > 0"):
        scaled_dot_product_attention(q, k, v, softcap=cap)


@settings(max_examples=40, deadline=None)
@given(
    st.floats(0.05, 100.0),
    st.floats(0.1, 1e4),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_softcapped_logits_are_bounded_by_the_cap(cap, spread, grouped, seed):
    """What hook_scaled sees (and the activation gets) lies in [-c, c], whatever the scale of
    the logits; the weights are still rows of a softmax over the admissible keys."""
    torch.manual_seed(seed)
    attn = SelfAttention(16, 4, n_kv_heads=2 if grouped else None, softcap=cap).double()
    seen = []
    attn.hook_scaled.register_forward_hook(lambda mod, args, out: seen.append(out))
    x = spread * torch.randn(2, 6, 16, dtype=torch.float64)
    out = attn(x, causal=True, need_weights=False)
    (logits,) = seen
    assert logits.shape == (2, 4, 6, 6)
    assert bool((logits.abs() <= cap).all())
    small = ref.soft_cap(1e-3 * cap, cap)
    assert abs(small - 1e-3 * cap) < 1e-8 * cap  # slope 1 at 0: small logits pass unchanged
    assert out.weights is not None and torch.isfinite(out.out).all()
    rows = out.weights.sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))


def test_soft_cap_function_is_the_reference_and_none_is_the_identity():
    x = torch.linspace(-300.0, 300.0, 61, dtype=torch.float64)
    got = soft_cap(x, 30.0)
    want = np.array([ref.soft_cap(float(a), 30.0) for a in x])
    np.testing.assert_allclose(got.numpy(), want, **TOL64)
    assert soft_cap(x, None) is x
