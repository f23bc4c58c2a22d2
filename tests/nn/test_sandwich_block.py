"""The sandwich block (attnlab.nn.sandwich, Gemma 2/3) against the NumPy oracle in float64:

    h  = x + RMSNorm_post_attn(MultiHead(RMSNorm_attn(x)))      (causal)
    x' = h + RMSNorm_post_ffn(FFN(RMSNorm_ffn(h)))

each piece computed by ``attnlab.reference`` (multi-head attention, RMSNorm, feed-forward)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.models.layers import make_causal_block
from attnlab.nn.sandwich import SandwichBlock
from oracle_params import attn_params, to_np

T, D = 6, 8


def test_sandwich_block_matches_the_reference_composition():
    cfg = ModelConfig(
        d_model=D, n_heads=2, d_ff=12, norm="rmsnorm", norm_placement="sandwich", norm_eps=1e-6
    )
    torch.manual_seed(0)
    block = make_causal_block(cfg, None).double().eval()
    assert isinstance(block, SandwichBlock)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(1, T, D, dtype=torch.float64)
    got = to_np(block(x).x[0])

    def norm(name, a):
        return ref.rms_norm(a, to_np(getattr(block, name).weight), eps=cfg.norm_eps)

    ffn = block.ffn
    a = to_np(x[0])
    attn = ref.multi_head_attention(
        norm("self_attn_norm", a), None, **attn_params(block.self_attn), mask=ref.causal_mask(T)
    ).out
    h = a + norm("post_attn_norm", attn)
    f = ref.feed_forward(
        norm("ffn_norm", h),
        to_np(ffn.up.weight.T),
        to_np(ffn.up.bias),
        to_np(ffn.down.weight.T),
        to_np(ffn.down.bias),
    )
    np.testing.assert_allclose(got, h + norm("post_ffn_norm", f), rtol=1e-10, atol=1e-10)


def test_sandwich_placement_is_for_decoder_only_models():
    with pytest.raises(ValueError, match="norm_placement='sandwich'.*decoder-only"):
        ModelConfig(kind="encoder", norm_placement="sandwich")
