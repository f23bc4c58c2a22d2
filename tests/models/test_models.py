"""Models built from one config: DecoderLM, TransformerEncoderDecoder, EncoderClassifier,
TransformerEncoder (000, 003, 004).

Shapes for every variant, end-to-end parity with the NumPy oracle in float64, tied embeddings,
cached decoding equal to the full forward for each position kind, gradcheck of a tiny model of
each kind. Shapes: B batch, T target length, S source length, D d_model, V vocab, C classes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.models import (
    DecoderLM,
    EncoderClassifier,
    TransformerEncoder,
    TransformerEncoderDecoder,
    build_model,
)
from oracle_params import TOL32, TOL64, block_params, to_np

POSITIONS = ["learned", "sinusoidal", "concat", "rotary", "none"]
V, D, H, B, T, S = 13, 8, 2, 2, 5, 6


def _cfg(kind: str = "decoder_lm", **kw) -> ModelConfig:
    base = dict(kind=kind, vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=16, max_len=16)
    if kind == "classifier":
        base["n_classes"] = 3
    return ModelConfig(**{**base, **kw})


def _ids(b: int = B, t: int = T, vocab: int = V) -> torch.Tensor:
    return torch.randint(1, vocab, (b, t))


def _real(lengths: list[int], n: int) -> torch.Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]  # (B, n) True = real


# --------------------------------------------------------------------------- shapes and variants


VARIANTS = {
    "post": {"norm_placement": "post"},
    "rmsnorm": {"norm": "rmsnorm"},
    "qk_norm": {"qk_norm": True},
    "hardmax": {"attention": "hardmax"},
    "hardmax_no_ste": {"attention": "hardmax", "straight_through": False},
    "gelu_untied": {"activation": "gelu", "tie_embeddings": False},
    "dk_dv": {"d_head": 3, "d_v": 5},
    "no_out_proj": {"out_proj": False},
    "embed_scale_no_final_norm": {"embed_scale": True, "final_norm": False},
}


@pytest.mark.parametrize("positional", POSITIONS)
@pytest.mark.parametrize("kind", ["decoder_lm", "encoder_decoder", "classifier", "encoder"])
def test_every_kind_and_position_builds_and_runs(kind, positional):
    model = build_model(_cfg(kind, positional=positional)).eval()
    ids = _ids()
    if kind == "decoder_lm":
        assert isinstance(model, DecoderLM)
        out = model(ids, need_weights=True)
        assert out.logits.shape == (B, T, V) and len(out.attentions) == 2
        assert out.attentions[0].self_attn.shape == (B, H, T, T)
        assert out.attentions[0].cross_attn is None
    elif kind == "encoder_decoder":
        assert isinstance(model, TransformerEncoderDecoder)
        out = model(_ids(t=S), ids, need_weights=True)
        assert out.logits.shape == (B, T, V)
        assert out.attentions[1].cross_attn.shape == (B, H, T, S)
    elif kind == "classifier":
        assert isinstance(model, EncoderClassifier)
        out = model(ids)
        assert out.logits.shape == (B, 3) and out.attentions is None
    else:
        assert isinstance(model, TransformerEncoder)
        out = model(ids)
        assert out.hidden.shape == (B, T, D)
    values = out.hidden if kind == "encoder" else out.logits
    assert torch.isfinite(values).all()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoder_lm_variants(variant):
    model = DecoderLM(_cfg(**VARIANTS[variant])).eval()
    out = model(_ids(), need_weights=True)
    assert out.logits.shape == (B, T, V) and torch.isfinite(out.logits).all()
    w = out.attentions[0].self_attn
    assert torch.all(w.triu(1) == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))
    if variant.startswith("hardmax"):  # exactly one-hot, with or without the estimator
        assert torch.all((w == 0) | (w == 1))


@pytest.mark.parametrize("variant", ["post", "rmsnorm", "hardmax", "dk_dv"])
def test_encoder_decoder_variants_and_separate_target_vocab(variant):
    model = TransformerEncoderDecoder(
        _cfg("encoder_decoder", tgt_vocab_size=7, **VARIANTS[variant])
    ).eval()
    src, tgt = _ids(t=S), _ids(vocab=7)
    out = model(src, tgt, src_mask=_real([S, 4], S), tgt_mask=_real([T, 3], T))
    assert out.logits.shape == (B, T, 7) and torch.isfinite(out.logits).all()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_classifier_pooling(pooling):
    model = EncoderClassifier(_cfg("classifier", pooling=pooling)).eval()
    ids, real = _ids(), _real([T, 3], T)
    logits = model(ids, key_padding_mask=real).logits
    hidden = model.encoder(ids, key_padding_mask=real).hidden  # (B, T, D)
    if pooling == "cls":
        pooled = hidden[:, 0]
    else:
        pooled = torch.stack([hidden[0].mean(0), hidden[1, :3].mean(0)])
    torch.testing.assert_close(logits, model.head(pooled))


def test_tied_embeddings_share_storage():
    lm = DecoderLM(_cfg())
    assert lm.lm_head.weight is lm.embed.tok_emb.weight
    with torch.no_grad():
        lm.embed.tok_emb.weight[3, 0] = 42.0
    assert lm.lm_head.weight[3, 0] == 42.0
    assert len(list(lm.parameters())) == len({p.data_ptr() for p in lm.parameters()})
    untied = DecoderLM(_cfg(tie_embeddings=False))
    assert untied.lm_head.weight.data_ptr() != untied.embed.tok_emb.weight.data_ptr()
    s2s = TransformerEncoderDecoder(_cfg("encoder_decoder"))
    assert s2s.lm_head.weight is s2s.tgt_embed.tok_emb.weight


def test_documented_initialisation():
    """Linear/Embedding ~ N(0, 0.02), biases 0, gains 1, residual projections 0.02/sqrt(2L)."""
    lm = DecoderLM(_cfg(d_model=64, n_heads=4, d_ff=256, vocab_size=500, n_layers=8))
    assert abs(lm.embed.tok_emb.weight.std().item() - 0.02) < 0.002
    assert abs(lm.blocks[0].self_attn.qkv_proj.weight.std().item() - 0.02) < 0.002
    assert abs(lm.blocks[0].ffn.down.weight.std().item() - 0.02 / 4) < 0.0005
    assert torch.all(lm.blocks[0].ffn.up.bias == 0)
    assert torch.all(lm.blocks[0].self_attn_norm.weight == 1)


def test_embed_scale_multiplies_by_sqrt_d_model():
    lm = DecoderLM(_cfg(embed_scale=True, positional="none"))
    ids = _ids()
    torch.testing.assert_close(lm.embed(ids), lm.embed.tok_emb(ids) * D**0.5)


# --------------------------------------------------------------------------- end-to-end oracle


def _embed(embeddings, ids: torch.Tensor) -> np.ndarray:
    """x_i = E w_i + P_i, with a learned table P (000) or the sinusoids PE(i) (004 eq. 16)."""
    tok = to_np(embeddings.tok_emb.weight)[ids.numpy()]
    if hasattr(embeddings.pos_enc, "table"):
        return tok + to_np(embeddings.pos_enc.table.weight)[: ids.numel()]
    return tok + ref.sinusoidal_encoding(ids.numel(), tok.shape[-1])


def _final(norm, x: np.ndarray) -> np.ndarray:
    return ref.layer_norm(x, to_np(norm.weight), to_np(norm.bias), eps=1e-5)


@pytest.mark.parametrize("placement,positional", [("pre", "learned"), ("post", "sinusoidal")])
def test_decoder_lm_matches_reference_end_to_end(placement, positional):
    cfg = _cfg(norm_placement=placement, positional=positional, n_layers=2)
    lm = DecoderLM(cfg).double().eval()
    ids = _ids(1, 4)
    x = _embed(lm.embed, ids[0])
    for block in lm.blocks:
        x = ref.encoder_block(
            x, block_params(block), mask=ref.causal_mask(4), norm_first=placement == "pre"
        )
    logits = _final(lm.final_norm, x) @ to_np(lm.lm_head.weight.T)
    np.testing.assert_allclose(to_np(lm(ids).logits[0]), logits, **TOL64)


def test_encoder_decoder_and_classifier_match_reference_end_to_end():
    model = TransformerEncoderDecoder(_cfg("encoder_decoder", n_layers=1)).double().eval()
    src, tgt = _ids(1, 4), _ids(1, 3)
    src_real = _real([3], 4)
    memory = _embed(model.encoder.embed, src[0])
    for block in model.encoder.stack.blocks:
        memory = ref.encoder_block(memory, block_params(block), mask=to_np(src_real[0]))
    memory = _final(model.encoder.stack.final_norm, memory)
    y = _embed(model.tgt_embed, tgt[0])
    for block in model.blocks:
        y = ref.decoder_block(
            y,
            memory,
            block_params(block),
            self_mask=ref.causal_mask(3),
            cross_mask=to_np(src_real[0]),
        )
    logits = _final(model.final_norm, y) @ to_np(model.lm_head.weight.T)
    got = model(src, tgt, src_mask=src_real).logits[0]
    np.testing.assert_allclose(to_np(got), logits, **TOL64)

    clf = EncoderClassifier(_cfg("classifier", n_layers=1, pooling="mean")).double().eval()
    h = _embed(clf.encoder.embed, src[0])
    h = ref.encoder_block(h, block_params(clf.encoder.stack.blocks[0]), mask=to_np(src_real[0]))
    pooled = _final(clf.encoder.stack.final_norm, h)[:3].mean(0)
    expected = pooled @ to_np(clf.head.weight.T) + to_np(clf.head.bias)
    np.testing.assert_allclose(
        to_np(clf(src, key_padding_mask=src_real).logits[0]), expected, **TOL64
    )


# --------------------------------------------------------------------------- cached decoding


@pytest.mark.parametrize("positional", POSITIONS)
def test_decoder_lm_cached_decoding_equals_full_forward(positional):
    lm = DecoderLM(_cfg(positional=positional, qk_norm=positional == "rotary")).eval()
    ids = _ids(t=8)
    full = lm(ids).logits
    cache = lm.new_cache(B, 8)
    prefill = lm(ids[:, :3], cache=cache).logits  # a chunk, then one token at a time
    steps = [lm(ids[:, i : i + 1], cache=cache).logits for i in range(3, 8)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, **TOL32)
    assert cache.length == 8


def test_decoder_lm_cache_with_left_padding_equals_unpadded_rows():
    lm = DecoderLM(_cfg(positional="rotary")).eval()
    ids = _ids(t=6)
    real = _real([6, 4], 6).flip(1)  # row 1 is left-padded by 2
    positions = (real.cumsum(1) - 1).clamp_min(0)  # (B, T) real tokens count from 0
    cache = lm.new_cache(B, 6)
    steps = [
        lm(
            ids[:, i : i + 1],
            key_padding_mask=real[:, i : i + 1],
            positions=positions[:, i : i + 1],
            cache=cache,
        ).logits
        for i in range(6)
    ]
    cached = torch.cat(steps, dim=1)
    torch.testing.assert_close(cached[1, 2:], lm(ids[1:, 2:]).logits[0], **TOL32)
    torch.testing.assert_close(cached[0], lm(ids[:1]).logits[0], **TOL32)


@pytest.mark.parametrize("positional", POSITIONS)
def test_encoder_decoder_cached_decoding_equals_full_decode(positional):
    model = TransformerEncoderDecoder(_cfg("encoder_decoder", positional=positional)).eval()
    src, tgt = _ids(t=S), _ids(t=T)
    encoded = model.encode(src, _real([S, 4], S))
    full = model.decode(tgt, encoded).logits
    cache = model.new_cache(encoded, T)
    steps = [model.decode(tgt[:, i : i + 1], encoded, cache=cache).logits for i in range(T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL32)


def test_encoder_decoder_cache_with_target_padding_equals_full_decode():
    model = TransformerEncoderDecoder(_cfg("encoder_decoder", positional="rotary")).eval()
    src, tgt = _ids(3, S), _ids(3, T)
    tgt_real = _real([T, 3, 1], T)
    encoded = model.encode(src, _real([S, 4, 2], S))
    full = model.decode(tgt, encoded, tgt_mask=tgt_real).logits
    cache = model.new_cache(encoded, T)
    steps = [
        model.decode(
            tgt[:, i : i + 1], encoded, tgt_mask=tgt_real[:, i : i + 1], cache=cache
        ).logits
        for i in range(T)
    ]
    # Real target positions agree; outputs at padding positions are unspecified (zero when
    # the batch is packed).
    torch.testing.assert_close(torch.cat(steps, dim=1)[tgt_real], full[tgt_real], **TOL32)


def test_cache_reorder_selects_batch_rows_for_beam_search():
    """After reorder(index) the cache continues exactly as a fresh pass over rows ``index``."""
    index = torch.tensor([2, 0, 0])
    lm = DecoderLM(_cfg(positional="rotary")).eval()
    ids = _ids(3, 6)
    cache = lm.new_cache(3, 6)
    lm(ids[:, :4], cache=cache)
    cache.reorder(index)
    torch.testing.assert_close(
        lm(ids[index][:, 4:], cache=cache).logits, lm(ids[index]).logits[:, 4:], **TOL32
    )

    model = TransformerEncoderDecoder(_cfg("encoder_decoder")).eval()
    src, tgt = _ids(3, S), _ids(3, 3)
    encoded = model.encode(src, _real([S, 4, 2], S))
    cache = model.new_cache(encoded, 3)
    model.decode(tgt[:, :2], encoded, cache=cache)
    cache.reorder(index)
    picked = type(encoded)(encoded.memory[index], encoded.src_mask[index], encoded.src[index])
    torch.testing.assert_close(
        model.decode(tgt[index][:, 2:], picked, cache=cache).logits,
        model.decode(tgt[index], picked).logits[:, 2:],
        **TOL32,
    )


# --------------------------------------------------------------------------- gradients


def _gradcheck_through_embeddings(model, tok_embs: list, call) -> None:
    """gradcheck wrt float tensors that replace the token-embedding outputs via forward hooks."""
    inputs = tuple(
        torch.randn(*shape, dtype=torch.float64, requires_grad=True) for _, shape in tok_embs
    )

    def f(*values):
        handles = [
            emb.register_forward_hook(lambda m, i, o, v=v: v)
            for (emb, _), v in zip(tok_embs, values)
        ]
        try:
            return call()
        finally:
            for handle in handles:
                handle.remove()

    assert torch.autograd.gradcheck(f, inputs, fast_mode=True)
    grads = torch.autograd.grad(f(*inputs).square().sum(), inputs)
    assert all(g.abs().sum() > 0 for g in grads)  # the hooks really feed the model


TINY = dict(vocab_size=7, d_model=4, n_heads=2, n_layers=1, d_ff=6, max_len=8)


def test_gradcheck_tiny_decoder_lm():
    lm = DecoderLM(ModelConfig(**TINY, positional="rotary")).double()
    ids = torch.randint(0, 7, (1, 3))
    _gradcheck_through_embeddings(lm, [(lm.embed.tok_emb, (1, 3, 4))], lambda: lm(ids).logits)


def test_gradcheck_tiny_encoder_decoder():
    model = TransformerEncoderDecoder(ModelConfig(kind="encoder_decoder", **TINY)).double()
    src, tgt, src_real = torch.randint(0, 7, (1, 3)), torch.randint(0, 7, (1, 2)), _real([2], 3)
    _gradcheck_through_embeddings(
        model,
        [(model.encoder.embed.tok_emb, (1, 3, 4)), (model.tgt_embed.tok_emb, (1, 2, 4))],
        lambda: model(src, tgt, src_mask=src_real).logits,
    )


def test_gradcheck_tiny_encoder():
    enc = TransformerEncoder(ModelConfig(kind="encoder", norm_placement="post", **TINY)).double()
    ids, real = torch.randint(0, 7, (2, 3)), _real([3, 2], 3)
    _gradcheck_through_embeddings(
        enc, [(enc.embed.tok_emb, (2, 3, 4))], lambda: enc(ids, key_padding_mask=real).hidden
    )


def test_gradcheck_tiny_classifier():
    clf = EncoderClassifier(
        ModelConfig(kind="classifier", n_classes=2, pooling="mean", **TINY)
    ).double()
    ids, real = torch.randint(0, 7, (1, 3)), _real([2], 3)
    _gradcheck_through_embeddings(
        clf,
        [(clf.encoder.embed.tok_emb, (1, 3, 4))],
        lambda: clf(ids, key_padding_mask=real).logits,
    )
