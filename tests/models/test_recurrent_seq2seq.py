"""LSTMSeq2Seq (004 eq. 1-8): the whole model against a NumPy loop built from the oracle's LSTM
cell and attention step, padding invariance, cached decoding, beam reorder, gradcheck, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import reference as ref
from attnlab.models.base import Encoded, Seq2SeqModel
from attnlab.models.lstm_seq2seq import LSTMSeq2Seq, source_order
from attnlab.nn.recurrent import RecurrentCache
from lstm_models import V_SRC, V_TGT, D, _batch, _model  # noqa: F401 - shared helpers


# ------------------------------------------------------------------------- NumPy oracle
def _numpy_decode(model: LSTMSeq2Seq, src, mask, tgt) -> tuple[np.ndarray, np.ndarray]:
    """One row at a time, as literally as 004 writes it: eq. 2 per layer and direction, v from the
    last state, f_t = T(h^e_t) (eq. 5), eq. 6-8 via the oracle, eq. 4, logits = h^d_l E_out."""
    cfg, P = model.cfg, {k: v.detach().numpy() for k, v in model.state_dict().items()}

    def lstm(xs, prefix, suffix, h, c):
        outs = []
        for x in xs:
            h, c = ref.lstm_cell(
                x,
                h,
                c,
                P[f"{prefix}.weight_ih_{suffix}"],
                P[f"{prefix}.weight_hh_{suffix}"],
                P[f"{prefix}.bias_ih_{suffix}"],
                P[f"{prefix}.bias_hh_{suffix}"],
            )
            outs.append(h)
        return outs, h, c

    real = [t for t in range(len(src)) if mask[t]]
    order = real[::-1] if cfg.reverse_source else real  # x_{T:1} over the real tokens only
    xs = [P["src_emb.weight"][src[t]] for t in order]
    zero = np.zeros(D)
    for layer in range(cfg.n_layers):
        fwd = lstm(xs, "encoder", f"l{layer}", zero, zero)[0]
        if cfg.bidirectional:
            bwd = lstm(xs[::-1], "encoder", f"l{layer}_reverse", zero, zero)[0][::-1]
            xs = [np.concatenate([f, b]) for f, b in zip(fwd, bwd, strict=True)]
        else:
            xs = fwd
    v = xs[-1][:D] if not cfg.bidirectional else np.concatenate([xs[-1][:D], xs[0][D:]])
    memory = np.zeros((len(src), model.d_memory))
    for i, t in enumerate(order):
        memory[t] = xs[i]
    n = cfg.decoder_layers
    h = list(np.tanh(v @ P["init_h.weight"].T + P["init_h.bias"]).reshape(n, D))
    c = list((v @ P["init_c.weight"].T + P["init_c.bias"]).reshape(n, D))
    attn = cfg.rnn_attention != "none"
    if attn:
        F = memory @ P["feature.weight"].T + P["feature.bias"]  # (S, D)
        kwargs = {}
        if cfg.rnn_attention == "additive":
            kwargs = dict(
                W=P["score.W.weight"].T, U=P["score.U.weight"].T, v=P["score.v.weight"][0]
            )
        elif cfg.rnn_attention == "general":
            kwargs = dict(W=P["score.W.weight"])
    logits, alphas = [], []
    for y in tgt:
        x = P["tgt_emb.weight"][y]
        if attn:
            context, alpha = ref.additive_attention_step(
                h[-1], F, mask=np.asarray(mask), score=cfg.rnn_attention, **kwargs
            )
            x = np.concatenate([x, context])  # [y_{l-1}; v_l]
            alphas.append(alpha)
        for layer in range(n):
            _, h[layer], c[layer] = lstm([x], "decoder", f"l{layer}", h[layer], c[layer])
            x = h[layer]
        logits.append(h[-1] @ P["lm_head.weight"].T)
    return np.array(logits), np.array(alphas)


@pytest.mark.parametrize(
    "changes",
    [
        dict(reverse_source=True, n_decoder_layers=2),
        dict(bidirectional=True, rnn_attention="general", n_decoder_layers=1),
        dict(bidirectional=True, reverse_source=True, rnn_attention="dot"),
        dict(rnn_attention="none", reverse_source=True, tie_embeddings=False),
    ],
    ids=["additive-reversed", "general-bidirectional", "dot-bi-reversed", "plain"],
)
def test_model_matches_numpy_loop_of_004(changes):
    model = _model(**changes).double()
    src, mask, tgt = _batch()
    out = model(src, tgt, src_mask=mask, need_weights=True)
    for row in range(src.size(0)):
        logits, alphas = _numpy_decode(
            model, src[row].tolist(), mask[row].tolist(), tgt[row].tolist()
        )
        np.testing.assert_allclose(out.logits[row].detach().numpy(), logits, rtol=0, atol=1e-10)
        if model.attention != "none":
            got = out.attentions[0].cross_attn[row, 0].detach().numpy()
            np.testing.assert_allclose(got, alphas, rtol=0, atol=1e-10)
    if model.attention == "none":
        assert out.attentions is None


def test_interface_is_the_transformer_seq2seq_one():
    model = _model()
    assert isinstance(model, Seq2SeqModel) and model.max_len is None
    src, mask, tgt = _batch()
    encoded = model.encode(src, mask)
    assert isinstance(encoded, Encoded) and encoded.memory.shape == (3, 6, D)
    assert torch.all(encoded.memory[~mask] == 0)
    out = model.decode(tgt, encoded, need_weights=True)
    assert out.logits.shape == (3, 5, V_TGT)
    (layer,) = out.attentions
    assert layer.self_attn is None and layer.cross_attn.shape == (3, 1, 5, 6)
    torch.testing.assert_close(layer.cross_attn.sum(-1), torch.ones(3, 1, 5))
    assert torch.all(layer.cross_attn[~mask[:, None, None, :].expand(-1, 1, 5, -1)] == 0)
    assert not any(isinstance(v, torch.Tensor) and v.dim() == 4 for v in vars(model).values())


def test_source_order_reverses_only_real_tokens():
    mask = torch.tensor([[True, True, True, False], [False, True, True, True]])
    assert source_order(mask, reverse=False).tolist() == [[0, 1, 2, 3], [1, 2, 3, 0]]
    assert source_order(mask, reverse=True).tolist() == [[2, 1, 0, 3], [3, 2, 1, 0]]


@pytest.mark.parametrize(
    "changes",
    [
        dict(),
        dict(reverse_source=True),
        dict(bidirectional=True, reverse_source=True),
        dict(rnn_attention="none", bidirectional=True),
    ],
)
def test_extra_source_padding_never_changes_outputs(changes):
    model = _model(**changes)
    src, mask, tgt = _batch()
    out = model(src, tgt, src_mask=mask)
    pad = torch.zeros(3, 4, dtype=torch.long)
    no = torch.zeros(3, 4, dtype=torch.bool)
    for wide_src, wide_mask in [
        (torch.cat([src, pad], 1), torch.cat([mask, no], 1)),
        (torch.cat([pad, src], 1), torch.cat([no, mask], 1)),
    ]:
        wide = model(wide_src, tgt, src_mask=wide_mask)
        torch.testing.assert_close(wide.logits, out.logits, atol=1e-6, rtol=1e-5)
    # A row alone, without any padding, gives the same as inside the padded batch.
    alone = model(src[1:2, :4], tgt[1:2]).logits
    torch.testing.assert_close(alone, out.logits[1:2], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("attention", ["additive", "none"])
def test_cached_stepwise_decoding_equals_teacher_forcing(attention):
    model = _model(rnn_attention=attention, n_decoder_layers=2, reverse_source=True)
    src, mask, tgt = _batch(t=7)
    encoded = model.encode(src, mask)
    full = model.decode(tgt, encoded, need_weights=True)
    cache = model.new_cache(encoded, 16)
    chunks = [
        model.decode(tgt[:, a:b], encoded, cache=cache, need_weights=True)
        for a, b in [(0, 1), (1, 2), (2, 5), (5, 7)]
    ]
    torch.testing.assert_close(
        torch.cat([c.logits for c in chunks], 1), full.logits, atol=1e-5, rtol=1e-5
    )
    assert cache.length == 7
    if attention != "none":
        weights = torch.cat([c.attentions[0].cross_attn for c in chunks], 2)
        torch.testing.assert_close(weights, full.attentions[0].cross_attn, atol=1e-5, rtol=1e-5)


def test_cache_reorder_carries_the_source_along():
    """Beam search calls only cache.reorder: states and per-source tensors must follow."""
    model = _model()
    src, mask, tgt = _batch()
    encoded = model.encode(src, mask)
    cache = model.new_cache(encoded)
    model.decode(tgt[:, :2], encoded, cache=cache)
    index = torch.tensor([2, 2, 1])
    cache.reorder(index)
    got = model.decode(tgt[index, 2:], encoded, cache=cache).logits
    expected = model(src[index], tgt[index], src_mask=mask[index]).logits[:, 2:]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["general", "none"])
def test_target_padding_keeps_the_decoder_state(attention):
    model = _model(rnn_attention=attention)
    src, mask, tgt = _batch(t=4)
    out = model(src, tgt, src_mask=mask).logits
    # Left-padded targets (batched prompts) and right-padded targets (training batches).
    pad, no = torch.zeros(3, 2, dtype=torch.long), torch.zeros(3, 2, dtype=torch.bool)
    real = torch.ones(3, 4, dtype=torch.bool)
    left = model(
        src, torch.cat([pad, tgt], 1), src_mask=mask, tgt_mask=torch.cat([no, real], 1)
    ).logits
    right = model(
        src, torch.cat([tgt, pad], 1), src_mask=mask, tgt_mask=torch.cat([real, no], 1)
    ).logits
    torch.testing.assert_close(left[:, 2:], out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(right[:, :4], out, atol=1e-6, rtol=1e-5)


def test_gradcheck_attention_decoder_in_float64():
    model = _model(
        d_model=2, n_heads=2, d_attn=2, n_layers=1, bidirectional=True, reverse_source=True
    ).double()
    src = torch.tensor([[3, 1, 4, 0], [2, 7, 1, 8]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    tgt = torch.tensor([[1, 5, 2], [4, 3, 6]])
    params = dict(model.named_parameters())
    names = sorted(params)

    def f(*tensors):
        weights = dict(zip(names, tensors, strict=True))
        return torch.func.functional_call(model, weights, (src, tgt), {"src_mask": mask}).logits

    inputs = tuple(params[n].detach().clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5)


def test_separate_vocabularies_and_tied_output():
    model = _model()
    assert model.src_emb.weight.shape == (V_SRC, D)
    assert model.lm_head.weight is model.tgt_emb.weight
    assert _model(tie_embeddings=False).lm_head.weight.shape == (V_TGT, D)


def test_bad_input_gets_a_clear_error():
    model = _model()
    src, mask, tgt = _batch()
    with pytest.raises(ValueError, match=r"row\(s\) \[1\] are entirely padding"):
        model.encode(src, torch.tensor([[True] * 6, [False] * 6, [True] * 6]))
    with pytest.raises(ValueError, match="empty sequence"):
        model.encode(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(TypeError, match="integer token ids"):
        model.encode(src.float())
    with pytest.raises(ValueError, match="target ids contains token id 7 outside"):
        model(src, torch.full((3, 2), V_TGT), src_mask=mask)
    with pytest.raises(ValueError, match="src_mask has shape"):
        model.encode(src, mask[:, :3])
    other = _model(bidirectional=True)  # encoder states of width 2D
    with pytest.raises(ValueError, match="encode the source with this model"):
        model.decode(tgt, other.encode(src, mask))
    encoded = model.encode(src, mask)
    with pytest.raises(ValueError, match="target batch has 2 rows"):
        model.decode(tgt[:2], encoded)
    with pytest.raises(TypeError, match="its own new_cache"):
        model.decode(tgt, encoded, cache=RecurrentCache((torch.zeros(2, 3, D),)))  # an RNN's
    deeper = _model(n_decoder_layers=3)
    with pytest.raises(ValueError, match="use this model's new_cache"):
        model.decode(tgt, encoded, cache=deeper.new_cache(deeper.encode(src, mask)))


@pytest.mark.parametrize("bidirectional,layers", [(True, 1), (True, 2), (False, 2)])
def test_lstm_right_padded_equals_packed_sequences(bidirectional, layers):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from attnlab.nn.recurrent import lstm_right_padded

    torch.manual_seed(0)
    lstm = (
        torch.nn.LSTM(
            5,
            6,
            layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=0.3 if layers > 1 else 0.0,
        )
        .double()
        .eval()
    )
    x = torch.randn(4, 7, 5, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([7, 3, 5, 1])
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    want, _ = pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=7)
    got = lstm_right_padded(lstm, x, lengths)  # (B, S, H * directions)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-12)
    (g_want,) = torch.autograd.grad((want * torch.arange(7.0)[:, None]).sum(), x)
    (g_got,) = torch.autograd.grad((got * torch.arange(7.0)[:, None]).sum(), x)
    assert torch.allclose(g_got, g_want, atol=1e-12)
    assert g_got[1, 3:].abs().max() == 0  # padding steps never feed a real step
