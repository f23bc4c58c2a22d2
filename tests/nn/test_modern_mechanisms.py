"""The modern mechanisms as standalone pieces against the NumPy oracle (float64) and invariants:
SwiGLU/GeGLU, ALiBi slopes and biases, the sliding-window mask, key/value head sharing (GQA/MQA),
and scaled rotary frequencies (against transformers' own rope initialisers).

Shapes: B batch, H query heads, G key/value heads, T queries, S keys, D d_model, F d_ff.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.nn.alibi import alibi_bias, alibi_slopes
from attnlab.nn.attention import scaled_dot_product_attention
from attnlab.nn.feedforward import GatedFeedForward, make_feedforward
from attnlab.nn.grouped import repeat_kv
from attnlab.nn.masks import causal_mask, sliding_window_mask
from attnlab.nn.positional import RotaryPositions, rotary_frequencies

FAST = settings(max_examples=20, deadline=None)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_feed_forward_matches_oracle(activation, bias):
    torch.manual_seed(0)
    ffn = GatedFeedForward(5, 7, activation=activation, bias=bias).double()
    h = torch.randn(2, 3, 5, dtype=torch.float64)
    b = (lambda lin: None if lin.bias is None else _np(lin.bias)) if bias else (lambda lin: None)
    want = ref.gated_feed_forward(
        _np(h),
        _np(ffn.gate.weight.T),
        _np(ffn.up.weight.T),
        _np(ffn.down.weight.T),
        activation,
        b(ffn.gate),
        b(ffn.up),
        b(ffn.down),
    )
    np.testing.assert_allclose(_np(ffn(h)), want, rtol=1e-12, atol=1e-12)


def test_swiglu_gate_closes_where_the_gate_is_very_negative():
    ffn = GatedFeedForward(2, 1, activation="silu").double()
    with torch.no_grad():
        ffn.gate.weight.fill_(-100.0)  # silu(-200) ~ 0: the gate shuts every unit
        ffn.up.weight.fill_(1.0)
        ffn.down.weight.fill_(1.0)
    assert ffn(torch.ones(1, 1, 2, dtype=torch.float64)).abs().max() < 1e-80


def test_make_feedforward_checks_the_gate_activation():
    assert isinstance(
        make_feedforward("swiglu", 4, 8, activation="silu", bias=False, dropout=0.0),
        GatedFeedForward,
    )
    with pytest.raises(ValueError, match="swiglu gates with"):
        make_feedforward("swiglu", 4, 8, activation="relu", bias=False, dropout=0.0)
    with pytest.raises(ValueError, match="activation="):
        ModelConfig(ffn="swiglu", activation="relu")


@pytest.mark.parametrize("n_heads", [1, 2, 3, 5, 6, 8, 12, 16])
def test_alibi_slopes_match_oracle_and_paper(n_heads):
    np.testing.assert_allclose(alibi_slopes(n_heads).double().numpy(), ref.alibi_slopes(n_heads))
    if n_heads == 8:  # Press et al.: 1/2, 1/4, ..., 1/256
        np.testing.assert_allclose(ref.alibi_slopes(8), [2.0**-k for k in range(1, 9)])


def test_alibi_slopes_are_distinct_and_decreasing_for_powers_of_two():
    s = alibi_slopes(16)
    assert bool((s[1:] < s[:-1]).all()) and len(set(s.tolist())) == 16


@FAST
@given(st.integers(1, 6), st.integers(1, 7), st.integers(0, 9), st.integers(0, 500))
def test_alibi_attention_matches_oracle(n_heads, t, offset, seed):
    """Causal attention with ALiBi biases at positions offset..offset+T-1, head by head."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, n_heads, t, 4, dtype=torch.float64, generator=g) for _ in range(3))
    pos = torch.arange(offset, offset + t)
    slopes = alibi_slopes(n_heads).double()
    bias = alibi_bias(slopes, pos, pos)  # (1, H, T, T)
    scores = q @ k.transpose(-2, -1) / 2.0 + bias  # sqrt(d_k) = 2
    scores = scores.masked_fill(~causal_mask(t), -math.inf)
    out = scores.softmax(-1) @ v
    for h in range(n_heads):
        want = ref.attention(
            _np(q[0, h]),
            _np(k[0, h]),
            _np(v[0, h]),
            mask=ref.causal_mask(t),
            bias=ref.alibi_bias(float(slopes[h]), pos.numpy(), pos.numpy()),
        )
        np.testing.assert_allclose(_np(out[0, h]), want.out, rtol=1e-10, atol=1e-12)


def test_alibi_bias_depends_only_on_distance_so_shifts_and_left_padding_change_nothing():
    slopes = alibi_slopes(4)
    a = alibi_bias(slopes, torch.arange(5), torch.arange(5))
    b = alibi_bias(slopes, torch.arange(5) + 17, torch.arange(5) + 17)
    torch.testing.assert_close(a, b)
    # Per-row positions (B, T) of a left-padded batch: the real tokens' biases equal the unpadded.
    padded = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    both = alibi_bias(slopes, padded, padded)  # (2, H, T, T)
    torch.testing.assert_close(both[0, :, 2:, 2:], a[0, :, :3, :3])
    assert both.shape == (2, 4, 5, 5)


@FAST
@given(st.integers(1, 8), st.integers(0, 6), st.integers(1, 9))
def test_sliding_window_mask_matches_oracle(t, extra, window):
    s = t + extra
    got = sliding_window_mask(t, s, window).numpy()
    np.testing.assert_array_equal(got, ref.sliding_window_mask(t, s, window))
    assert (got.sum(-1) == np.minimum(window, np.arange(s - t, s) + 1)).all()


