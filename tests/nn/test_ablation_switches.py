"""The ablation switches of ModelConfig: ``qkv_proj=False`` (001's basic, parameter-free
self-attention), ``norm="none"`` and ``ffn="none"`` -- each builds the model the notes describe
without that part, and nothing else changes.

Shapes: B batch, T positions, D d_model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.errors import ConfigValueError
from attnlab.models import build_model
from attnlab.nn import SelfAttention

TINY = dict(kind="decoder_lm", vocab_size=11, d_model=16, n_heads=2, n_layers=2, max_len=8)


def test_parameter_free_attention_is_001s_basic_self_attention():
    """Y = softmax(X X^T) X, the NumPy oracle of 001, in float64; no parameters at all."""
    attn = SelfAttention(6, 1, qkv_proj=False, out_proj=False, scale=False).double()
    assert attn.qkv_proj is None and not list(attn.parameters())
    x = torch.randn(3, 5, 6, dtype=torch.float64)  # (B, T, D)
    out = attn(x).out
    for b in range(3):
        np.testing.assert_allclose(
            out[b].numpy(), ref.basic_self_attention(x[b].numpy()), rtol=1e-10, atol=1e-10
        )


def test_parameter_free_heads_split_x_as_projections_would():
    """With H heads, head h attends with the slice x[:, h Dk:(h+1) Dk] as query, key, value;
    causal, scaled by 1/sqrt(Dk)."""
    attn = SelfAttention(8, 2, qkv_proj=False, out_proj=False).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    out = attn(x, causal=True).out  # (B, T, D)
    mask = ref.causal_mask(4)
    for b in range(2):
        for h in range(2):
            xs = x[b, :, 4 * h : 4 * h + 4].numpy()
            want = ref.attention(xs, xs, xs, mask=mask).out
            np.testing.assert_allclose(out[b, :, 4 * h : 4 * h + 4].numpy(), want, atol=1e-10)


def test_parameter_free_attention_needs_heads_that_split_d_model():
    with pytest.raises(ValueError, match="qkv_proj=False"):
        SelfAttention(8, 2, qkv_proj=False, d_head=8)
    with pytest.raises(ConfigValueError, match="qkv_proj=False"):
        ModelConfig(**TINY, qkv_proj=False, n_kv_heads=1)


def test_model_without_projections_norms_or_ffn():
    """Each switch removes exactly its part's parameters, and the model still runs."""
    base = build_model(ModelConfig(**TINY))
    names = {n for n, _ in base.named_parameters()}
    ids = torch.randint(0, 11, (2, 8))
    for field, part in (("qkv_proj", "qkv_proj"), ("norm", "norm"), ("ffn", "ffn")):
        value = False if field == "qkv_proj" else "none"
        model = build_model(ModelConfig(**TINY, **{field: value}))
        kept = {n for n, _ in model.named_parameters()}
        assert kept == {n for n in names if part not in n}, field
        assert model(ids).logits.shape == (2, 8, 11)


def test_no_norm_and_no_ffn_blocks_compute_the_stream_by_hand():
    """Pre-norm block without norms: h = x + Attn(x), out = h + FFN(h); without the FFN:
    out = h, with h = x + Attn(LN(x))."""
    x = torch.randn(2, 8, 16)
    for field, expect in (("norm", "no norm"), ("ffn", "no ffn")):
        model = build_model(ModelConfig(**TINY, **{field: "none"}))
        block = model.blocks[0]
        with torch.no_grad():
            out = block(x).x
            if expect == "no norm":
                h = x + block.self_attn(x, causal=True).out
                want = h + block.ffn(h)
            else:
                want = x + block.self_attn(block.self_attn_norm(x), causal=True).out
        torch.testing.assert_close(out, want)


def test_switches_are_config_choices_with_clear_errors():
    with pytest.raises(ConfigValueError, match="norm"):
        ModelConfig(**TINY, norm="off")
    assert ModelConfig(**TINY, ffn="none").ffn == "none"


def test_parameter_free_classifier_on_the_engine_equals_the_plain_form():
    """The engine's packed rows (N, D) get q = k = v = x as the plain (B, T, D) form does."""
    import copy

    from attnlab.fast import accelerate
    from attnlab.fast.packing import GROUP_ROWS

    torch.manual_seed(0)
    cfg = ModelConfig(kind="classifier", vocab_size=40, d_model=16, n_heads=2, n_layers=2,
                      n_classes=3, max_len=24, pooling="mean", qkv_proj=False)  # fmt: skip
    plain = build_model(cfg).double().eval()
    fast = accelerate(copy.deepcopy(plain)).eval()
    lengths = torch.randint(1, 21, (3 * GROUP_ROWS,), generator=torch.Generator().manual_seed(3))
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]  # (B, T) True = real
    ids = torch.randint(3, 40, mask.shape, generator=torch.Generator().manual_seed(4))
    want = plain(ids, key_padding_mask=mask).logits
    torch.testing.assert_close(fast(ids, key_padding_mask=mask).logits, want)
