"""attnlab.inspect on the recurrent models: the cached e_l, alpha_l, v_l, f_t, v and h_t against
NumPy loops of 004 eq. 5-8 and 000's RNN, caching leaves the logits bit-identical, and
interventions inside the recurrence flow on to later steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attnlab
from attnlab import inspect
from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.generate import GenerationConfig
from attnlab.models.build import build_model
from lstm_models import V_SRC, D, _batch
from lstm_models import _model as _seq2seq


def _rnn_lm(**changes):
    cfg = dict(kind="rnn_lm", vocab_size=V_SRC, d_model=D, n_layers=2)
    return build_model(ModelConfig(**{**cfg, **changes})).eval()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


@pytest.mark.parametrize("score", ["additive", "dot", "general"])
def test_bahdanau_quantities_match_numpy_loop_of_004_eq_5_to_8(score):
    model = _seq2seq(rnn_attention=score, n_decoder_layers=2).double()
    src, mask, tgt = _batch()
    _, cache = inspect.run_with_cache(model, src, tgt, src_mask=mask)
    P = {k: _np(v) for k, v in model.state_dict().items()}
    h_enc, v, h_dec = _np(cache["h_enc"]), _np(cache["v"]), _np(cache["h_dec"])
    assert cache["e"].shape == cache["alpha"].shape == (3, 5, 6)
    assert cache["v_l"].shape == (3, 5, D)
    kwargs = {}
    if score == "additive":
        kwargs = dict(W=P["score.W.weight"].T, U=P["score.U.weight"].T, v=P["score.v.weight"][0])
    elif score == "general":
        kwargs = dict(W=P["score.W.weight"])
    scorer = {
        "additive": lambda h, f: ref.additive_score(h, f, **kwargs),
        "dot": ref.dot_score,
        "general": lambda h, f: ref.general_score(h, f, **kwargs),
    }[score]
    n_dec = model.cfg.decoder_layers
    for b in range(src.size(0)):
        real = _np(mask[b])
        F = np.zeros((6, D))
        for t in range(6):  # eq. 5: f_t = T_theta(h^e_t), a linear map
            F[t] = h_enc[b, t] @ P["feature.weight"].T + P["feature.bias"]
        np.testing.assert_allclose(_np(cache["f"][b]), F, rtol=0, atol=1e-12)
        h0 = np.tanh(v[b] @ P["init_h.weight"].T + P["init_h.bias"]).reshape(n_dec, D)[-1]
        for l in range(tgt.size(1)):
            h_prev = h0 if l == 0 else h_dec[b, l - 1]  # h^d_{l-1}
            e = np.array([scorer(h_prev, F[t]) for t in range(6)])  # eq. 6
            context, alpha = ref.additive_attention_step(  # eq. 7-8
                h_prev, F, mask=real, score=score, **kwargs
            )
            np.testing.assert_allclose(_np(cache["e"][b, l])[real], e[real], rtol=0, atol=1e-10)
            np.testing.assert_allclose(_np(cache["alpha"][b, l]), alpha, rtol=0, atol=1e-10)
            np.testing.assert_allclose(_np(cache["v_l"][b, l]), context, rtol=0, atol=1e-10)


def test_summary_v_is_the_last_encoder_state_and_rnn_states_follow_000():
    model = _seq2seq(rnn_attention="none").double()
    src, _, tgt = _batch()
    _, cache = inspect.run_with_cache(model, src, tgt)
    torch.testing.assert_close(cache["v"], cache["h_enc"][:, -1], rtol=0, atol=0)
    assert "alpha" not in inspect.activation_names(model)  # the plain model has no attention

    lm = _rnn_lm().double()
    ids = src
    _, cache = inspect.run_with_cache(lm, ids)
    cell = lm.rnn.cells[0]
    W, U, bias = _np(cell.W).T, _np(cell.U).T, _np(cell.b)
    x = _np(cache["X"])
    for b in range(ids.size(0)):
        h = np.zeros(D)
        for t in range(ids.size(1)):  # h_t = sigma(W h_{t-1} + U x_t) of 000
            h = ref.rnn_cell(h, x[b, t], W, U, bias)
            np.testing.assert_allclose(_np(cache["rnn.cells.0.h"][b, t]), h, atol=1e-12)


@pytest.mark.parametrize("kind", ["rnn_lm", "plain", "additive"])
def test_caching_leaves_logits_bit_identical(kind):
    src, mask, tgt = _batch()
    if kind == "rnn_lm":
        model, args, kwargs = _rnn_lm(), (src,), dict(key_padding_mask=mask)
    else:
        model = _seq2seq(rnn_attention="none" if kind == "plain" else "additive")
        args, kwargs = (src, tgt), dict(src_mask=mask)
    plain = model(*args, **kwargs).logits
    out, cache = inspect.run_with_cache(model, *args, **kwargs)
    assert torch.equal(out.logits, plain) and len(cache) == len(inspect.activation_names(model))
    with torch.no_grad():  # (torch's LSTM may take another kernel without autograd)
        plain = model(*args, **kwargs).logits
        out, _ = inspect.run_with_cache(model, *args, names=["*h*"], **kwargs)
    assert torch.equal(out.logits, plain)


def test_replacing_alpha_sets_the_context_and_flows_to_later_steps():
    model = _seq2seq().double()
    src, mask, tgt = _batch()
    clean, cache = inspect.run_with_cache(model, src, tgt, src_mask=mask)
    uniform = mask.double() / mask.sum(1, keepdim=True)  # (B, S): alpha_l = mean over real t

    with inspect.intervene(model, {"alpha": uniform}):  # one step's shape: used at every step
        out, patched = inspect.run_with_cache(model, src, tgt, src_mask=mask)
    mean_f = (cache["f"] * uniform[..., None]).sum(1)  # (B, D), eq. 8 with uniform weights
    torch.testing.assert_close(patched["v_l"], mean_f[:, None].expand(-1, 5, -1))
    assert not torch.allclose(out.logits, clean.logits)

    # Patching alpha at step 2 only (a function of the value) leaves steps 0-1 unchanged.
    calls = [0]

    def third_step_uniform(alpha):
        calls[0] += 1
        return uniform if calls[0] == 3 else None

    with inspect.intervene(model, {"alpha": third_step_uniform}):
        out = model(src, tgt, src_mask=mask)
    torch.testing.assert_close(out.logits[:, :2], clean.logits[:, :2], rtol=0, atol=0)
    assert not torch.allclose(out.logits[:, 2:], clean.logits[:, 2:])


def test_patching_the_energies_from_another_source_gives_its_weights():
    model = _seq2seq().double()
    src, mask, tgt = _batch()
    src_b = torch.randint(1, V_SRC, src.shape)
    src_b[~mask] = 0
    _, cache_b = inspect.run_with_cache(model, src_b, tgt, src_mask=mask)
    with inspect.patch(model, cache_b, "e"):  # stacked (B, T, S), taken step by step
        _, patched = inspect.run_with_cache(model, src, tgt, src_mask=mask)
    torch.testing.assert_close(patched["alpha"], cache_b["alpha"], rtol=0, atol=0)


def test_replacing_an_rnn_state_changes_only_later_positions():
    model = _rnn_lm()
    ids = torch.randint(0, V_SRC, (2, 7))
    clean = model(ids).logits
    calls = [0]

    def kick_step_3(h):
        calls[0] += 1
        return h + 1.0 if calls[0] == 4 else None

    with inspect.intervene(model, {"rnn.cells.0.h": kick_step_3}):
        out = model(ids).logits
    assert torch.equal(out[:, :3], clean[:, :3])
    assert not torch.allclose(out[:, 3:], clean[:, 3:])
    assert torch.equal(model(ids).logits, clean)


def test_capture_during_generation_records_every_step():
    model = _seq2seq()
    src, mask, _ = _batch()
    config = GenerationConfig(max_new_tokens=4, temperature=0.0, bos_token_id=1, stop_token_ids=())
    with inspect.capture(model, ["alpha", "v"]) as cache:
        attnlab.generate_seq2seq(model, src[:1].tolist(), config)
    steps = cache.calls("alpha")
    assert len(steps) >= 3 and all(a.shape == (1, 1, 6) for a in steps)
    for a in steps:
        torch.testing.assert_close(a.sum(-1), torch.ones(1, 1))
    assert len(cache.calls("v")) == 1  # the source is prepared once
    with pytest.raises(inspect.InspectError, match="calls"):
        cache["alpha"]
    assert "decode" not in model.__dict__  # the decode wrapper is gone


def test_recurrent_models_have_no_heads_or_position_signal():
    model = _seq2seq()
    with pytest.raises(inspect.InspectError, match="alpha"), inspect.ablate_heads(model, [(0, 0)]):
        pass
    with (
        pytest.raises(inspect.InspectError, match="no position signal"),
        inspect.scale_positions(_rnn_lm(), 0.0),
    ):
        pass
