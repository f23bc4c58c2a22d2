"""Invariants the notes state, checked with hypothesis on random inputs.

* Permutation equivariance without positions (001; 004 eq. 14): f(P X) = P f(X).
* Causality (000 "Future masking"): changing future tokens never changes earlier outputs.
* Padding: padded keys never change the outputs at real positions.
* Attention rows sum to 1 (softmax) or are one-hot (hardmax); fully masked rows are zero and
  finite in value and gradient.

Shapes: B batch, H heads, T queries / positions, S keys, D d_model, V vocab.
"""

from __future__ import annotations

import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.config import ModelConfig
from attnlab.models import (
    DecoderLM,
    EncoderClassifier,
    TransformerEncoder,
    TransformerEncoderDecoder,
)
from attnlab.nn import SelfAttention, basic_self_attention, scaled_dot_product_attention

FAST = settings(max_examples=20, deadline=None)
TOL = {"rtol": 1e-5, "atol": 1e-5}
V, D = 11, 8
seeds = st.integers(0, 2**31 - 1)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@functools.cache
def _model(kind: str, positional: str = "learned"):
    """One small eval-mode model per (kind, positional), built once with a fixed seed."""
    torch.manual_seed(1234)
    cfg = ModelConfig(
        kind=kind,
        vocab_size=V,
        d_model=D,
        n_heads=2,
        n_layers=2,
        d_ff=16,
        max_len=16,
        positional=positional,
        n_classes=3 if kind == "classifier" else None,
        pooling="mean",
    )
    cls = {
        "decoder_lm": DecoderLM,
        "encoder": TransformerEncoder,
        "classifier": EncoderClassifier,
        "encoder_decoder": TransformerEncoderDecoder,
    }[kind]
    return cls(cfg).eval()


def _ids(g: torch.Generator, b: int, t: int) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=g)


# --------------------------------------------------------------------------- permutations


@FAST
@given(st.integers(1, 7), seeds)
def test_attention_is_permutation_equivariant(t, seed):
    g = _gen(seed)
    x = torch.randn(2, t, D, generator=g)
    perm = torch.randperm(t, generator=g)
    torch.testing.assert_close(basic_self_attention(x[:, perm]), basic_self_attention(x)[:, perm])
    torch.manual_seed(seed)
    attn = SelfAttention(D, 2).eval()
    for need_weights in (True, False):
        out = attn(x, need_weights=need_weights).out
        torch.testing.assert_close(
            attn(x[:, perm], need_weights=need_weights).out, out[:, perm], **TOL
        )


@FAST
@given(st.integers(1, 7), seeds)
def test_encoder_without_positions_is_permutation_equivariant(t, seed):
    g = _gen(seed)
    ids = _ids(g, 2, t)
    perm = torch.randperm(t, generator=g)
    enc = _model("encoder", "none")
    torch.testing.assert_close(enc(ids[:, perm]).hidden, enc(ids).hidden[:, perm], **TOL)


# --------------------------------------------------------------------------- causality


@FAST
@given(st.sampled_from(["learned", "rotary", "sinusoidal"]), st.integers(2, 10), st.data(), seeds)
def test_decoder_lm_future_tokens_never_change_the_past(positional, t, data, seed):
    lm = _model("decoder_lm", positional)
    g = _gen(seed)
    ids = _ids(g, 2, t)
    k = data.draw(st.integers(1, t - 1), label="first changed position")
    changed = ids.clone()
    changed[:, k:] = _ids(g, 2, t - k)
    torch.testing.assert_close(lm(changed).logits[:, :k], lm(ids).logits[:, :k], **TOL)


@FAST
@given(st.integers(2, 8), st.data(), seeds)
def test_encoder_decoder_future_targets_never_change_the_past(t, data, seed):
    model = _model("encoder_decoder")
    g = _gen(seed)
    src, tgt = _ids(g, 2, 5), _ids(g, 2, t)
    k = data.draw(st.integers(1, t - 1), label="first changed position")
    changed = tgt.clone()
    changed[:, k:] = _ids(g, 2, t - k)
    torch.testing.assert_close(
        model(src, changed).logits[:, :k], model(src, tgt).logits[:, :k], **TOL
    )


# --------------------------------------------------------------------------- padding


