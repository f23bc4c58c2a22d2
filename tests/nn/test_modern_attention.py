"""Grouped-query / multi-query attention, ALiBi and sliding windows inside SelfAttention and the
models: against the NumPy oracle (float64), and the invariants (causality, padding invariance,
cache vs no cache, a KV cache holding only the key/value heads and only the window).

Shapes: B batch, T queries, D d_model, H query heads, G key/value heads, W window.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import reference as ref
from attnlab.bench.modern import LLAMA_BLOCK
from attnlab.config import ModelConfig
from attnlab.generate import GenerationConfig, generate
from attnlab.models import build_model
from attnlab.nn import LoopMultiHeadAttention, SelfAttention
from attnlab.nn.alibi import alibi_slopes
from attnlab.nn.positional import ALiBiPositions

FAST = settings(max_examples=12, deadline=None)
VARIANTS = {
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "alibi": dict(positional="alibi"),
    "window": dict(attn_window=3),
    "llama": dict(n_kv_heads=2, **LLAMA_BLOCK),
    "alibi_gqa_window": dict(positional="alibi", n_kv_heads=1, attn_window=4),
    # Gemma 2: sliding layers alternating with full ones, soft-capped attention and output logits
    "gemma2": dict(
        n_kv_heads=2,
        positional="rotary",
        norm="rmsnorm",
        norm_placement="sandwich",
        ffn="geglu",
        activation="gelu_tanh",
        embed_scale=True,
        bias=False,
        attn_window=3,
        full_attn_every=2,
        attn_logit_softcap=1.5,
        final_logit_softcap=4.0,
    ),
}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _attention(n_kv_heads=None, alibi=False, window=None, seed=0) -> SelfAttention:
    torch.manual_seed(seed)
    scheme = ALiBiPositions(4) if alibi else None
    return SelfAttention(
        8, 4, n_kv_heads=n_kv_heads, pos_enc=scheme, window=window, bias=False
    ).double()


def _oracle(attn: SelfAttention, x: torch.Tensor, mask: np.ndarray):
    """reference.grouped_query_attention with the module's weights (one sequence (T, D))."""
    h, g, dh = attn.n_heads, attn.n_kv_heads, attn.d_head
    wq, wk, wv = attn.qkv_proj.weight.split([h * dh, g * dh, g * dh])
    split = lambda w, n: ref.split_heads_weights(_np(w.T), n)  # noqa: E731
    t = x.size(0)
    biases = None
    if attn.pos_enc is not None and attn.pos_enc.biases:
        biases = [ref.alibi_bias(m, np.arange(t), np.arange(t)) for m in ref.alibi_slopes(h)]
    return ref.grouped_query_attention(
        _np(x),
        split(wq, h),
        split(wk, g),
        split(wv, g),
        _np(attn.out_proj.weight.T),
        mask=mask,
        biases=biases,
    )


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("window", [None, 2])
def test_self_attention_variants_match_the_oracle(n_kv_heads, alibi, window):
    attn = _attention(n_kv_heads, alibi, window)
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    mask = ref.causal_mask(6) if window is None else ref.sliding_window_mask(6, 6, window)
    want = _oracle(attn, x[0], mask)
    explicit = attn(x, causal=True, need_weights=True)
    fused = attn(x, causal=True)
    np.testing.assert_allclose(_np(explicit.out[0]), want.out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(explicit.weights[0]), want.weights, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(fused.out[0]), want.out, rtol=1e-10, atol=1e-12)


def test_grouped_query_attention_equals_the_loop_form_and_shrinks_w_k_w_v():
    attn = _attention(n_kv_heads=2)
    assert attn.qkv_proj.weight.shape == (4 * 2 + 2 * 2 * 2, 8)  # H Dk + G (Dk + Dv) rows
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    loop = LoopMultiHeadAttention.from_fused(attn).double()
    torch.testing.assert_close(attn(x, causal=True).out, loop(x, causal=True))
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        SelfAttention(8, 4, n_kv_heads=3)


def test_alibi_slopes_follow_the_module_and_are_not_saved():
    attn = _attention(alibi=True)
    assert not attn.state_dict().keys() - {"qkv_proj.weight", "out_proj.weight"}
    torch.testing.assert_close(attn.pos_enc.slopes, alibi_slopes(4).double())


def _lm(variant: str, seed: int = 0, **extra):
    torch.manual_seed(seed)
    fields = dict(
        kind="decoder_lm", vocab_size=23, d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=48
    )
    cfg = ModelConfig(**{**fields, **VARIANTS[variant], **extra})
    model = build_model(cfg).double().eval()
    with torch.no_grad():  # large weights: differences would show
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.4)
    return model


