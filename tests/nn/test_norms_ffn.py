"""LayerNorm (004 eq. 17), RMSNorm and the position-wise feed-forward network (000, 003).

LayerNorm equals ``torch.nn.LayerNorm`` (fp32, 1e-5) and the NumPy oracle (float64, 1e-10);
RMSNorm and FeedForward equal the oracle. Shapes: B batch, T positions, D d_model, F d_ff.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.models.layers import make_encoder_block
from attnlab.nn import FeedForward, LayerNorm, RMSNorm
from attnlab.nn.norms import make_norm
from oracle_params import TOL32, TOL64, to_np


def _randomise(module: nn.Module) -> nn.Module:
    """Move gains and biases away from 1 and 0 so they are actually tested."""
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-1.5, 1.5)
    return module


# --------------------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("eps", [1e-5, 0.0, 0.1])
def test_layer_norm_matches_reference_float64(eps):
    norm = _randomise(LayerNorm(6, eps=eps)).double()
    a = torch.randn(2, 3, 6, dtype=torch.float64) * 3 + 1
    expected = ref.layer_norm(to_np(a), to_np(norm.weight), to_np(norm.bias), eps=eps)
    np.testing.assert_allclose(to_np(norm(a)), expected, **TOL64)


def test_layer_norm_with_unit_gain_is_004_eq17():
    """eq. 17: (a - mu) / sigma with no gain, bias or epsilon; mean 0, variance 1 per row."""
    a = torch.randn(4, 7, dtype=torch.float64)
    out = LayerNorm(7, eps=0.0).double()(a)
    np.testing.assert_allclose(to_np(out), ref.layer_norm(to_np(a)), **TOL64)
    np.testing.assert_allclose(to_np(out.mean(-1)), np.zeros(4), **TOL64)
    np.testing.assert_allclose(to_np(out.var(-1, unbiased=False)), np.ones(4), **TOL64)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_equals_torch_layer_norm(bias):
    ours = _randomise(LayerNorm(16, eps=1e-5, bias=bias))
    theirs = nn.LayerNorm(16, eps=1e-5, bias=bias)
    theirs.load_state_dict(ours.state_dict())
    a = torch.randn(3, 5, 16) * 4 - 2
    torch.testing.assert_close(ours(a), theirs(a), **TOL32)
    assert (ours.bias is None) == (not bias)


def test_layer_norm_of_a_constant_row_is_finite():
    out = LayerNorm(5)(torch.full((2, 5), 3.0))
    assert torch.equal(out, torch.zeros(2, 5))  # eps keeps sqrt(0 + eps) > 0


# --------------------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm_matches_reference_float64(affine):
    norm = RMSNorm(6, eps=1e-5, affine=affine).double()
    if affine:
        _randomise(norm)
    a = torch.randn(2, 3, 6, dtype=torch.float64) * 2
    gain = to_np(norm.weight) if affine else None
    np.testing.assert_allclose(to_np(norm(a)), ref.rms_norm(to_np(a), gain, eps=1e-5), **TOL64)


def test_rms_norm_equals_torch_rms_norm():
    ours = _randomise(RMSNorm(8, eps=1e-6))
    theirs = nn.RMSNorm(8, eps=1e-6)
    theirs.load_state_dict(ours.state_dict())
    a = torch.randn(4, 8)
    torch.testing.assert_close(ours(a), theirs(a), **TOL32)


def test_make_norm_builds_both_kinds_and_rejects_others():
    assert isinstance(make_norm("layernorm", 4), LayerNorm)
    assert isinstance(make_norm("rmsnorm", 4), RMSNorm)
    assert make_norm("layernorm", 4, bias=False).bias is None
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'"):
        make_norm("batchnorm", 4)


# --------------------------------------------------------------------------- feed-forward


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_matches_reference_float64(activation, bias):
    """000: h_FF = W2 a(W1 h + b1) + b2, per position (row-vector form: a(h W1 + b1) W2 + b2)."""
    ffn = FeedForward(5, 9, activation=activation, bias=bias).double()
    h = torch.randn(2, 3, 5, dtype=torch.float64)
    b1 = to_np(ffn.up.bias) if bias else None
    b2 = to_np(ffn.down.bias) if bias else None
    expected = ref.feed_forward(
        to_np(h), to_np(ffn.up.weight.T), b1, to_np(ffn.down.weight.T), b2, activation
    )
    np.testing.assert_allclose(to_np(ffn(h)), expected, **TOL64)


def test_relu_squared_feed_forward_is_the_squared_relu():
    ffn = FeedForward(4, 6, activation="relu2").double()
    h = torch.randn(3, 4, dtype=torch.float64)
    hidden = np.maximum(to_np(h) @ to_np(ffn.up.weight.T) + to_np(ffn.up.bias), 0.0) ** 2
    expected = hidden @ to_np(ffn.down.weight.T) + to_np(ffn.down.bias)
    np.testing.assert_allclose(to_np(ffn(h)), expected, **TOL64)


def test_feed_forward_acts_on_each_position_independently():
    ffn = FeedForward(4, 8)
    h = torch.randn(2, 5, 4)
    out = ffn(h)
    torch.testing.assert_close(out[:, 2:3], ffn(h[:, 2:3]))
    h2 = h.clone()
    h2[:, 4] += 1.0
    torch.testing.assert_close(ffn(h2)[:, :4], out[:, :4])


@pytest.mark.parametrize("mult,expected", [(4.0, 32), (5.0, 40), (2.5, 20)])
def test_hidden_width_follows_the_config_multiple(mult, expected):
    """000 uses F = 5 D, Vaswani F = 4 D; d_ff overrides the multiple."""
    cfg = ModelConfig(d_model=8, n_heads=2, ffn_mult=mult)
    block = make_encoder_block(cfg, None)
    assert block.ffn.up.weight.shape == (expected, 8)
    assert block.ffn.down.weight.shape == (8, expected)
    explicit = make_encoder_block(cfg.replace(d_ff=12), None)
    assert explicit.ffn.up.out_features == 12


def test_dropout_is_the_identity_when_off():
    from attnlab.nn import Dropout

    x = torch.randn(4, 64)
    assert Dropout(0.5).eval()(x) is x  # eval: no aten call, the same tensor back
    assert Dropout(0.0).train()(x) is x  # p = 0
    assert Dropout(0.3).state_dict() == {}


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keeps_1_minus_p_and_preserves_the_mean(p):
    from attnlab.nn.dropout import dropout

    torch.manual_seed(0)
    x = torch.full((1_000_003,), 2.0)  # not a multiple of 4: the 16-bit words are cut to size
    y = dropout(x, p)
    dropped = (y == 0).double().mean().item()
    assert abs(dropped - p) < 5 * (p * (1 - p) / x.numel()) ** 0.5  # within 5 sigma
    assert torch.allclose(y[y != 0], torch.tensor(2.0 / (1 - p)), rtol=1e-4)
    assert abs(y.double().mean().item() - 2.0) < 0.02
    torch.manual_seed(0)
    assert torch.equal(dropout(x, p), y)  # the torch generator drives it: seeded, reproducible


def test_dropout_gradient_is_the_mask_over_keep_probability():
    from attnlab.nn.dropout import dropout

    x = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(1)
    y = dropout(x, 0.4)
    (y * 3).sum().backward()
    keep = (y != 0).double()
    assert torch.allclose(x.grad, 3 * keep / (1 - 0.4), rtol=1e-4)
    torch.manual_seed(1)
    assert torch.autograd.gradcheck(lambda t: (torch.manual_seed(1), dropout(t, 0.4))[1], (x,))


def test_dropout_rejects_a_bad_probability_and_drops_everything_at_one():
    from attnlab.nn.dropout import dropout

    with pytest.raises(ValueError, match="dropout probability"):
        dropout(torch.ones(3), 1.5)
    assert dropout(torch.ones(3), 1.0).eq(0).all()


def test_rmsnorm_of_bf16_input_keeps_an_fp32_gain_and_one_dtype():
    """Under bf16 autocast q, k arrive in bf16 while the gain is fp32: the norm runs in the input's
    dtype (the fused kernel's condition) and the gain's gradient stays fp32."""
    from attnlab.nn.norms import RMSNorm

    torch.manual_seed(0)
    norm = RMSNorm(16)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 16)
    out = norm(x.bfloat16())
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), norm(x), atol=3e-2)
    out.float().sum().backward()
    assert norm.weight.grad.dtype == torch.float32
