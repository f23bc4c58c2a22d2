"""The explorer's one-head views on today's attention variants: grouped-query attention (a key/value
head shared by several query heads, Llama / Qwen2 / Mistral), soft-capped logits (Gemma 2) and a
position bias added to the logits (ALiBi). Every number is checked against the module's own
projections and a softmax computed here; the equation each view prints must be the one computed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

from attnlab.data import LabelSet
from attnlab.explore import Session
from attnlab.explore.app import create_app
from attnlab.explore.probes import unpack
from explore_models import TOK, tiny_model
from hf_dirs import spread

TEXT = "abc dea"
CAP = 0.5  # small, so that the cap visibly bends the logits of a random model


def softmax_rows(scaled: np.ndarray, mask: np.ndarray) -> np.ndarray:
    z = np.where(mask, scaled, -np.inf)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def sessions():
    return {
        "gqa": Session(tiny_model(n_heads=4, n_kv_heads=2, seed=5), TOK, name="gqa"),
        "mqa": Session(tiny_model(n_heads=4, n_kv_heads=1, seed=6), TOK, name="mqa"),
        "capped": Session(
            spread(tiny_model(seed=7, attn_logit_softcap=CAP), 0.5), TOK, name="capped"
        ),
        "alibi": Session(tiny_model(seed=8, positional="alibi"), TOK, name="alibi"),
    }


def projections(module, x: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Head h's q, k, v from the fused projection's weights, key/value head h // G."""
    dk, dv, g = module.d_head, module.d_v, module.n_heads // module.n_kv_heads
    w, b = module.qkv_proj.weight.detach().double(), module.qkv_proj.bias.detach().double()
    y = torch.from_numpy(x) @ w.T + b  # (T, H Dk + H_kv (Dk + Dv))
    q_all, rest = y[:, : module.n_heads * dk], y[:, module.n_heads * dk :]
    k_all, v_all = rest[:, : module.n_kv_heads * dk], rest[:, module.n_kv_heads * dk :]
    kv = h // g
    q = q_all[:, h * dk : (h + 1) * dk]
    k, v = k_all[:, kv * dk : (kv + 1) * dk], v_all[:, kv * dv : (kv + 1) * dv]
    return q.numpy(), k.numpy(), v.numpy()


@pytest.mark.parametrize("name", ["gqa", "mqa"])
def test_every_query_head_reads_its_shared_key_value_head(sessions, name):
    session = sessions[name]
    module = session.model.get_submodule("blocks.1.self_attn")
    for h in range(module.n_heads):  # heads past H_kv used to fail (index out of range)
        got = session.walkthrough(TEXT, site="decoder", layer=1, head=h)
        steps = {s["key"]: s for s in got["steps"]}
        value = {k: np.asarray(s["values"], dtype=np.float64) for k, s in steps.items()}
        q, k, v = projections(module, value["X"], h)
        np.testing.assert_allclose(value["Q"], q, atol=1e-5)
        np.testing.assert_allclose(value["K"], k, atol=1e-5)
        np.testing.assert_allclose(value["V"], v, atol=1e-5)
        kv = h // (module.n_heads // module.n_kv_heads)
        assert f"key/value head {kv} of {module.n_kv_heads}" in steps["K"]["title"]
        assert f"W_K^{kv} " in steps["K"]["equation"] and f"W_V^{kv} " in steps["V"]["equation"]
        np.testing.assert_allclose(value["scores"], q @ k.T, atol=1e-5)
        a = softmax_rows(value["scores"] / math.sqrt(module.d_head), value["mask"].astype(bool))
        np.testing.assert_allclose(value["A"], a, atol=1e-6)
        np.testing.assert_allclose(value["heads"], a @ v, atol=1e-5)
        shown = unpack(session.head(TEXT, site="decoder", layer=1, head=h)["weights"])
        np.testing.assert_allclose(shown.numpy(), a, atol=1e-6)  # the head view: the same A
        n = session.neuron(TEXT, site="decoder", layer=1, head=h, query=4, key=2)
        assert math.isclose(sum(n["product"]), n["score"], abs_tol=1e-5)  # q_i . k_j
        assert math.isclose(n["score"], value["scores"][4, 2], abs_tol=1e-5)
        np.testing.assert_allclose(n["k"], k[2], atol=1e-5)


def test_soft_capped_logits_are_shown_as_computed(sessions):
    session = sessions["capped"]
    got = session.walkthrough(TEXT, site="decoder", layer=0, head=1)
    steps = {s["key"]: s for s in got["steps"]}
    scores = np.asarray(steps["scores"]["values"], dtype=np.float64)
    scaled = np.asarray(steps["scaled"]["values"], dtype=np.float64)
    f = 1 / math.sqrt(session.model.get_submodule("blocks.0.self_attn").d_head)
    want = CAP * np.tanh(scores * f / CAP)
    np.testing.assert_allclose(scaled, want, atol=1e-6)
    assert np.abs(scores * f - want).max() > 1e-3  # the cap is not a no-op here
    assert f"{CAP:g} tanh(" in steps["scaled"]["equation"]
    assert "soft-capped" in steps["scaled"]["title"] and "Gemma 2" in steps["scaled"]["note"]
    mask = np.asarray(steps["mask"]["values"]).astype(bool)
    np.testing.assert_allclose(
        np.asarray(steps["A"]["values"]), softmax_rows(scaled, mask), atol=1e-6
    )
    n = session.neuron(TEXT, site="decoder", layer=0, head=1, query=5, key=3)
    assert math.isclose(n["scaled"], CAP * math.tanh(n["score"] * n["factor"] / CAP), abs_tol=1e-6)
    assert n["scaled_equation"] == steps["scaled"]["equation"].removeprefix("scaled = ")


def test_a_position_bias_is_part_of_the_neuron_views_equation(sessions):
    session = sessions["alibi"]
    walk = {
        s["key"]: s for s in session.walkthrough(TEXT, site="decoder", layer=0, head=0)["steps"]
    }
    n = session.neuron(TEXT, site="decoder", layer=0, head=0, query=5, key=1)
    assert "+ bias" in n["scaled_equation"]
    assert n["scaled_equation"] == walk["scaled"]["equation"].removeprefix("scaled = ")
    assert abs(n["scaled"] - n["score"] * n["factor"]) > 1e-4  # the bias moved it


def test_a_classifiers_class_token_counts_against_its_context():
    model = tiny_model("classifier", n_classes=3)  # max_len 24, the class token at position 0
    client = TestClient(create_app(Session(model, TOK, labels=LabelSet(["a", "b", "c"]))))
    ok = client.post("/api/next", json={"text": "a" * 23})
    assert ok.status_code == 200, ok.text
    for endpoint in ("next", "attention", "tokens", "positions"):
        r = client.post(f"/api/{endpoint}", json={"text": "a" * 24})
        assert r.status_code == 400, (endpoint, r.text)
        assert "25 tokens long but the model accepts at most 24" in r.json()["error"]
