"""attnlab.nn.recurrent: the Elman cell (000) and the alignment scores (004 eq. 6-8) against the
NumPy oracle and torch, padding behaviour of the unrolled RNN, and the recurrent cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import reference as ref
from attnlab.nn.recurrent import (
    AdditiveScore,
    DotScore,
    GeneralScore,
    RecurrentCache,
    RNNCell,
    SimpleRNN,
    attention_step,
    make_score,
)
from oracle_params import to_np


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_rnn_cell_matches_numpy_reference_in_float64(activation):
    cell = RNNCell(5, 4, activation=activation).double()
    x, h = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    # Column form h_t = sigma(W h + U x + b) equals the oracle's row form h W^T + x U^T + b.
    expected = ref.rnn_cell(
        to_np(h), to_np(x), to_np(cell.W).T, to_np(cell.U).T, to_np(cell.b), activation=activation
    )
    np.testing.assert_allclose(to_np(cell(x, h)), expected, rtol=0, atol=1e-10)


def test_rnn_cell_matches_torch_rnn_cell():
    cell = RNNCell(6, 8)
    torch_cell = torch.nn.RNNCell(6, 8)
    with torch.no_grad():
        torch_cell.weight_hh.copy_(cell.W)
        torch_cell.weight_ih.copy_(cell.U)
        torch_cell.bias_ih.copy_(cell.b)
        torch_cell.bias_hh.zero_()
    x, h = torch.randn(4, 6), torch.randn(4, 8)
    torch.testing.assert_close(cell(x, h), torch_cell(x, h))


def test_simple_rnn_unrolls_like_torch_rnn_layer_by_layer():
    rnn = SimpleRNN(5, 7, n_layers=2)
    torch_rnn = torch.nn.RNN(5, 7, num_layers=2, batch_first=True)
    with torch.no_grad():
        for i, cell in enumerate(rnn.cells):
            getattr(torch_rnn, f"weight_hh_l{i}").copy_(cell.W)
            getattr(torch_rnn, f"weight_ih_l{i}").copy_(cell.U)
            getattr(torch_rnn, f"bias_ih_l{i}").copy_(cell.b)
            getattr(torch_rnn, f"bias_hh_l{i}").zero_()
    x, h0 = torch.randn(3, 9, 5), torch.randn(2, 3, 7)
    out, h_n = rnn(x, h0)
    expected_out, expected_h = torch_rnn(x, h0)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(h_n, expected_h)


def test_simple_rnn_padding_steps_keep_the_state():
    rnn = SimpleRNN(4, 6, n_layers=2).eval()
    x = torch.randn(1, 5, 4)
    out, h_n = rnn(x)
    # Two left-padding and three right-padding steps around the same five real steps.
    padded = torch.cat([torch.randn(1, 2, 4), x, torch.randn(1, 3, 4)], dim=1)
    mask = torch.tensor([[False] * 2 + [True] * 5 + [False] * 3])
    out_p, h_p = rnn(padded, mask=mask)
    torch.testing.assert_close(out_p[:, 2:7], out)
    torch.testing.assert_close(h_p, h_n)
    torch.testing.assert_close(out_p[:, :2], torch.zeros(1, 2, 6))  # h_0 carried through


def test_simple_rnn_rejects_a_wrong_initial_state():
    with pytest.raises(ValueError, match=r"h0 must have shape \(2, 3, 6\)"):
        SimpleRNN(4, 6, n_layers=2)(torch.randn(3, 5, 4), torch.zeros(1, 3, 6))


def _random_step_inputs(score: torch.nn.Module, b: int = 2, s: int = 5, d: int = 4):
    query = torch.randn(b, d, dtype=torch.float64)
    features = torch.randn(b, s, d, dtype=torch.float64)
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[1, 3:] = False  # row 1 has two padding positions
    return query, features, mask


@pytest.mark.parametrize("name", ["additive", "dot", "general"])
def test_attention_step_matches_numpy_loop_of_eq_6_to_8(name):
    score = make_score(name, 4, 4, 3).double()
    query, features, mask = _random_step_inputs(score)
    context, weights = attention_step(query, features, score.project_keys(features), mask, score)
    for row in range(query.size(0)):
        kwargs = {}
        if name == "additive":  # oracle row form: h W + f U with W (Q, A), U (F, A)
            kwargs = dict(
                W=to_np(score.W.weight).T, U=to_np(score.U.weight).T, v=to_np(score.v.weight)[0]
            )
        elif name == "general":  # h^T W f with W (Q, F)
            kwargs = dict(W=to_np(score.W.weight))
        expected_context, expected_weights = ref.additive_attention_step(
            to_np(query[row]), to_np(features[row]), mask=to_np(mask[row]), score=name, **kwargs
        )
        np.testing.assert_allclose(to_np(weights[row]), expected_weights, rtol=0, atol=1e-10)
        np.testing.assert_allclose(to_np(context[row]), expected_context, rtol=0, atol=1e-10)
    assert torch.all(weights[1, 3:] == 0)  # padding gets exactly zero weight


def test_additive_keys_are_a_per_source_projection():
    score = AdditiveScore(4, 6, 5)
    features = torch.randn(2, 7, 6)
    keys = score.project_keys(features)
    assert keys.shape == (2, 7, 5)
    torch.testing.assert_close(keys, features @ score.U.weight.T)
    assert score(torch.randn(2, 4), keys).shape == (2, 7)


def test_score_construction_errors_name_the_fix():
    with pytest.raises(ValueError, match="dot score needs equal"):
        DotScore(4, 6)
    with pytest.raises(ValueError, match="choose one of"):
        make_score("cosine", 4, 4, 4)
    assert isinstance(make_score("general", 4, 6, 4), GeneralScore)


def test_recurrent_cache_reorders_states_and_source_tensors():
    h = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)  # (L, B, H)
    source = {"mask": torch.tensor([[True], [False], [True]]), "keys": torch.arange(3.0)[:, None]}
    cache = RecurrentCache((h, h + 100), source)
    cache.length = 4
    index = torch.tensor([2, 2, 0])
    cache.reorder(index)
    torch.testing.assert_close(cache.state[0], h[:, index])
    torch.testing.assert_close(cache.state[1], h[:, index] + 100)
    assert cache.source["mask"][:, 0].tolist() == [True, True, True]
    assert cache.source["keys"][:, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache.length == 4 and cache.batch_size == 3 and cache.max_len is None