def test_sliding_window_wider_than_the_sequence_is_causal():
    torch.testing.assert_close(sliding_window_mask(6, 6, 6), causal_mask(6))
    torch.testing.assert_close(sliding_window_mask(6, 6, 100), causal_mask(6))
    with pytest.raises(ValueError, match="positive int"):
        sliding_window_mask(3, 3, 0)


@pytest.mark.parametrize("n_heads,kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_repeat_kv_attention_matches_grouped_query_oracle(n_heads, kv_heads):
    torch.manual_seed(1)
    d, dh, t = 8, 3, 5
    x = torch.randn(t, d, dtype=torch.float64)
    Wq = [torch.randn(d, dh, dtype=torch.float64) for _ in range(n_heads)]
    Wk = [torch.randn(d, dh, dtype=torch.float64) for _ in range(kv_heads)]
    Wv = [torch.randn(d, dh, dtype=torch.float64) for _ in range(kv_heads)]
    q = torch.stack([x @ w for w in Wq])[None]  # (1, H, T, Dh)
    k = repeat_kv(torch.stack([x @ w for w in Wk])[None], n_heads)  # (1, H, T, Dh)
    v = repeat_kv(torch.stack([x @ w for w in Wv])[None], n_heads)
    out, w = scaled_dot_product_attention(q, k, v, causal=True, need_weights=True)
    want = ref.grouped_query_attention(
        x.numpy(),
        [m.numpy() for m in Wq],
        [m.numpy() for m in Wk],
        [m.numpy() for m in Wv],
        mask=ref.causal_mask(t),
    )
    concat = out[0].transpose(0, 1).reshape(t, n_heads * dh)
    np.testing.assert_allclose(_np(concat), want.out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(w[0]), want.weights, rtol=1e-10, atol=1e-12)


def test_repeat_kv_order_and_errors():
    x = torch.arange(2.0).view(1, 2, 1, 1)  # kv heads 0 and 1
    assert repeat_kv(x, 6).flatten().tolist() == [0, 0, 0, 1, 1, 1]  # head h reads h // 3
    assert repeat_kv(x, 2) is x
    with pytest.raises(ValueError, match="shared evenly"):
        repeat_kv(x, 3)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        ModelConfig(n_heads=4, n_kv_heads=3)


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_scaled_rotary_frequencies_match_transformers(scaling):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=2,
        rope_theta=500000.0,
        rope_scaling=dict(scaling),
        max_position_embeddings=512,
    )
    want, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu")
    got = rotary_frequencies(
        32,
        500000.0,
        scaling["rope_type"],
        scaling["factor"],
        scaling.get("low_freq_factor", 1.0),
        scaling.get("high_freq_factor", 4.0),
        scaling.get("original_max_position_embeddings"),
    )
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-6, atol=0)
    if scaling["rope_type"] == "linear":  # position p with theta/s is position p/s unscaled
        x = torch.randn(1, 1, 3, 32, dtype=torch.float64)
        scaled = RotaryPositions(32, 500000.0, frequencies=got)
        plain = RotaryPositions(32, 500000.0)
        pos = torch.tensor([0, 4, 8])
        torch.testing.assert_close(
            scaled.rotate(x, pos), plain.rotate(x, torch.tensor([0.0, 1.0, 2.0]))
        )


def test_unscaled_rotary_matches_oracle_and_scaling_is_validated():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    pos = torch.arange(5)
    got = RotaryPositions(8, 100.0).rotate(x[None], pos)[0]
    np.testing.assert_allclose(_np(got), ref.rotary(_np(x), pos.numpy(), 100.0), rtol=1e-12)
    with pytest.raises(ValueError, match="rope_original_max_len"):
        ModelConfig(positional="rotary", rope_scaling="llama3", rope_factor=8.0)
    with pytest.raises(ValueError, match="unknown rotary scaling"):
        rotary_frequencies(8, 100.0, "yarn")


def test_window_trimmed_kv_cache_holds_at_most_two_windows_and_the_keys_queries_need():
    """Append one position at a time: the cache keeps every key inside the window of the next
    query, starts dropping older ones once full, and never holds more than 2W positions."""
    from attnlab.nn.cache import KVCache

    w = 3
    cache = KVCache(1, 1, 50, 1, 1, window=w)
    assert cache.k.size(2) == 2 * w
    for pos in range(20):
        x = torch.full((1, 1, 1, 1), float(pos))
        k, _ = cache.append(x, x)
        held = k.flatten().tolist()
        assert held == [float(p) for p in range(cache.start, pos + 1)]
        assert held[-w:] == [float(p) for p in range(max(0, pos - w + 1), pos + 1)]
        assert len(held) <= 2 * w and cache.length == pos + 1
    # A prefill longer than the buffer grows it once; the next step trims back to W - 1 old keys.
    big = KVCache(2, 1, 50, 1, 1, window=w)
    seq = torch.arange(10.0).view(1, 1, 10, 1).expand(2, 1, 10, 1)
    assert big.append(seq, seq)[0].size(2) == 10
    k, _ = big.append(seq[:, :, :1] + 10, seq[:, :, :1] + 10)
    assert big.start == 10 - (w - 1) and k[0].flatten().tolist() == [8.0, 9.0, 10.0]
    with pytest.raises(ValueError, match="overflow"):
        big.append(torch.zeros(2, 1, 40, 1), torch.zeros(2, 1, 40, 1))
