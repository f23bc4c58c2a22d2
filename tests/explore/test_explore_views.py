"""The explorer at real sizes and on every model (issue 34), over its JSON API.

Long inputs travel compactly (thumbnails, one packed head) and still equal attnlab.inspect's
numbers; the walkthrough shows the same ablated weights as the head view; BERT directories
(masked LM and classifier, random weights built here) answer every view, with the [MASK]
fillers of attnlab.generate.fill_mask; a continuation stops within one decode step when its
client leaves, beam search included, and frees the model for the next request.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlencode, urlsplit

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

from attnlab import inspect
from attnlab.explore import Session, load
from attnlab.explore.app import create_app
from attnlab.explore.probes import EXACT_CELLS, unpack
from attnlab.explore.server import start_in_thread
from explore_models import TOK, bert_dir, tiny_model

TEXT, SOURCE = "abc dea", "hello"
LONG = ("abc dea fgh ijk lmn op " * 40)[:600]  # 600 tokens of a character model


def close(got, want, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want), atol=atol)


def ids(text, bos=False):
    return torch.tensor([([TOK.bos_id] if bos else []) + TOK.encode(text)])


def post(client, endpoint, **payload):
    r = client.post(f"/api/{endpoint}", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def long_lm():
    return Session(tiny_model("decoder_lm", max_len=1024), TOK, name="long")


# ---------------------------------------------------------------------------- long inputs
def test_one_head_of_a_long_input_equals_inspect_and_is_compact(long_lm):
    model = long_lm.model
    with torch.no_grad():
        _, cache = inspect.run_with_cache(model, ids(LONG), names="*.A")
    client = TestClient(create_app(long_lm))
    got = post(client, "head", text=LONG, site="decoder", layer=1, head=1)
    assert got["weights"]["dtype"] == "f16"  # 600 x 600 > EXACT_CELLS: float16
    assert got["weights"]["layout"] == "tril"  # causal: only the keys j <= i travel
    assert EXACT_CELLS < 600 * 600 and len(got["cols"]) == len(got["rows"]) == 600
    close(unpack(got["weights"]), cache["blocks.1.self_attn.A"][0, 1], atol=1e-3)
    r = client.post("/api/head", json={"text": LONG, "layer": 0, "head": 0})
    assert len(r.content) < 2_000_000  # bytes per head view, gzip not even asked for
    short = post(client, "head", text=TEXT, site="decoder", layer=1, head=0)
    assert short["weights"]["dtype"] == "f32"  # short maps are exact
    with torch.no_grad():
        _, small = inspect.run_with_cache(model, ids(TEXT), names="*.A")
    close(unpack(short["weights"]), small["blocks.1.self_attn.A"][0, 0], atol=1e-7)


def test_overview_thumbnails_are_block_averages_scaled_per_head(long_lm):
    with torch.no_grad():
        _, cache = inspect.run_with_cache(long_lm.model, ids(LONG), names="*.A")
    got = long_lm.overview(LONG)["sites"]["decoder"]["thumbs"]
    assert got["shape"] == [4, 48, 48] and got["dtype"] == "u8"  # 2 layers x 2 heads
    thumbs = unpack(got)  # bytes / 255 x each map's maximum
    for n, (layer, head) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        a = cache[f"blocks.{layer}.self_attn.A"][0, head].float()
        want = torch.nn.functional.adaptive_avg_pool2d(a[None], (48, 48))[0]
        close(thumbs[n], want, atol=float(want.max()) / 255)
        assert got["scales"][n] == pytest.approx(float(want.max()), rel=1e-5)


def test_the_all_heads_request_refuses_what_would_be_huge(long_lm):
    with pytest.raises(Exception, match="one head at a time"):
        long_lm.attention(LONG + "a" * 200)  # 2 x 2 heads x 800 x 800 values


def test_head_and_walkthrough_only_rerun_their_module(long_lm, monkeypatch):
    """After the overview, a head or a walkthrough runs one attention module, not the model."""
    long_lm.overview(TEXT)
    calls = []
    hook = long_lm.model.embed.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        long_lm.head(TEXT, site="decoder", layer=1, head=0)
        long_lm.walkthrough(TEXT, site="decoder", layer=0, head=1, compact=True)
    finally:
        hook.remove()
    assert calls == []


# ---------------------------------------------------------------------------- views agree
@pytest.mark.parametrize("compact", [False, True])
def test_walkthrough_shows_the_ablated_weights_of_the_head_view(compact):
    session = Session(tiny_model("decoder_lm"), TOK)
    off = [["decoder", 0, 0]]
    walk = session.walkthrough(TEXT, site="decoder", layer=1, head=0, ablate=off, compact=compact)
    steps = {s["key"]: s["values"] for s in walk["steps"]}
    a = unpack(steps["A"]) if compact else torch.tensor(steps["A"])
    head = unpack(session.head(TEXT, site="decoder", layer=1, head=0, ablate=off)["weights"])
    close(a, head, atol=1e-7)
    with torch.no_grad(), inspect.ablate_heads(session.model, [(0, 0)]):
        _, cache = inspect.run_with_cache(session.model, ids(TEXT), names="*.A")
    close(a, cache["blocks.1.self_attn.A"][0, 0])
    plain = session.head(TEXT, site="decoder", layer=1, head=0)["weights"]
    assert (unpack(plain) - head).abs().max() > 1e-6  # the ablation changed layer 1
    own = session.walkthrough(TEXT, site="decoder", layer=0, head=0, ablate=off)["steps"]
    concat = torch.tensor({s["key"]: s["values"] for s in own}["concat"])
    dv = session.model.blocks[0].self_attn.d_v
    assert concat[:, :dv].abs().max() == 0 and concat[:, dv:].abs().max() > 0  # head 0 off


def test_concat_highlights_each_heads_columns():
    session = Session(tiny_model("decoder_lm", n_heads=4, d_model=32), TOK)
    for head in range(4):
        steps = session.walkthrough(TEXT, site="decoder", layer=0, head=head)["steps"]
        concat = next(s for s in steps if s["key"] == "concat")
        assert concat["highlight"] == [head * 8, head * 8 + 8] and len(concat["cols"]) == 32


# ------------------------------------------------------------------------------------- BERT
@pytest.fixture(scope="module")
def berts(tmp_path_factory):
    out = {}
    for kind in ("masked_lm", "classifier"):
        root, hf = bert_dir(tmp_path_factory.mktemp(kind), kind)
        loaded = load(root)
        session = Session(loaded.model, loaded.tokenizer, name=loaded.name, labels=loaded.labels)
        out[kind] = (session, hf, loaded.tokenizer)
    return out


def test_bert_masked_lm_fills_its_masks_like_attnlab_generate(berts):
    from attnlab.generate.fill_mask import fill_mask

    session, hf, tok = berts["masked_lm"]
    info = session.info()
    assert info["output"] == "masks" and "[MASK]" in info["example"]["text"]
    text = "the quick brown [MASK] jumps over the lazy [MASK]."
    got = session.next_token(text, ablate=[])
    want = fill_mask(session.model, tok, text, top_k=5)
    assert [m["candidates"][0]["id"] for m in got["masks"]] == [c[0].id for c in want.candidates]
    for mask, cands in zip(got["masks"], want.candidates):
        close([c["p"] for c in mask["candidates"][:5]], [c.probability for c in cands])
    with torch.no_grad():
        logits = hf(torch.tensor([tok.encode(text)])).logits[0]
    positions = [m["position"] for m in got["masks"]]
    close([m["candidates"][0]["p"] for m in got["masks"]], logits[positions].softmax(-1).amax(-1))
    ablated = session.next_token(text, ablate=[["encoder", 1, 2]])["masks"]
    assert ablated != got["masks"]  # the head grid changes the fillers
    with pytest.raises(Exception, match=r"no \[MASK\]"):
        session.next_token("no mask here")


def test_bert_classifier_answers_every_view(berts):
    session, hf, tok = berts["classifier"]
    text = "the cat sat on the mat."
    client = TestClient(create_app(session))
    probs = post(client, "next", text=text)["candidates"]
    with torch.no_grad():
        want = hf(torch.tensor([tok.encode(text)])).logits[0].softmax(-1)
    close([c["p"] for c in sorted(probs, key=lambda c: c["id"])], want)
    tokens = post(client, "tokens", text=text)["target"]["tokens"]
    assert tokens[0] == "[CLS]" and tokens.count("[CLS]") == 1  # no second class token
    with torch.no_grad():
        out = hf(torch.tensor([tok.encode(text)]), output_attentions=True)
    head = post(client, "head", text=text, site="encoder", layer=1, head=3)
    close(unpack(head["weights"]), out.attentions[1][0, 3], atol=1e-5)
    assert post(client, "overview", text=text)["sites"]["encoder"]["thumbs"]["shape"][0] == 8
    post(client, "walkthrough", text=text, site="encoder", layer=0, head=0, compact=True)
    post(client, "positions", text=text)


def test_examples_fit_each_model_kind():
    s2s = Session(tiny_model("encoder_decoder", seed=1), TOK)
    example = s2s.info()["example"]
    assert example["source"] and "greedy output" in example["note"]
    events = list(s2s.continuation(source=example["source"], max_new_tokens=20))
    assert events[-1]["text"].startswith(example["text"])
    lm = Session(tiny_model("decoder_lm"), TOK).info()["example"]
    assert lm["text"] and TOK.encode(lm["text"])  # the tokenizer reads it


# ----------------------------------------------------------------------------- stopping
def test_cancel_stops_beam_search_within_a_decode_step():
    session = Session(tiny_model("decoder_lm", max_len=600), TOK)
    cancel, steps = threading.Event(), []

    def count(_m, _a):
        steps.append(1)
        if len(steps) == 3:
            cancel.set()

    hook = session.model.embed.tok_emb.register_forward_pre_hook(count)
    try:
        events = list(
            session.continuation(
                text=TEXT, strategy="beam", beams=8, max_new_tokens=500, cancel=cancel
            )
        )
    finally:
        hook.remove()
    assert events == [{"type": "stopped", "ids": []}] and len(steps) == 3
    assert session.lock.acquire(blocking=False)  # free at once
    session.lock.release()


def test_a_client_that_leaves_frees_the_model_for_the_next_request():
    session = Session(tiny_model("decoder_lm", max_len=600), TOK)
    steps, started = [], threading.Event()

    def count(_m, _a):
        steps.append(1)
        started.set()
        time.sleep(0.01)  # each decode step takes a while: 500 steps would take >= 5 s

    hook = session.model.embed.tok_emb.register_forward_pre_hook(count)
    server = start_in_thread(session)
    try:
        url = urlsplit(server.url)
        query = urlencode({"text": TEXT, "strategy": "beam", "beams": 8, "max_new_tokens": 500})
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.request("GET", f"/api/stream?{query}")
        assert started.wait(30)
        conn.sock.close()  # the client leaves mid-search
        conn.close()
        assert session.lock.acquire(timeout=30)  # released once the next step sees it
        session.lock.release()
        done = len(steps)
        body = json.dumps({"text": "ab"}).encode()
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.request("POST", "/api/tokens", body, {"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        assert done < 400 and len(steps) == done  # stopped long before the 500 steps
    finally:
        hook.remove()
        server.stop()
