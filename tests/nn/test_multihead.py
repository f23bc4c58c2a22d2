"""Multi-head attention (004 eq. 13; 000 "Multi-head Self-Attention", "Cross-Attention"; 002).

Parity with the NumPy oracle in float64 (1e-10), with ``torch.nn.MultiheadAttention`` in float32
(1e-5, weights copied), loop form vs fused form, and gradcheck. Shapes: B batch, T queries,
S keys, D d_model, H heads, Dk / Dv per-head widths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from attnlab import reference as ref
from attnlab.nn import (
    CrossAttention,
    KVCache,
    LoopMultiHeadAttention,
    RotaryPositions,
    SelfAttention,
    scaled_dot_product_attention,
)
from attnlab.nn.masks import causal_mask
from oracle_params import TOL32, TOL64, to_np

B, T, S, D, H = 2, 4, 6, 8, 2


def _heads(w: torch.Tensor, n_heads: int) -> list[np.ndarray]:
    """A fused nn.Linear weight (H*d, d_in) or bias (H*d,) -> per-head row-vector blocks."""
    return ref.split_heads_weights(to_np(w.T if w.dim() == 2 else w), n_heads)


def _ref_kwargs(attn, q_w, q_b, k_w, k_b, v_w, v_b) -> dict:
    h = attn.n_heads
    kw = {"Wq": _heads(q_w, h), "Wk": _heads(k_w, h), "Wv": _heads(v_w, h)}
    if q_b is not None:
        kw.update(bq=_heads(q_b, h), bk=_heads(k_b, h), bv=_heads(v_b, h))
    if attn.out_proj is not None:
        kw["Wo"] = to_np(attn.out_proj.weight.T)
        if attn.out_proj.bias is not None:
            kw["bo"] = to_np(attn.out_proj.bias)
    return kw


def _self_kwargs(attn: SelfAttention) -> dict:
    hk, hv = attn.n_heads * attn.d_head, attn.n_heads * attn.d_v
    w, b = attn.qkv_proj.weight, attn.qkv_proj.bias  # rows [q heads | k heads | v heads]
    ws = w.split([hk, hk, hv])
    bs = b.split([hk, hk, hv]) if b is not None else (None, None, None)
    return _ref_kwargs(attn, ws[0], bs[0], ws[1], bs[1], ws[2], bs[2])


def _cross_kwargs(attn: CrossAttention) -> dict:
    hk, hv = attn.n_heads * attn.d_head, attn.n_heads * attn.d_v
    kw, vw = attn.kv_proj.weight.split([hk, hv])  # rows [k heads | v heads]
    kb, vb = attn.kv_proj.bias.split([hk, hv]) if attn.kv_proj.bias is not None else (None, None)
    return _ref_kwargs(attn, attn.q_proj.weight, attn.q_proj.bias, kw, kb, vw, vb)


def _lengths_mask(lengths: list[int], s: int) -> torch.Tensor:
    return torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]  # (B, S) True = real


# --------------------------------------------------------------------------- NumPy oracle


@pytest.mark.parametrize(
    "opts",
    [{}, {"d_head": 3, "d_v": 5}, {"d_out": 7}, {"out_proj": False, "d_v": 3}, {"bias": False}],
    ids=["default", "dk!=dv", "d_out", "concat_only", "no_bias"],
)
@pytest.mark.parametrize("masking", ["none", "padding", "causal+padding"])
def test_self_attention_matches_reference(opts, masking):
    attn = SelfAttention(D, H, **opts).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    real = _lengths_mask([T, T - 1], T)
    mask = {
        "none": None,
        "padding": real[:, None, None, :],
        "causal+padding": causal_mask(T) & real[:, None, None, :],
    }[masking]  # (B, 1, T|1, T)
    got = attn(x, mask, need_weights=True)
    assert got.out.shape == (B, T, attn.d_out)
    kw = _self_kwargs(attn)
    for b in range(B):
        out, weights = ref.multi_head_attention(
            to_np(x[b]), None, **kw, mask=None if mask is None else to_np(mask[b, 0])
        )
        np.testing.assert_allclose(to_np(got.out[b]), out, **TOL64)
        np.testing.assert_allclose(to_np(got.weights[b]), weights, **TOL64)


@pytest.mark.parametrize("opts", [{}, {"d_memory": 5, "d_head": 3, "d_v": 2, "d_out": 6}])
def test_cross_attention_matches_reference(opts):
    attn = CrossAttention(D, H, **opts).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    memory = torch.randn(B, S, attn.d_memory, dtype=torch.float64)  # T != S
    real = _lengths_mask([S, 3], S)
    got = attn(x, memory, real[:, None, None, :], need_weights=True)
    kw = _cross_kwargs(attn)
    for b in range(B):
        out, weights = ref.multi_head_attention(
            to_np(x[b]), to_np(memory[b]), **kw, mask=to_np(real[b])
        )
        np.testing.assert_allclose(to_np(got.out[b]), out, **TOL64)
        np.testing.assert_allclose(to_np(got.weights[b]), weights, **TOL64)


def test_qk_norm_matches_reference_composed_per_head():
    """qk_norm: q^(l) <- RMSNorm(q^(l)), k^(l) <- RMSNorm(k^(l)) per head, then eq. 9."""
    attn = SelfAttention(D, H, qk_norm=True).double()
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
        attn.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(1, T, D, dtype=torch.float64)
    kw = _self_kwargs(attn)
    xs, heads = to_np(x[0]), []
    for l in range(H):
        q = ref.rms_norm(xs @ kw["Wq"][l] + kw["bq"][l], to_np(attn.q_norm.weight), attn.q_norm.eps)
        k = ref.rms_norm(xs @ kw["Wk"][l] + kw["bk"][l], to_np(attn.k_norm.weight), attn.k_norm.eps)
        heads.append(ref.attention(q, k, xs @ kw["Wv"][l] + kw["bv"][l]).out)
    expected = np.concatenate(heads, axis=-1) @ kw["Wo"] + kw["bo"]
    np.testing.assert_allclose(to_np(attn(x).out[0]), expected, **TOL64)


def test_rotary_self_attention_matches_reference_composed_per_head():
    """RoPE: q^(l)_m <- R_m q^(l)_m, k^(l)_n <- R_n k^(l)_n (rotate-half), then eq. 9."""
    rot = RotaryPositions(D // H)
    attn = SelfAttention(D, H, pos_enc=rot).double()
    x = torch.randn(1, T, D, dtype=torch.float64)
    positions = torch.tensor([0, 2, 5, 11])
    kw = _self_kwargs(attn)
    xs, pos, heads = to_np(x[0]), positions.numpy(), []
    for l in range(H):
        q = ref.rotary(xs @ kw["Wq"][l] + kw["bq"][l], pos)
        k = ref.rotary(xs @ kw["Wk"][l] + kw["bk"][l], pos)
        heads.append(ref.attention(q, k, xs @ kw["Wv"][l] + kw["bv"][l], ref.causal_mask(T)).out)
    expected = np.concatenate(heads, axis=-1) @ kw["Wo"] + kw["bo"]
    got = attn(x, causal=True, positions=positions).out[0]
    np.testing.assert_allclose(to_np(got), expected, **TOL64)


# --------------------------------------------------------------------------- nn.MultiheadAttention


def _torch_mha_from_self(attn: SelfAttention) -> nn.MultiheadAttention:
    mha = nn.MultiheadAttention(D, H, batch_first=True, dropout=0.0)
    with torch.no_grad():  # torch packs [W_q; W_k; W_v]: the same row layout as qkv_proj
        mha.in_proj_weight.copy_(attn.qkv_proj.weight)
        mha.in_proj_bias.copy_(attn.qkv_proj.bias)
        mha.out_proj.load_state_dict(attn.out_proj.state_dict())
    return mha.eval()


@pytest.mark.parametrize("masking", ["none", "padding", "causal", "causal+padding"])
def test_self_attention_matches_torch_multihead(masking):
    attn = SelfAttention(D, H).eval()
    mha = _torch_mha_from_self(attn)
    x = torch.randn(B, T, D)
    real = _lengths_mask([T, 2], T)  # (B, T) True = real token
    use_pad, use_causal = "padding" in masking, "causal" in masking
    ours = attn(
        x, real[:, None, None, :] if use_pad else None, causal=use_causal, need_weights=True
    )
    theirs, theirs_w = mha(  # torch: True = ignore, so both masks are inverted here only
        x,
        x,
        x,
        key_padding_mask=~real if use_pad else None,
        attn_mask=~causal_mask(T) if use_causal else None,
        average_attn_weights=False,
    )
    torch.testing.assert_close(ours.out, theirs, **TOL32)
    torch.testing.assert_close(ours.weights, theirs_w, **TOL32)
    fused = attn(x, real[:, None, None, :] if use_pad else None, causal=use_causal)
    torch.testing.assert_close(fused.out, theirs, **TOL32)


@pytest.mark.parametrize("d_memory", [D, 5], ids=["same_width", "kdim"])
def test_cross_attention_matches_torch_multihead(d_memory):
    attn = CrossAttention(D, H, d_memory=d_memory).eval()
    kdim = None if d_memory == D else d_memory
    mha = nn.MultiheadAttention(D, H, batch_first=True, kdim=kdim, vdim=kdim).eval()
    with torch.no_grad():
        if kdim is None:
            mha.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.kv_proj.weight]))
        else:  # separate projections when the memory width differs
            mha.q_proj_weight.copy_(attn.q_proj.weight)
            mha.k_proj_weight.copy_(attn.kv_proj.weight[:D])
            mha.v_proj_weight.copy_(attn.kv_proj.weight[D:])
        mha.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.kv_proj.bias]))
        mha.out_proj.load_state_dict(attn.out_proj.state_dict())
    x, memory = torch.randn(B, T, D), torch.randn(B, S, d_memory)
    real = _lengths_mask([S, 3], S)
    ours = attn(x, memory, real[:, None, None, :], need_weights=True)
    theirs, theirs_w = mha(x, memory, memory, key_padding_mask=~real, average_attn_weights=False)
    torch.testing.assert_close(ours.out, theirs, **TOL32)
    torch.testing.assert_close(ours.weights, theirs_w, **TOL32)


# --------------------------------------------------------------------------- forms and variants


@pytest.mark.parametrize(
    "opts",
    [{}, {"d_head": 3, "d_v": 5, "d_out": 6}, {"out_proj": False}, {"bias": False}],
    ids=["default", "dk_dv_dout", "concat_only", "no_bias"],
)
@pytest.mark.parametrize("causal", [False, True])
def test_loop_form_equals_fused_form(opts, causal):
    """000: multi-head attention costs one batched matmul; the per-head loop gives the same."""
    attn = SelfAttention(D, 4, **opts)
    loop = LoopMultiHeadAttention.from_fused(attn)
    x = torch.randn(B, T, D)
    mask = _lengths_mask([T, 3], T)[:, None, None, :]
    torch.testing.assert_close(
        loop(x, mask, causal=causal), attn(x, mask, causal=causal).out, **TOL32
    )


def test_concat_only_variant_is_the_concatenation_of_heads():
    """002: without W^O the output is [head_1; ...; head_H], width H * Dv."""
    attn = SelfAttention(D, H, out_proj=False, d_v=3).double()
    assert attn.out_proj is None and attn.d_out == H * 3
    x = torch.randn(1, T, D, dtype=torch.float64)
    kw = _self_kwargs(attn)
    assert "Wo" not in kw
    got = attn(x).out[0]
    heads = [
        ref.attention(
            to_np(x[0]) @ kw["Wq"][l] + kw["bq"][l],
            to_np(x[0]) @ kw["Wk"][l] + kw["bk"][l],
            to_np(x[0]) @ kw["Wv"][l] + kw["bv"][l],
        ).out
        for l in range(H)
    ]
    for l in range(H):
        np.testing.assert_allclose(to_np(got[:, 3 * l : 3 * (l + 1)]), heads[l], **TOL64)


def test_one_head_is_single_head_attention():
    attn = SelfAttention(D, 1).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    q, k, v = attn.qkv_proj(x).chunk(3, dim=-1)  # (B, T, D) each
    single = scaled_dot_product_attention(q[:, None], k[:, None], v[:, None]).out[:, 0]
    torch.testing.assert_close(attn(x).out, attn.out_proj(single), rtol=1e-12, atol=1e-12)


def test_kv_cache_step_by_step_equals_causal_full_pass():
    attn = SelfAttention(D, H, d_v=3).eval()
    x = torch.randn(B, T, D)
    full = attn(x, causal=True).out
    cache = KVCache(B, H, T, attn.d_head, attn.d_v)
    steps = [attn(x[:, i : i + 1], causal=True, cache=cache).out for i in range(T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL32)
    assert cache.length == T


def test_cross_attention_reuses_projected_memory():
    attn = CrossAttention(D, H)
    x, memory = torch.randn(B, T, D), torch.randn(B, S, D)
    kv = attn.project_memory(memory)
    assert kv[0].shape == (B, H, S, D // H) and kv[1].shape == (B, H, S, D // H)
    torch.testing.assert_close(attn(x, memory_kv=kv).out, attn(x, memory).out)


def test_dropout_only_in_training():
    attn = SelfAttention(D, H, dropout=0.5)
    x = torch.randn(B, T, D)
    attn.eval()
    torch.testing.assert_close(attn(x).out, attn(x).out)
    attn.train()
    assert not torch.allclose(attn(x).out, attn(x).out)


# --------------------------------------------------------------------------- gradients


def test_gradcheck_self_attention_inputs_and_weights():
    attn = SelfAttention(6, 2, d_v=2, qk_norm=True).double()
    x = torch.randn(1, 3, 6, dtype=torch.float64, requires_grad=True)
    w = attn.qkv_proj.weight.detach().clone().requires_grad_()
    mask = _lengths_mask([2], 3)[:, None, None, :]

    def f(x, w):
        return torch.func.functional_call(
            attn, {"qkv_proj.weight": w}, (x, mask), {"causal": True}
        ).out

    assert torch.autograd.gradcheck(f, (x, w))


def test_gradcheck_cross_attention_inputs_memory_and_weights():
    attn = CrossAttention(6, 2, d_memory=4).double()
    x = torch.randn(1, 2, 6, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    w = attn.kv_proj.weight.detach().clone().requires_grad_()
    mask = _lengths_mask([2], 3)[:, None, None, :]

    def f(x, memory, w):
        return torch.func.functional_call(attn, {"kv_proj.weight": w}, (x, memory, mask)).out

    assert torch.autograd.gradcheck(f, (x, memory, w))
