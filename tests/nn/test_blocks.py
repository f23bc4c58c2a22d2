"""Encoder, decoder and causal blocks (000 "Add & Norm", "Transformer Encoder-Decoder"; 003; 004).

Blocks equal ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer`` for both
``norm_first`` settings (fp32, 1e-5, copied weights), the NumPy oracle's ``encoder_block`` /
``decoder_block`` (float64, 1e-10), and the full encoder-decoder stacks equal
``torch.nn.Transformer`` fed identical embeddings.
Shapes: B batch, T target length, S source length, D d_model, H heads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.models import TransformerEncoderDecoder
from attnlab.models.layers import make_causal_block, make_decoder_block, make_encoder_block
from attnlab.nn.masks import causal_mask
from oracle_params import TOL32, TOL64, block_params, to_np

B, T, S, D, H, F = 2, 4, 5, 8, 2, 16


def _cfg(placement: str = "pre", **kw) -> ModelConfig:
    return ModelConfig(d_model=D, n_heads=H, d_ff=F, norm_placement=placement, **kw)


def _randomise(module: nn.Module) -> nn.Module:
    """Non-trivial norm gains and biases (the defaults 1 and 0 would hide wiring mistakes)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.5, 0.5)
            elif name.endswith("bias"):
                p.uniform_(-0.3, 0.3)
    return module


def _real(lengths: list[int], n: int) -> torch.Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, n) True = real


# --------------------------------------------------------------------------- weight copying


def _copy_norm(ours: nn.Module, theirs: nn.LayerNorm) -> None:
    theirs.weight.copy_(ours.weight)
    theirs.bias.copy_(ours.bias)


def _copy_ffn(ffn, layer) -> None:
    layer.linear1.load_state_dict(ffn.up.state_dict())  # W1, b1
    layer.linear2.load_state_dict(ffn.down.state_dict())  # W2, b2


@torch.no_grad()
def _copy_encoder_layer(block, layer: nn.TransformerEncoderLayer) -> None:
    layer.self_attn.in_proj_weight.copy_(block.self_attn.qkv_proj.weight)  # [W_q; W_k; W_v]
    layer.self_attn.in_proj_bias.copy_(block.self_attn.qkv_proj.bias)
    layer.self_attn.out_proj.load_state_dict(block.self_attn.out_proj.state_dict())
    _copy_ffn(block.ffn, layer)
    _copy_norm(block.self_attn_norm, layer.norm1)
    _copy_norm(block.ffn_norm, layer.norm2)


@torch.no_grad()
def _copy_decoder_layer(block, layer: nn.TransformerDecoderLayer) -> None:
    layer.self_attn.in_proj_weight.copy_(block.self_attn.qkv_proj.weight)
    layer.self_attn.in_proj_bias.copy_(block.self_attn.qkv_proj.bias)
    layer.self_attn.out_proj.load_state_dict(block.self_attn.out_proj.state_dict())
    cross = block.cross_attn  # torch: [W_q; W_k; W_v]; ours: q_proj and kv_proj = [W_k; W_v]
    layer.multihead_attn.in_proj_weight.copy_(
        torch.cat([cross.q_proj.weight, cross.kv_proj.weight])
    )
    layer.multihead_attn.in_proj_bias.copy_(torch.cat([cross.q_proj.bias, cross.kv_proj.bias]))
    layer.multihead_attn.out_proj.load_state_dict(cross.out_proj.state_dict())
    _copy_ffn(block.ffn, layer)
    _copy_norm(block.self_attn_norm, layer.norm1)
    _copy_norm(block.cross_attn_norm, layer.norm2)
    _copy_norm(block.ffn_norm, layer.norm3)


def _torch_layer(cls, norm_first: bool):
    return cls(
        D,
        H,
        dim_feedforward=F,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=norm_first,
    ).eval()


# --------------------------------------------------------------------------- vs torch layers