@FAST
@given(st.integers(1, 6), st.integers(1, 5), seeds)
def test_padding_never_changes_real_positions(t, n_pad, seed):
    g = _gen(seed)
    ids = _ids(g, 1, t)
    padded = torch.cat([ids, _ids(g, 1, n_pad)], dim=1)  # arbitrary ids in the padding
    real = torch.arange(t + n_pad)[None, :] < t  # (1, T + pad)

    enc = _model("encoder")
    torch.testing.assert_close(
        enc(padded, key_padding_mask=real).hidden[:, :t], enc(ids).hidden, **TOL
    )
    clf = _model("classifier")  # mean pooling over real tokens only
    torch.testing.assert_close(clf(padded, key_padding_mask=real).logits, clf(ids).logits, **TOL)
    s2s = _model("encoder_decoder")
    tgt = _ids(g, 1, 4)
    torch.testing.assert_close(s2s(padded, tgt, src_mask=real).logits, s2s(ids, tgt).logits, **TOL)
    # target padding after the real targets changes nothing before it either
    tgt_pad = torch.cat([tgt, _ids(g, 1, n_pad)], dim=1)
    tgt_real = torch.arange(4 + n_pad)[None, :] < 4
    torch.testing.assert_close(
        s2s(ids, tgt_pad, tgt_mask=tgt_real).logits[:, :4], s2s(ids, tgt).logits, **TOL
    )


@FAST
@given(
    st.sampled_from(["learned", "sinusoidal", "rotary"]),
    st.integers(1, 6),
    st.integers(1, 4),
    seeds,
)
def test_decoder_lm_left_padding_never_changes_real_positions(positional, t, n_pad, seed):
    """Batched generation left-pads; with positions counted from the first real token the real
    positions see exactly what an unpadded run sees."""
    lm = _model("decoder_lm", positional)
    g = _gen(seed)
    ids = _ids(g, 1, t)
    padded = torch.cat([_ids(g, 1, n_pad), ids], dim=1)
    real = torch.arange(t + n_pad)[None, :] >= n_pad  # (1, pad + T)
    positions = (real.cumsum(1) - 1).clamp_min(0)  # (1, pad + T)
    out = lm(padded, key_padding_mask=real, positions=positions).logits[:, n_pad:]
    torch.testing.assert_close(out, lm(ids).logits, **TOL)


# --------------------------------------------------------------------------- attention rows


def _random_case(seed: int, t: int, s: int, p_allow: float):
    g = _gen(seed)
    q, k, v = (torch.randn(2, 2, n, 4, generator=g) for n in (t, s, s))
    mask = torch.rand(2, 2, t, s, generator=g) < p_allow  # may contain fully masked rows
    return q, k, v, mask


@FAST
@given(st.integers(1, 6), st.integers(1, 6), st.floats(0.0, 1.0), seeds)
def test_softmax_rows_sum_to_one_and_hardmax_rows_are_one_hot(t, s, p_allow, seed):
    q, k, v, mask = _random_case(seed, t, s, p_allow)
    allowed_rows = mask.any(-1)  # (B, H, T)
    soft = scaled_dot_product_attention(q, k, v, mask, need_weights=True).weights
    torch.testing.assert_close(soft.sum(-1), allowed_rows.float())
    assert torch.all(soft[~mask] == 0)
    hard = scaled_dot_product_attention(q, k, v, mask, activation="hardmax").weights
    assert torch.all((hard == 0) | (hard == 1))
    assert torch.equal(hard.sum(-1), allowed_rows.float())
    assert torch.all(hard[~mask] == 0)
    # the one-hot entry is the first maximal allowed score
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    first_max = scores.argmax(-1)
    picked = hard.argmax(-1)
    assert torch.equal(picked[allowed_rows], first_max[allowed_rows])


@FAST
@given(st.integers(1, 5), st.integers(1, 5), st.floats(0.0, 0.6), st.booleans(), seeds)
def test_masked_rows_are_finite_in_value_and_gradient(t, s, p_allow, need_weights, seed):
    q, k, v, mask = _random_case(seed, t, s, p_allow)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights).out
    assert torch.isfinite(out).all()
    blocked = ~mask.any(-1)  # (B, H, T)
    assert torch.all(out[blocked] == 0)
    out.square().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    assert torch.all(q.grad[blocked] == 0)
