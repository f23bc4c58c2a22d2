"""The short-key attention node (``attnlab.fast.short_attention``): when it is chosen, and that its
hand-written gradient is eq. 9's (against autograd on the explicit path, in float64, on the
non-contiguous head layouts the multi-head modules pass in). The NumPy oracle and gradcheck cover
it through tests/test_attention.py's ``path`` fixture."""

from __future__ import annotations

import pytest
import torch

from attnlab.fast.short_attention import SHORT_KEYS, short_key_attention, use_short_keys
from attnlab.nn import scaled_dot_product_attention
from attnlab.nn.masks import causal_mask, padding_mask


def _heads(b, t, h, d, dtype=torch.float64):
    """q, k, v as multi-head attention makes them: views of one (B, T, 3 H D) projection."""
    qkv = torch.randn(b, t, 3 * h * d, dtype=dtype, requires_grad=True)
    q, k, v = qkv.view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)  # each (B, H, T, D), strided
    return qkv, q, k, v


def _key_padding(b, s, lengths):
    return padding_mask(torch.arange(s)[None, :] < torch.tensor(lengths)[:, None])  # (B,1,1,S)


def test_chosen_for_short_masked_cpu_attention_only():
    q, k = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 7, 4)
    assert use_short_keys(q, k, 0.0)
    assert not use_short_keys(q, torch.randn(2, 2, SHORT_KEYS + 1, 4), 0.0)  # long keys: fused
    assert not use_short_keys(q[..., :1, :], k, 0.0)  # one query (a decode step): fused
    assert not use_short_keys(q, k, 0.1)  # dropout: the explicit path
    assert not use_short_keys(q.bfloat16(), k.bfloat16(), 0.0)  # half precision: fused


@pytest.mark.parametrize("causal", [False, True], ids=["padding", "padding+causal"])
def test_value_and_gradients_equal_autograd_on_the_explicit_path(causal):
    b, t, h, d = 3, 9, 2, 4
    mask = _key_padding(b, t, [9, 5, 1])
    grad_out = torch.randn(b, h, t, d, dtype=torch.float64)
    if causal:
        mask = mask & causal_mask(t)
    results = []
    for node in (True, False):  # the node, then the explicit path under autograd
        torch.manual_seed(0)
        qkv, q, k, v = _heads(b, t, h, d)
        if node:
            out = short_key_attention(q, k, v, mask, d**-0.5)
        else:
            out = scaled_dot_product_attention(q, k, v, mask, need_weights=True).out
        out.backward(grad_out)
        results.append((out.detach(), qkv.grad))
    (got, got_grad), (want, want_grad) = results
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)


def test_blocked_rows_have_zero_output_and_gradient():
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 2, 4, 4, dtype=torch.bool)
    mask[0, 1, 2] = False  # query 2 of head 1 may see nothing
    out = short_key_attention(q, k, v, mask, 3**-0.5)
    assert torch.equal(out[0, 1, 2], torch.zeros(3, dtype=torch.float64))
    out.square().sum().backward()
    assert torch.equal(q.grad[0, 1, 2], torch.zeros(3, dtype=torch.float64))
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_second_derivative_is_refused_not_wrong():
    q, k, v = (torch.randn(1, 1, 3, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = short_key_attention(q, k, v, torch.ones(3, 3, dtype=torch.bool), 1.0)
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad_q.sum().backward()