def _block_and_encoder_layer(make_block, placement: str):
    """Our block with random weights, and a torch.nn.TransformerEncoderLayer holding a copy."""
    block = _randomise(make_block(_cfg(placement), None)).eval()
    layer = _torch_layer(nn.TransformerEncoderLayer, placement == "pre")
    _copy_encoder_layer(block, layer)
    return block, layer


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_encoder_block_matches_torch_encoder_layer(placement):
    block, layer = _block_and_encoder_layer(make_encoder_block, placement)
    x = torch.randn(B, T, D)
    real = _real([T, 2], T)
    ours = block(x, real[:, None, None, :]).x
    theirs = layer(x, src_key_padding_mask=~real)  # torch: True = ignore
    torch.testing.assert_close(ours, theirs, **TOL32)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_causal_block_matches_torch_encoder_layer_with_causal_mask(placement):
    block, layer = _block_and_encoder_layer(make_causal_block, placement)
    x = torch.randn(B, T, D)
    theirs = layer(x, src_mask=~causal_mask(T), is_causal=True)
    torch.testing.assert_close(block(x).x, theirs, **TOL32)


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_decoder_block_matches_torch_decoder_layer(placement):
    block = _randomise(make_decoder_block(_cfg(placement), None)).eval()
    layer = _torch_layer(nn.TransformerDecoderLayer, placement == "pre")
    _copy_decoder_layer(block, layer)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    tgt_real, src_real = _real([T, 3], T), _real([S, 2], S)
    ours = block(
        x,
        memory,
        self_mask=tgt_real[:, None, None, :],
        cross_mask=src_real[:, None, None, :],
        need_weights=True,
    )
    theirs = layer(
        x,
        memory,
        tgt_mask=~causal_mask(T),
        tgt_key_padding_mask=~tgt_real,
        memory_key_padding_mask=~src_real,
        tgt_is_causal=True,
    )
    torch.testing.assert_close(ours.x, theirs, **TOL32)
    assert ours.self_weights.shape == (B, H, T, T) and ours.cross_weights.shape == (B, H, T, S)
    assert torch.all(ours.self_weights.triu(1) == 0)  # the decoder never looks ahead
    assert torch.all(ours.cross_weights[1, :, :, 2:] == 0)  # nor at source padding


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("placement", ["pre", "post"])
def test_encoder_decoder_stacks_match_torch_transformer(placement):
    """Our encoder stack + decoder blocks + final norms = nn.Transformer on the same embeddings."""
    cfg = _cfg(placement, kind="encoder_decoder", n_layers=2, n_decoder_layers=2, final_norm=True)
    model = _randomise(TransformerEncoderDecoder(cfg)).eval()
    tf = nn.Transformer(
        D,
        H,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dim_feedforward=F,
        dropout=0.0,
        batch_first=True,
        norm_first=placement == "pre",
    ).eval()
    for block, layer in zip(model.encoder.stack.blocks, tf.encoder.layers):
        _copy_encoder_layer(block, layer)
    for block, layer in zip(model.blocks, tf.decoder.layers):
        _copy_decoder_layer(block, layer)
    with torch.no_grad():
        _copy_norm(model.encoder.stack.final_norm, tf.encoder.norm)
        _copy_norm(model.final_norm, tf.decoder.norm)

    src_emb, tgt_emb = torch.randn(B, S, D), torch.randn(B, T, D)  # identical embeddings
    src_real, tgt_real = _real([S, 3], S), _real([T, 2], T)
    memory = model.encoder.stack(src_emb, src_real[:, None, None, :]).hidden
    y = tgt_emb
    for block in model.blocks:
        y = block(
            y, memory, self_mask=tgt_real[:, None, None, :], cross_mask=src_real[:, None, None, :]
        ).x
    ours = model.final_norm(y)
    theirs = tf(
        src_emb,
        tgt_emb,
        tgt_mask=~causal_mask(T),
        src_key_padding_mask=~src_real,
        tgt_key_padding_mask=~tgt_real,
        memory_key_padding_mask=~src_real,
        tgt_is_causal=True,
    )
    torch.testing.assert_close(ours, theirs, **TOL32)
    torch.testing.assert_close(memory, tf.encoder(src_emb, src_key_padding_mask=~src_real), **TOL32)


# --------------------------------------------------------------------------- vs NumPy oracle


VARIANTS = {
    "pre": {},
    "post": {"placement": "post"},
    "rms_gelu": {"norm": "rmsnorm", "activation": "gelu"},
    "dk_dv": {"d_head": 3, "d_v": 5, "placement": "post"},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_encoder_block_matches_reference(variant):
    cfg = _cfg(**VARIANTS[variant])
    block = _randomise(make_encoder_block(cfg, None)).double().eval()
    x = torch.randn(B, T, D, dtype=torch.float64)
    real = _real([T, 3], T)
    got = block(x, real[:, None, None, :]).x
    params = block_params(block, cfg)
    for b in range(B):
        expected = ref.encoder_block(
            to_np(x[b]), params, mask=to_np(real[b]), norm_first=cfg.norm_placement == "pre"
        )
        np.testing.assert_allclose(to_np(got[b]), expected, **TOL64)


def test_causal_block_matches_reference_encoder_block_with_future_mask():
    cfg = _cfg()
    block = _randomise(make_causal_block(cfg, None)).double().eval()
    x = torch.randn(1, T, D, dtype=torch.float64)
    expected = ref.encoder_block(to_np(x[0]), block_params(block, cfg), mask=ref.causal_mask(T))
    np.testing.assert_allclose(to_np(block(x).x[0]), expected, **TOL64)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoder_block_matches_reference(variant):
    cfg = _cfg(**VARIANTS[variant])
    block = _randomise(make_decoder_block(cfg, None)).double().eval()
    x, memory = torch.randn(B, T, D, dtype=torch.float64), torch.randn(B, S, D, dtype=torch.float64)
    tgt_real, src_real = _real([T, 3], T), _real([S, 2], S)
    got = block(
        x, memory, self_mask=tgt_real[:, None, None, :], cross_mask=src_real[:, None, None, :]
    ).x
    params = block_params(block, cfg)
    for b in range(B):
        expected = ref.decoder_block(
            to_np(x[b]),
            to_np(memory[b]),
            params,
            self_mask=ref.causal_mask(T) & to_np(tgt_real[b]),
            cross_mask=to_np(src_real[b]),
            norm_first=cfg.norm_placement == "pre",
        )
        np.testing.assert_allclose(to_np(got[b]), expected, **TOL64)


# --------------------------------------------------------------------------- gradients


def test_gradcheck_encoder_and_decoder_blocks():
    cfg = ModelConfig(d_model=4, n_heads=2, d_ff=6, norm_placement="post")
    enc = _randomise(make_encoder_block(cfg, None)).double()
    dec = _randomise(make_decoder_block(cfg.replace(norm_placement="pre"), None)).double()
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(1, 2, 4, dtype=torch.float64, requires_grad=True)
    mask = _real([2], 3)[:, None, None, :]
    assert torch.autograd.gradcheck(lambda x: enc(x, mask).x, (x,), fast_mode=True)
    assert torch.autograd.gradcheck(
        lambda x, m: dec(x, m, self_mask=mask).x, (x, memory), fast_mode=True
    )
