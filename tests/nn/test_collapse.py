"""000 "Elementwise nonlinearity": stacked attention without a nonlinearity is one attention layer.

Layer 1: u_j = sum_k alpha1_jk x_k V1; layer 2: o_i = sum_j alpha2_ij u_j V2. Hence
o_i = sum_k alpha*_ik x_k V* with alpha* = A2 A1 (row-stochastic again) and V* = V1 V2 (row form).
Computed here with the library's torch modules (weights returned by the explicit path) and compared
with the NumPy oracle ``two_layer_attention_collapse`` in float64 (1e-10). The feed-forward
nonlinearity between the layers is what breaks the collapse.
Shapes: T positions, D width; A1, A2 (T, T); V1, V2 (D, D) in row-vector form (x V).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import reference as ref
from attnlab.nn import FeedForward, SelfAttention
from oracle_params import TOL64

T, D = 6, 4


def _layer(bias: bool = False) -> SelfAttention:
    """One single-head attention layer whose output is A x V (002's variant: no W^O)."""
    return SelfAttention(D, 1, out_proj=False, bias=bias).double()


def _value_matrix(attn: SelfAttention) -> np.ndarray:
    """V in row-vector form (D, D): the value rows of the fused projection, transposed."""
    return attn.qkv_proj.weight[2 * D :].detach().T.numpy()


def _run(attn: SelfAttention, x: torch.Tensor, causal: bool):
    out, weights = attn(x[None], causal=causal, need_weights=True)  # (1, T, D), (1, 1, T, T)
    return out[0], weights[0, 0].detach().numpy()


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_two_linear_attention_layers_are_one_attention_weighted_linear_map(causal):
    layer1, layer2 = _layer(), _layer()
    x = torch.randn(T, D, dtype=torch.float64)
    u, A1 = _run(layer1, x, causal)
    o, A2 = _run(layer2, u, causal)  # A2 is computed from u: the collapse holds for these weights

    collapsed = ref.two_layer_attention_collapse(
        x.numpy(), _value_matrix(layer1), _value_matrix(layer2), A1, A2
    )
    alpha_star, v_star = collapsed
    np.testing.assert_allclose(o.detach().numpy(), alpha_star @ x.numpy() @ v_star, **TOL64)
    np.testing.assert_allclose(alpha_star, A2 @ A1, **TOL64)
    np.testing.assert_allclose(alpha_star.sum(-1), np.ones(T), **TOL64)  # still attention
    assert np.all(alpha_star >= 0)
    if causal:  # a product of lower-triangular matrices never looks ahead
        assert np.all(np.triu(alpha_star, 1) == 0)


def test_with_biases_the_stack_is_one_attention_weighted_affine_map():
    """Rows of A sum to 1, so A (x V1 + 1 b1) V2 + 1 b2 = alpha* x V* + (b1 V2 + b2)."""
    layer1, layer2 = _layer(bias=True), _layer(bias=True)
    with torch.no_grad():
        for layer in (layer1, layer2):
            layer.qkv_proj.bias.uniform_(-1.0, 1.0)
    x = torch.randn(T, D, dtype=torch.float64)
    u, A1 = _run(layer1, x, causal=False)
    o, A2 = _run(layer2, u, causal=False)
    V1, V2 = _value_matrix(layer1), _value_matrix(layer2)
    b1, b2 = (layer.qkv_proj.bias[2 * D :].detach().numpy() for layer in (layer1, layer2))
    alpha_star, v_star = ref.two_layer_attention_collapse(x.numpy(), V1, V2, A1, A2)
    expected = alpha_star @ x.numpy() @ v_star + (b1 @ V2 + b2)
    np.testing.assert_allclose(o.detach().numpy(), expected, **TOL64)


def test_three_layers_collapse_to_the_product_of_their_attention_matrices():
    layers = [_layer() for _ in range(3)]
    x = torch.randn(T, D, dtype=torch.float64)
    h, alpha, v_star = x, np.eye(T), np.eye(D)
    for layer in layers:
        h, A = _run(layer, h, causal=False)
        alpha, v_star = A @ alpha, v_star @ _value_matrix(layer)
    np.testing.assert_allclose(h.detach().numpy(), alpha @ x.numpy() @ v_star, **TOL64)


def test_a_feed_forward_nonlinearity_breaks_the_collapse():
    """With the attention matrices fixed (as in 000's derivation) the stack x -> A2 A1 x V1 V2 is
    linear in x; putting ReLU(h W1) W2 between the layers makes it non-additive, so no single
    attention-weighted linear map can express it."""
    layer1, layer2 = _layer(), _layer()
    x, y = torch.randn(2, T, D, dtype=torch.float64)
    _, A1 = _run(layer1, x, causal=False)
    _, A2 = _run(layer2, x, causal=False)
    V1, V2 = _value_matrix(layer1), _value_matrix(layer2)
    ffn = FeedForward(D, 5 * D, bias=False).double()  # 000's 5x width; ReLU is the only change

    def stack(inputs: np.ndarray, middle) -> np.ndarray:
        return A2 @ middle(A1 @ inputs @ V1) @ V2

    def relu_ffn(h: np.ndarray) -> np.ndarray:
        return ffn(torch.from_numpy(h)).detach().numpy()

    x, y = x.numpy(), y.numpy()
    np.testing.assert_allclose(
        stack(x + y, lambda h: h), stack(x, lambda h: h) + stack(y, lambda h: h), **TOL64
    )
    gap = np.abs(stack(x + y, relu_ffn) - stack(x, relu_ffn) - stack(y, relu_ffn)).max()
    assert gap > 1e-2 * np.abs(stack(x + y, relu_ffn)).max()
