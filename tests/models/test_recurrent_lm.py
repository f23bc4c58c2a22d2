"""RNNLM (000's simple RNN language model): NumPy parity, the LanguageModel contract shared with
DecoderLM (cache, left padding, reorder), gradcheck, a tiny learning run and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab import reference as ref
from attnlab.config import ModelConfig
from attnlab.models.base import LanguageModel
from attnlab.models.build import build_model
from attnlab.models.rnn_lm import RNNLM

V = 11


def _lm(**changes) -> RNNLM:
    cfg = ModelConfig(**{"kind": "rnn_lm", "vocab_size": V, "d_model": 8, "n_layers": 2, **changes})
    return build_model(cfg).eval()


def test_build_model_gives_an_unbounded_language_model():
    model = _lm()
    assert isinstance(model, RNNLM) and isinstance(model, LanguageModel)
    assert model.max_len is None
    out = model(torch.randint(0, V, (3, 7)), need_weights=True)
    assert out.logits.shape == (3, 7, V)
    assert out.attentions is None  # no attention to return
    assert model.lm_head.weight is model.tok_emb.weight  # tie_embeddings defaults to True
    assert _lm(tie_embeddings=False).lm_head.weight is not _lm().tok_emb.weight


def test_logits_match_the_numpy_loop_of_000():
    """w_t ~ softmax(h_{t-1} E), h_{t-1} = tanh(W h_{t-2} + U x_{t-1} + b), two stacked layers."""
    model = _lm(tie_embeddings=False).double()
    ids = torch.randint(0, V, (2, 6))
    logits = model(ids).logits.detach().numpy()
    emb = model.tok_emb.weight.detach().numpy()
    for row in range(2):
        h = [np.zeros(8), np.zeros(8)]
        for t in range(6):
            x = emb[ids[row, t]]
            for i, cell in enumerate(model.rnn.cells):
                h[i] = ref.rnn_cell(
                    h[i],
                    x,
                    cell.W.detach().numpy().T,
                    cell.U.detach().numpy().T,
                    cell.b.detach().numpy(),
                )
                x = h[i]
            expected = x @ model.lm_head.weight.detach().numpy().T  # h_t E
            np.testing.assert_allclose(logits[row, t], expected, rtol=0, atol=1e-10)


def test_cached_calls_continue_the_recurrence():
    model = _lm()
    ids = torch.randint(0, V, (3, 9))
    full = model(ids).logits
    cache = model.new_cache(3, 64)
    parts = [model(ids[:, a:b], cache=cache).logits for a, b in [(0, 4), (4, 5), (5, 9)]]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-6, rtol=1e-5)
    assert cache.length == 9


def test_cache_reorder_selects_rows_like_beam_search():
    model = _lm()
    ids = torch.randint(0, V, (3, 8))
    cache = model.new_cache(3, 16)
    model(ids[:, :5], cache=cache)
    index = torch.tensor([2, 0, 0])
    cache.reorder(index)
    got = model(ids[index, 5:], cache=cache).logits
    torch.testing.assert_close(got, model(ids[index]).logits[:, 5:], atol=1e-6, rtol=1e-5)


def test_left_padding_does_not_change_the_state():
    model = _lm()
    short, long = torch.randint(1, V, (1, 4)), torch.randint(1, V, (1, 7))
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])
    mask = batch != 0
    mask[1] = True
    out = model(batch, key_padding_mask=mask).logits
    torch.testing.assert_close(out[0, 3:], model(short).logits[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out[1], model(long).logits[0], atol=1e-6, rtol=1e-5)
    # The same through a cache, as batched generation uses it: prompt, then one new token.
    cache = model.new_cache(2, 32)
    model(batch, key_padding_mask=mask, cache=cache)
    nxt = torch.tensor([[5], [6]])
    step = model(nxt, cache=cache).logits[:, -1]
    torch.testing.assert_close(
        step[0], model(torch.cat([short, nxt[:1]], 1)).logits[0, -1], atol=1e-6, rtol=1e-5
    )


def test_future_tokens_do_not_change_past_logits():
    model = _lm()
    ids = torch.randint(0, V, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % V
    torch.testing.assert_close(model(ids).logits[:, :6], model(changed).logits[:, :6])


def test_gradcheck_in_float64():
    model = ModelConfig(kind="rnn_lm", vocab_size=5, d_model=4, n_layers=2)
    model = build_model(model).double()
    ids = torch.tensor([[1, 4, 2, 0]])
    mask = torch.tensor([[False, True, True, True]])
    params = dict(model.named_parameters())
    names = sorted(params)

    def f(*tensors):
        out = torch.func.functional_call(
            model, dict(zip(names, tensors, strict=True)), (ids,), {"key_padding_mask": mask}
        )
        return out.logits

    inputs = tuple(params[n].detach().clone().requires_grad_() for n in names)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5)


def test_a_tiny_rnn_lm_learns_a_periodic_sequence():
    model = _lm(d_model=16, n_layers=1).train()
    text = torch.tensor([[1, 2, 3, 4, 5] * 6])  # period 5: fully predictable after one period
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(80):
        loss = F.cross_entropy(model(text[:, :-1]).logits[0, 4:], text[0, 5:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05


def test_bad_input_gets_a_clear_error():
    model = _lm()
    with pytest.raises(TypeError, match="integer token ids"):
        model(torch.rand(2, 3))
    with pytest.raises(ValueError, match=r"shape \(B, T\)"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[1, V]]))
    with pytest.raises(TypeError, match="bool tensor"):
        model(torch.tensor([[1, 2]]), key_padding_mask=torch.ones(1, 2))
    cache = model.new_cache(2, 8)
    with pytest.raises(ValueError, match=r"new_cache\(3\)"):
        model(torch.zeros(3, 1, dtype=torch.long), cache=cache)
    with pytest.raises(TypeError, match="its own new_cache"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=object())
