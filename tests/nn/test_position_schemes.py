"""One position protocol: what a scheme's ``describe()`` reports is what the model computes.

For every scheme and rotary scaling of ``ModelConfig.positional``, on a tiny decoder LM:
  * the embedding side: describe's table equals the signal P the embedding adds (hook point P);
  * the rotation side: describe's angles, turned through cos/sin here, take the model's Q (hook
    point Q) to its rotated Q_rot;
  * the logit-bias side: describe's bias equals the logits minus the scaled scores
    (hook points scaled and scores);
  * and the explorer's positions view (its JSON API) shows those same numbers.
Regression cases of issue 32: ALiBi's view said "permutation equivariant"; linear rope scaling
(factor 4) drew angles 4x too large.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

from attnlab.config import _CHOICES, ModelConfig
from attnlab.explore import Session
from attnlab.explore.app import create_app
from attnlab.inspect import run_with_cache
from attnlab.models import build_model
from attnlab.nn.positional import SCHEMES
from explore_models import TOK

T = 6
TEXT = "abcdef"  # T tokens
ROPE = {
    "rotary": {},
    "rotary, linear x4": dict(rope_scaling="linear", rope_factor=4.0),
    "rotary, llama3": dict(
        rope_scaling="llama3", rope_factor=8.0, rope_high_freq_factor=4.0, rope_original_max_len=8
    ),
}
CASES = {**{k: dict(positional=k) for k in _CHOICES["positional"] if k != "rotary"}}
CASES.update({name: dict(positional="rotary", **extra) for name, extra in ROPE.items()})


def _model(**changes) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(
        kind="decoder_lm",
        vocab_size=TOK.vocab_size,
        d_model=32,
        n_heads=2,  # d_head 16: the head width of issue 32's numbers
        n_layers=1,
        d_ff=32,
        max_len=16,
        **changes,
    )
    return build_model(cfg).eval()


def _close(got, want, atol=1e-5):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want), atol=atol)


def _rotate(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate-half by the given angles (T, Dh/2), computed here in float64."""
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.double().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def test_every_config_choice_has_a_scheme():
    assert set(_CHOICES["positional"]) <= set(SCHEMES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_describe_equals_what_the_model_computes_and_the_explorer_shows(case):
    model = _model(**CASES[case])
    ids = torch.tensor([TOK.encode(TEXT)])
    scheme = model.embed.pos_enc
    described = scheme.describe(torch.arange(T))
    attn = "blocks.0.self_attn"
    names = [f"{attn}.{n}" for n in ("Q", "scores", "scaled")]
    names += [f"{attn}.Q_rot"] if scheme.rotates else []
    names += ["embed.P"] if scheme.embeds else []
    with torch.no_grad():
        _, cache = run_with_cache(model, ids, names=names)
    if described.acts_on == "embeddings":  # the signal P the embedding adds
        assert scheme.embeds and not (scheme.rotates or scheme.biases)
        _close(described.values, cache["embed.P"].reshape(T, -1), atol=1e-6)
    elif described.acts_on == "queries and keys":  # the angles q_m is turned by
        assert scheme.rotates and not scheme.embeds
        want = _rotate(cache[f"{attn}.Q"][0], described.values)  # (H, T, Dh)
        _close(cache[f"{attn}.Q_rot"][0], want)
        _close(described.values, torch.arange(T)[:, None] * described.tables["frequencies"])
    elif described.acts_on == "logits":  # the bias added to the scaled scores
        assert scheme.biases and not scheme.embeds
        scores, scaled = cache[f"{attn}.scores"][0], cache[f"{attn}.scaled"][0]  # (H, T, T)
        _close(scaled - scores / 4.0, described.tables["bias"])  # 1/sqrt(16)
        _close(described.values, described.tables["bias"][0])
    else:
        assert described.acts_on == "nothing" and described.values is None
        assert not (scheme.embeds or scheme.rotates or scheme.biases)
        assert "permutation equivariant" in described.summary
    if described.acts_on != "nothing":
        assert "permutation equivariant" not in described.summary
    client = TestClient(create_app(Session(model, TOK, name=case)))
    r = client.post("/api/positions", json={"text": TEXT})
    assert r.status_code == 200, r.text
    (view,) = r.json()["views"]
    assert (view["kind"], view["acts_on"]) == (described.kind, described.acts_on)
    assert (view["equation"], view["note"]) == (described.equation, described.summary)
    assert view["cols"] == described.cols
    if described.values is None:
        assert view["values"] == []
    else:
        _close(view["values"], described.values, atol=1e-6)
    assert set(view["tables"]) == set(described.tables)
    for name, table in described.tables.items():
        _close(view["tables"][name], table, atol=1e-6)


def test_alibi_view_says_order_comes_from_a_logit_bias():
    model = _model(positional="alibi")
    client = TestClient(create_app(Session(model, TOK, name="alibi")))
    (view,) = client.post("/api/positions", json={"text": TEXT}).json()["views"]
    assert view["kind"] == "alibi" and view["acts_on"] == "logits"
    assert "logit bias" in view["note"] and "permutation equivariant" not in view["note"]
    _close(view["tables"]["slopes"], [0.0625, 0.00390625])  # m_h = 2^(-8h/H), H = 2
    _close(view["values"][5][:3], [-0.3125, -0.25, -0.1875])  # head 0: -m_0 |5 - j|


def test_linear_rope_scaling_view_draws_the_models_angles():
    model = _model(positional="rotary", rope_scaling="linear", rope_factor=4.0)
    client = TestClient(create_app(Session(model, TOK, name="rope x4")))
    (view,) = client.post("/api/positions", json={"text": TEXT}).json()["views"]
    _close(view["values"][5][:4], [1.25, 0.3952847, 0.125, 0.03952847], atol=1e-6)
    assert "Linear scaling" in view["note"] and "/ 4" in view["equation"]


def test_none_is_permutation_equivariant_without_a_causal_mask():
    """The 'none' summary is true: an encoder without positions commutes with permutations."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        kind="masked_lm",
        vocab_size=TOK.vocab_size,
        d_model=16,
        n_heads=2,
        n_layers=2,
        d_ff=32,
        max_len=16,
        positional="none",
        dropout=0.0,
    )
    model = build_model(cfg).eval()
    ids = torch.tensor([TOK.encode(TEXT)])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        out, permuted = model(ids).logits, model(ids[:, perm]).logits
    torch.testing.assert_close(permuted, out[:, perm])


@pytest.mark.parametrize("case", ["alibi", "rotary, linear x4", "learned"])
def test_walkthrough_names_the_scheme_acting_inside_attention(case):
    model = _model(**CASES[case])
    described = model.embed.pos_enc.describe(torch.arange(T))
    client = TestClient(create_app(Session(model, TOK, name=case)))
    payload = {"text": TEXT, "site": "decoder", "layer": 0, "head": 1}
    r = client.post("/api/walkthrough", json=payload)
    assert r.status_code == 200, r.text
    steps = {s["key"]: s for s in r.json()["steps"]}
    scaled, scores = np.asarray(steps["scaled"]["values"]), np.asarray(steps["scores"]["values"])
    if case == "alibi":  # the logits carry the bias, and the step says so
        assert "bias" in steps["scaled"]["equation"] and "alibi" in steps["scaled"]["equation"]
        _close(scaled - scores / 4.0, described.tables["bias"][1], atol=1e-5)
    else:
        assert "bias" not in steps["scaled"]["equation"]
        _close(scaled, scores / 4.0, atol=1e-5)
    rotated = "rotated" in steps["Q"]["equation"]
    assert rotated == (case.startswith("rotary"))
    if rotated:
        assert described.equation in steps["Q"]["equation"]