@pytest.mark.parametrize("variant", list(VARIANTS))
@FAST
@given(data=st.data())
def test_future_tokens_never_change_the_past(variant, data):
    model = _lm(variant)
    t = data.draw(st.integers(2, 12))
    cut = data.draw(st.integers(1, t - 1))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    ids = torch.randint(0, 23, (2, t), generator=g)
    other = ids.clone()
    other[:, cut:] = torch.randint(0, 23, (2, t - cut), generator=g)
    torch.testing.assert_close(model(ids).logits[:, :cut], model(other).logits[:, :cut])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_left_padding_never_changes_real_positions(variant):
    model = _lm(variant)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 23, (n,), generator=g) for n in (7, 3, 5)]
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, 7 - len(s) :], mask[b, 7 - len(s) :] = s, True
    positions = (mask.cumsum(1) - 1).clamp_min(0)  # each row counts from its first real token
    batch = model(ids, key_padding_mask=mask, positions=positions).logits
    for b, s in enumerate(seqs):
        alone = model(s[None]).logits[0]
        torch.testing.assert_close(batch[b, 7 - len(s) :], alone)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cache_token_by_token_equals_the_full_forward(variant):
    """Decode 40 tokens one at a time (the window's cache is trimmed many times over) and in
    chunks; every step's logits equal the full forward's."""
    model = _lm(variant)
    ids = torch.randint(0, 23, (2, 40), generator=torch.Generator().manual_seed(1))
    full = model(ids).logits
    for chunks in ([1] * 40, [9, 1, 1, 13, 16]):
        cache = model.new_cache(2)
        got, at = [], 0
        for n in chunks:
            got.append(model(ids[:, at : at + n], cache=cache).logits)
            at += n
        torch.testing.assert_close(torch.cat(got, 1), full)


def test_the_kv_cache_holds_only_the_key_value_heads_and_only_the_window():
    mqa = _lm("mqa").new_cache(2, 48)
    assert mqa.layers[0].k.shape == (2, 1, 48, 4)  # (B, G = 1, L, Dh): 4x smaller than MHA
    assert _lm("gqa").new_cache(2, 48).layers[0].k.size(1) == 2
    model = _lm("window")
    cache = model.new_cache(1)
    for i in range(30):
        model(torch.tensor([[i % 23]]), cache=cache)
    assert cache.layers[0].k.size(2) == 2 * 3 and cache.layers[0].held <= 6


@pytest.mark.parametrize("variant", ["alibi_gqa_window", "llama", "gemma2"])
def test_generation_with_and_without_cache_agrees_on_left_padded_batches(variant):
    model = _lm(variant).float()
    prompts = [[3, 4, 5, 6, 7, 8], [9], [10, 11, 12]]
    cfg = GenerationConfig(temperature=0, max_new_tokens=20, stop_token_ids=())
    cached = generate(model, prompts, cfg).tokens
    assert cached == generate(model, prompts, cfg.replace(use_cache=False)).tokens
    for prompt, row in zip(prompts, cached):  # each row as if alone
        assert generate(model, [prompt], cfg).tokens[0] == row
    beams = generate(model, prompts, cfg.replace(num_beams=3)).tokens
    assert beams == generate(model, prompts, cfg.replace(num_beams=3, use_cache=False)).tokens


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_trains(variant):
    model = _lm(variant).float().train()
    ids = torch.randint(0, 23, (4, 12), generator=torch.Generator().manual_seed(2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        logits = model(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.7 * losses[0]


def test_alibi_models_run_past_any_position_table():
    """ALiBi has no position table: the window is the only limit (max_len)."""
    model = _lm("alibi", max_len=64)
    assert not any("pos_enc" in n for n, _ in model.named_parameters())
    assert model(torch.zeros(1, 64, dtype=torch.long)).logits.shape == (1, 64, 23)


def test_full_attn_every_alternates_windowed_and_full_layers_and_both_matter():
    """Layers k-1, 2k-1, ... attend to every key; the others to their window. Past the window
    each kind changes the logits; the cache then keeps every key (one padding mask serves all)."""
    model = _lm("gemma2", n_layers=4)
    assert [block.self_attn.window for block in model.blocks] == [3, None, 3, None]
    assert model.new_cache(1).layers[0].window is None
    ids = torch.randint(0, 23, (1, 12), generator=torch.Generator().manual_seed(5))
    logits = model(ids).logits
    for kind, window in (("all windowed", 3), ("all full", None)):
        other = _lm("gemma2", n_layers=4)  # the same weights (same seed)
        for block in other.blocks:
            block.self_attn.window = window
        assert not torch.allclose(other(ids).logits[:, 4:], logits[:, 4:]), kind
        torch.testing.assert_close(other(ids).logits[:, :3], logits[:, :3])  # inside the window


def test_final_logit_softcap_bounds_the_logits():
    model = _lm("gemma2")
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
        ids = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(6))
        logits = model(ids).logits
    assert bool((logits.abs() <= 4.0).all()) and float(logits.abs().max()) > 3.9


def test_run_with_cache_sees_the_capped_logits():
    """inspect's ``<attn>.scaled`` is what the activation gets: c tanh(Q K^T / sqrt(Dk) / c)."""
    from attnlab import inspect

    model = _lm("gemma2")
    ids = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(7))
    _, cache = inspect.run_with_cache(model, ids)
    for layer in range(2):
        scores = cache[f"blocks.{layer}.self_attn.scores"]  # (B, H, T, S)
        scaled = cache[f"blocks.{layer}.self_attn.scaled"]
        torch.testing.assert_close(scaled, 1.5 * torch.tanh(scores / 4**0.5 / 1.5))
        assert bool((scaled.abs() <= 1.5).all()) and float((scores / 2).abs().max()) > 1.5
