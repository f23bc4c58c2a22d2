"""Bad input raises a ValueError/TypeError whose message names the problem and the fix.

Covers the issue's list: width not divisible by heads, query/key width mismatch, masks that do
not broadcast or are not bool, sequences longer than a learned table or max_len, token ids
outside the vocabulary, empty sequences, wrong dtypes, and bad or unknown config values.
Shapes: B batch, H heads, T queries, S keys, D d_model.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.config import ModelConfig, from_dict
from attnlab.models import (
    DecoderLM,
    EncoderClassifier,
    TransformerEncoder,
    TransformerEncoderDecoder,
    build_model,
)
from attnlab.nn import (
    CrossAttention,
    FeedForward,
    LearnedPositions,
    RotaryPositions,
    SelfAttention,
    scaled_dot_product_attention,
)
from attnlab.nn.masks import causal_mask, padding_mask

V, D = 13, 8


def _cfg(kind: str = "decoder_lm", **kw) -> ModelConfig:
    base = dict(kind=kind, vocab_size=V, d_model=D, n_heads=2, n_layers=1, d_ff=16, max_len=8)
    return ModelConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def lm() -> DecoderLM:
    return DecoderLM(_cfg()).eval()


@pytest.fixture(scope="module")
def s2s() -> TransformerEncoderDecoder:
    return TransformerEncoderDecoder(_cfg("encoder_decoder", tgt_vocab_size=5)).eval()


def _qkv(t=3, s=4, dk=4, dv=4, dtype=torch.float32):
    return (
        torch.randn(1, 2, t, dk, dtype=dtype),
        torch.randn(1, 2, s, dk, dtype=dtype),
        torch.randn(1, 2, s, dv, dtype=dtype),
    )


# --------------------------------------------------------------------------- widths and heads


def test_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_heads=3"):
        SelfAttention(10, 3)
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by n_heads=4"):
        CrossAttention(10, 4)
    with pytest.raises(ValueError, match=r"d_model=10 must be divisible by n_heads=3.*try n_heads"):
        ModelConfig(d_model=10, n_heads=3)
    assert SelfAttention(10, 3, d_head=4).d_head == 4  # the suggested fix works


def test_query_key_width_mismatch():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"query width d_q=4 must equal key width d_k=5"):
        scaled_dot_product_attention(q, torch.randn(1, 2, 4, 5), v)
    with pytest.raises(ValueError, match=r"keys \(4\) and values \(3\) must have equal length"):
        scaled_dot_product_attention(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match=r"must agree on \(B, H\)"):
        scaled_dot_product_attention(q, k, torch.randn(1, 3, 4, 4))
    with pytest.raises(ValueError, match=r"q must have shape \(B, H, L, D\)"):
        scaled_dot_product_attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, 8\), got \(2, 3, 7\)"):
        SelfAttention(D, 2)(torch.randn(2, 3, 7))
    with pytest.raises(ValueError, match=r"memory must have shape \(B, L, 5\)"):
        CrossAttention(D, 2, d_memory=5)(torch.randn(2, 3, D), torch.randn(2, 4, D))
    with pytest.raises(ValueError, match=r"memory batch 3 != query batch 2"):
        CrossAttention(D, 2)(torch.randn(2, 3, D), torch.randn(3, 4, D))
    with pytest.raises(ValueError, match="needs memory"):
        CrossAttention(D, 2)(torch.randn(2, 3, D))


# --------------------------------------------------------------------------- masks


def test_mask_not_broadcastable():
    q, k, v = _qkv()
    with pytest.raises(
        ValueError, match=r"mask of shape \(2, 4\) does not broadcast .* = \(1, 2, 3, 4\)"
    ):
        scaled_dot_product_attention(q, k, v, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask has 5 dims"):
        scaled_dot_product_attention(q, k, v, torch.ones(1, 1, 1, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"does not broadcast"):
        SelfAttention(D, 2)(torch.randn(2, 3, D), torch.ones(2, 1, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key padding mask must be \(B, S\)"):
        padding_mask(torch.ones(2, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least as many keys as queries, got T=4 S=3"):
        scaled_dot_product_attention(*_qkv(t=4, s=3), causal=True)
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        causal_mask(5, 2)
    with pytest.raises(ValueError, match="needs T >= 0 queries, got T=-1"):
        causal_mask(-1)
    with pytest.raises(ValueError, match=r"\(2, 1, 3, 4\) does not broadcast .* = \(1, 2, 3, 4\)"):
        # it would broadcast, but only by doubling the batch of the scores
        scaled_dot_product_attention(q, k, v, torch.ones(2, 1, 3, 4, dtype=torch.bool))


def test_attention_options_named_when_wrong():
    q, k, v = _qkv()
    with pytest.raises(
        ValueError, match=r"bias of shape \(3, 5\) does not broadcast .* \(1, 2, 3, 4\)"
    ):
        scaled_dot_product_attention(q, k, v, bias=torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"bias of shape \(2, 2, 3, 4\) does not broadcast"):
        scaled_dot_product_attention(q, k, v, bias=torch.zeros(2, 2, 3, 4))
    with pytest.raises(TypeError, match="bias must be a float tensor"):
        scaled_dot_product_attention(q, k, v, bias=torch.zeros(3, 4, dtype=torch.bool))
    for p in (2.0, -0.1, 1.0, "0.1"):
        with pytest.raises(ValueError, match=r"dropout_p=.* must be a probability in \[0, 1\)"):
            scaled_dot_product_attention(q, k, v, dropout_p=p)
    for scale in ("x", float("nan"), None):
        with pytest.raises(
            ValueError, match=r"scale=.*: give True .*, False .* or a finite number"
        ):
            scaled_dot_product_attention(q, k, v, scale=scale)
    out = scaled_dot_product_attention(q, k, v, bias=torch.zeros(2, 3, 4), scale=0.5).out
    assert out.shape == (1, 2, 3, 4)  # a bias over (H, T, S) broadcasts over the batch
    with pytest.raises(
        ValueError, match=r"rotary positions of shape \(4,\) do not fit .* \(3,\) or \(1, 3\)"
    ):
        RotaryPositions(4).rotate(q, torch.arange(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_mask_wrong_dtype(dtype, lm):
    q, k, v = _qkv()
    with pytest.raises(
        TypeError, match=r"mask must be a bool tensor \(True = may attend\).*\.bool\(\)"
    ):
        scaled_dot_product_attention(q, k, v, torch.ones(3, 4, dtype=dtype))
    with pytest.raises(TypeError, match="key_padding_mask must be a bool tensor"):
        lm(torch.ones(1, 3, dtype=torch.long), key_padding_mask=torch.ones(1, 3, dtype=dtype))
    with pytest.raises(TypeError, match="mask must be a torch.Tensor, got list"):
        scaled_dot_product_attention(q, k, v, [[True] * 4] * 3)


def test_padding_mask_shape_must_match_ids(lm, s2s):
    ids = torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 4\) but the ids have"):
        lm(ids, key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="src_mask has shape"):
        s2s(ids, ids, src_mask=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="entirely padding"):
        s2s(ids, ids, src_mask=torch.tensor([[True, True, False], [False, False, False]]))


# --------------------------------------------------------------------------- lengths


def test_sequence_longer_than_learned_table_or_max_len(lm, s2s):
    with pytest.raises(ValueError, match="beyond the learned position table.*max_len=4"):
        LearnedPositions(4, D)(torch.randn(1, 5, D), torch.arange(5))
    with pytest.raises(ValueError, match=r"length 9 exceeds the model's context window max_len=8"):
        lm(torch.ones(1, 9, dtype=torch.long))
    sinusoidal = DecoderLM(_cfg(positional="sinusoidal"))  # no table, but max_len still binds
    with pytest.raises(ValueError, match="max_len=8; crop the input"):
        sinusoidal(torch.ones(1, 9, dtype=torch.long))
    cache = lm.new_cache(1, 8)
    lm(torch.ones(1, 6, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="length 10 exceeds"):
        lm(torch.ones(1, 4, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="source ids has length 9 but the model accepts at most"):
        s2s(torch.ones(1, 9, dtype=torch.long), torch.ones(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="target length 9 exceeds max_len=8"):
        s2s(torch.ones(1, 2, dtype=torch.long), torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="at most max_len=8"):
        TransformerEncoder(_cfg("encoder"))(torch.ones(1, 9, dtype=torch.long))


def test_kv_cache_overflow(lm):
    cache = lm.new_cache(1, 3)
    lm(torch.ones(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="KV cache overflow: 4 positions but the cache holds 3"):
        lm(torch.ones(1, 1, dtype=torch.long), cache=cache)
    with pytest.raises(
        ValueError, match=r"holds a batch of 1 sequences, the new keys 2: .*new_cache\(2"
    ):
        lm(torch.ones(2, 1, dtype=torch.long), cache=lm.new_cache(1, 3))


def test_token_types_outside_the_segments():
    bert = TransformerEncoder(_cfg("encoder", n_token_types=2))
    with pytest.raises(ValueError, match=r"segment ids in \[0, 2\), got values from 0 to 4"):
        bert(torch.ones(1, 3, dtype=torch.long), token_types=torch.tensor([[0, 1, 4]]))


# --------------------------------------------------------------------------- token ids


def test_token_ids_outside_the_vocabulary(lm, s2s):
    with pytest.raises(ValueError, match=r"token id 13 outside the vocabulary \[0, 13\)"):
        lm(torch.tensor([[1, 13]]))
    with pytest.raises(ValueError, match=r"token id -1 outside the vocabulary"):
        lm(torch.tensor([[-1, 2]]))
    with pytest.raises(ValueError, match=r"target ids contains token id 5 outside .*\[0, 5\)"):
        s2s(torch.tensor([[1, 12]]), torch.tensor([[1, 5]]))  # separate target vocabulary
    clf = EncoderClassifier(_cfg("classifier", n_classes=2))
    with pytest.raises(ValueError, match="token id 99 outside"):
        clf(torch.tensor([[99]]))


def test_empty_sequences(lm, s2s):
    empty = torch.zeros(2, 0, dtype=torch.long)
    with pytest.raises(ValueError, match=r"ids is an empty sequence \(T=0\); give at least one"):
        lm(empty)
    with pytest.raises(ValueError, match="source ids is an empty sequence"):
        s2s(empty, torch.ones(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="target ids is an empty sequence"):
        s2s(torch.ones(2, 1, dtype=torch.long), empty)
    with pytest.raises(ValueError, match=r"empty key sequence \(S=0\)"):
        scaled_dot_product_attention(*_qkv(s=0))
    with pytest.raises(ValueError, match=r"x is an empty sequence \(L=0\)"):
        SelfAttention(D, 2)(torch.randn(2, 0, D))


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_non_integer_token_ids(dtype, lm):
    with pytest.raises(TypeError, match="must hold integer token ids, got dtype"):
        lm(torch.ones(1, 3, dtype=dtype))
    with pytest.raises(TypeError, match="must be a torch.Tensor of token ids, got list"):
        lm([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"ids must have shape \(B, T\), got \(3,\)"):
        lm(torch.ones(3, dtype=torch.long))


def test_int32_token_ids_are_accepted(lm):
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(lm(ids.int()).logits, lm(ids).logits)


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8])
def test_small_integer_ids_work_or_are_rejected_clearly(dtype, lm):
    ids = torch.tensor([[1, 2, 3]])
    try:
        out = lm(ids.to(dtype)).logits
    except TypeError as err:
        assert "token ids" in str(err)
    else:
        torch.testing.assert_close(out, lm(ids).logits)


def test_integer_or_mixed_activations():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="q must be a floating-point tensor, got torch.int64"):
        scaled_dot_product_attention(q.long(), k, v)
    with pytest.raises(TypeError, match="q, k, v dtypes differ"):
        scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        scaled_dot_product_attention(q, k.tolist(), v)
    with pytest.raises(TypeError, match="x must be floating point, got torch.int64"):
        SelfAttention(D, 2)(torch.ones(1, 3, D, dtype=torch.long))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        SelfAttention(D, 2)(None)


# --------------------------------------------------------------------------- other arguments


def test_unknown_choices_in_modules():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="activation must be 'softmax' or 'hardmax', got 'top1'"):
        scaled_dot_product_attention(q, k, v, activation="top1")
    with pytest.raises(ValueError, match=r"unknown activation 'swish'; choose from"):
        FeedForward(D, 16, activation="swish")
    with pytest.raises(ValueError, match="without an output projection the width is H\\*Dv=8"):
        SelfAttention(D, 2, out_proj=False, d_out=6)


@pytest.mark.parametrize("n_heads", [0, -2])
def test_non_positive_heads_in_modules(n_heads):
    with pytest.raises(ValueError, match="n_heads"):
        SelfAttention(D, n_heads)
    with pytest.raises(ValueError, match="n_heads"):
        CrossAttention(D, n_heads)


@pytest.mark.parametrize(
    "positions",
    [torch.tensor([-1, 0, 1]), torch.arange(3.0), torch.arange(4), torch.zeros(2, 3).long()],
    ids=["negative", "float", "too_long", "wrong_batch"],
)
def test_explicit_positions_are_validated(positions, lm):
    with pytest.raises((ValueError, TypeError), match="positions"):
        lm(torch.ones(1, 3, dtype=torch.long), positions=positions)


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"d_modle": 64}, r"unknown ModelConfig key\(s\) \['d_modle'\]; valid keys are: kind,"),
        ({"kind": "gpt"}, r"ModelConfig.kind='gpt' is not one of \['decoder_lm'"),
        ({"positional": "xpos"}, r"ModelConfig.positional='xpos' is not one of"),
        ({"norm_placement": "middle"}, "norm_placement='middle'"),
        ({"n_heads": 0}, r"ModelConfig.n_heads=0 must be a positive int"),
        ({"vocab_size": 2.5}, r"ModelConfig.vocab_size=2.5 must be a positive int"),
        ({"max_len": True}, r"ModelConfig.max_len=True must be a positive int"),
        ({"d_head": -1}, r"ModelConfig.d_head=-1 must be a positive int or None"),
        ({"d_ff": "64"}, r"ModelConfig.d_ff='64' must be a positive int or None"),
        ({"dropout": 1.0}, r"ModelConfig.dropout=1.0 must be in \[0, 1\)"),
        ({"ffn_mult": 0}, r"ModelConfig.ffn_mult=0 must be > 0"),
        ({"kind": "classifier"}, "a classifier needs n_classes >= 2"),
        ({"positional": "rotary", "d_model": 6, "n_heads": 2}, "even d_head, got 3"),
        ({"pad_id": 300}, "pad_id=300 must be a token id below 256"),
        ({"attn_logit_softcap": 0.0}, r"attn_logit_softcap=0.0 must be a finite number > 0"),
        ({"final_logit_softcap": float("inf")}, r"final_logit_softcap=inf must be a finite"),
        ({"attn_logit_softcap": "50"}, r"attn_logit_softcap='50' must be of type float or None"),
        ({"kind": "encoder", "final_logit_softcap": 30.0}, "caps a decoder-only LM's output"),
        ({"full_attn_every": 2}, r"full_attn_every=2 .* but attn_window is None"),
        ({"attn_window": 4, "full_attn_every": 0}, r"full_attn_every=0 must be a positive int"),
        ({"attn_window": 4, "full_attn_every": 1}, r"full_attn_every=1 .* set attn_window=None"),
    ],
)
def test_bad_config_values_and_unknown_keys(changes, message):
    with pytest.raises(ValueError, match=message):
        from_dict(ModelConfig, changes)


def test_config_must_be_a_dict_and_build_needs_a_config():
    with pytest.raises(TypeError, match="ModelConfig settings must be a table/dict, got list"):
        from_dict(ModelConfig, [("d_model", 8)])
    with pytest.raises(TypeError, match="build_model needs a ModelConfig, got dict"):
        build_model({"kind": "decoder_lm"})
    assert from_dict(ModelConfig, _cfg().to_dict()) == _cfg()  # round trip


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"norm_eps": -1.0}, "norm_eps"),
        ({"norm_eps": "1e-5"}, "norm_eps"),
        ({"rope_base": 0.0}, "rope_base"),
        ({"dropout": "0.1"}, "dropout"),
        ({"ffn_mult": 0.01, "d_model": 8, "n_heads": 2}, "ff"),
    ],
)
def test_config_float_fields_are_validated(changes, field):
    with pytest.raises((ValueError, TypeError), match=field):
        ModelConfig(**changes)
