"""The explorer's JSON endpoints and token stream (attnlab.explore.app over session.py).

Every number an endpoint returns is checked against an independent source: the model's own
attention weights (need_weights=True), the NumPy oracle (attnlab.reference), the sampler's code,
attnlab.generate, and an ablation done by editing W^O. Bad input answers one readable message and
the server keeps serving; nothing outside the static folder is served; pickle is never loaded.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

from attnlab import reference
from attnlab.data import LabelSet
from attnlab.errors import CheckpointError
from attnlab.explore import ExploreError, Session, load
from attnlab.explore.app import create_app
from attnlab.generate import GenerationConfig, generate, generate_seq2seq
from attnlab.generate.sampling import process_logits
from explore_models import TOK, tiny_model

TEXT, SOURCE = "abc dea", "hello"


@pytest.fixture(scope="module")
def models():
    return {
        "lm": tiny_model("decoder_lm"),
        "s2s": tiny_model("encoder_decoder", seed=1),
        "lstm": tiny_model("lstm_seq2seq", seed=2, rnn_attention="additive"),
        "rotary": tiny_model("decoder_lm", seed=3, positional="rotary"),
        "sin": tiny_model("encoder_decoder", seed=4, positional="sinusoidal"),
    }


@pytest.fixture(scope="module")
def clients(models):
    return {k: TestClient(create_app(Session(m, TOK, name=k))) for k, m in models.items()}


def post(client, endpoint, **payload):
    r = client.post(f"/api/{endpoint}", json=payload)
    assert r.status_code == 200, r.text
    return r.json()


def close(got, want, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), np.asarray(want), atol=atol)


def ids(text, bos=False):
    return torch.tensor([([TOK.bos_id] if bos else []) + TOK.encode(text)])


# --------------------------------------------------------------------------------- info, tokens
def test_info_lists_sites_layers_and_heads(clients):
    lm = clients["lm"].get("/api/info").json()
    assert lm["kind"] == "decoder_lm" and not lm["seq2seq"] and lm["generative"]
    assert [(s["name"], s["layers"], s["heads"]) for s in lm["sites"]] == [("decoder", 2, 2)]
    s2s = clients["s2s"].get("/api/info").json()
    assert [s["name"] for s in s2s["sites"]] == ["encoder", "decoder", "cross"] and s2s["seq2seq"]
    lstm = clients["lstm"].get("/api/info").json()
    assert [(s["name"], s["layers"], s["heads"]) for s in lstm["sites"]] == [("alignment", 1, 1)]


def test_tokens_are_the_tokenizers(clients):
    got = post(clients["s2s"], "tokens", text="ab", source=SOURCE)
    assert got["source"] == {
        "ids": TOK.encode(SOURCE),
        "tokens": [TOK.token_to_str(i) for i in TOK.encode(SOURCE)],
        "unknown": [],
    }
    assert got["target"]["ids"] == [TOK.bos_id] + TOK.encode("ab")
    assert got["target"]["tokens"][0] == "<bos>"


# ---------------------------------------------------------------------------------- attention
def test_attention_equals_the_models_weights_lm(clients, models):
    got = post(clients["lm"], "attention", text=TEXT)["sites"]["decoder"]
    with torch.no_grad():
        want = models["lm"](ids(TEXT), need_weights=True).attentions
    assert got["rows"] == got["cols"] == [TOK.token_to_str(i) for i in TOK.encode(TEXT)]
    for layer, w in zip(got["layers"], want):
        close(layer, w.self_attn[0])


@pytest.mark.parametrize("name", ["s2s", "sin"])
def test_attention_equals_the_models_weights_seq2seq(clients, models, name):
    model = models[name]
    sites = post(clients[name], "attention", text="ab", source=SOURCE)["sites"]
    with torch.no_grad():
        enc = model.encoder(ids(SOURCE), need_weights=True).attentions
        dec = model.decode(ids("ab", bos=True), model.encode(ids(SOURCE)), need_weights=True)
    for i in range(2):
        close(sites["encoder"]["layers"][i], enc[i].self_attn[0])
        close(sites["decoder"]["layers"][i], dec.attentions[i].self_attn[0])
        close(sites["cross"]["layers"][i], dec.attentions[i].cross_attn[0])
    assert len(sites["cross"]["rows"]) == 3 and len(sites["cross"]["cols"]) == len(SOURCE)


@pytest.mark.parametrize("kind", ["classifier", "encoder"])
def test_encoder_only_models_show_their_self_attention(kind):
    model = tiny_model(kind, **({"n_classes": 3} if kind == "classifier" else {}))
    session = Session(model, TOK)
    got = session.attention("abc")["sites"]["encoder"]
    ids_ = ids("abc", bos=kind == "classifier")  # the class token sits at position 0
    with torch.no_grad():
        want = model(ids_, need_weights=True).attentions
    for layer, w in zip(got["layers"], want):
        close(layer, w.self_attn[0])
    assert not session.info()["generative"]
    if kind == "encoder":
        assert session.info()["output"] is None
        with pytest.raises(ExploreError, match="outputs vectors"):
            session.next_token("abc")
        return
    labels = LabelSet(["neg", "neu", "pos"])
    session = Session(model, TOK, labels=labels)
    got = session.next_token("abc", ablate=[["encoder", 1, 0]])["candidates"]
    edited = _without_head(model, "encoder.stack.blocks.1.self_attn", 0)
    with torch.no_grad():
        p = edited(ids_).logits[0].softmax(-1)
    assert sorted(c["token"] for c in got) == ["neg", "neu", "pos"]
    close([c["p"] for c in got], p[[c["id"] for c in got]])
    assert session.info()["output"] == "labels"
    with pytest.raises(ExploreError, match="labels, not tokens"):
        list(session.continuation("abc"))


def test_a_model_without_attention_still_shows_tokens_and_next_token():
    session = Session(tiny_model("rnn_lm"), TOK)
    assert session.info()["sites"] == [] and session.attention("abc")["sites"] == {}
    assert session.positions("abc")["views"][0]["kind"] == "none"
    assert len(session.next_token("abc")["candidates"]) == 20
    with pytest.raises(ExploreError, match="no attention"):
        session.walkthrough("abc")


def test_bahdanau_alignment_equals_alpha(clients, models):
    got = post(clients["lstm"], "attention", text="ab", source=SOURCE)["sites"]["alignment"]
    model = models["lstm"]
    with torch.no_grad():
        out = model.decode(ids("ab", bos=True), model.encode(ids(SOURCE)), need_weights=True)
    close(got["layers"][0][0], out.attentions[0].cross_attn[0, 0])


def test_values_equal_the_inspect_apis(models):
    """Attention, every walkthrough step and ablated distributions, against attnlab.inspect."""
    from attnlab import inspect

    session = Session(models["s2s"], TOK)
    model, src, tgt = models["s2s"], ids(SOURCE), ids("ab", bos=True)
    with torch.no_grad(), inspect.capture(model) as cache:
        logits = model.decode(tgt, model.encode(src)).logits
    sites = session.attention("ab", SOURCE)["sites"]
    for site, prefix in (
        ("encoder", "encoder.stack.blocks"),
        ("decoder", "blocks"),
        ("cross", "blocks"),
    ):
        kind = "cross_attn" if site == "cross" else "self_attn"
        for layer in range(2):
            close(sites[site]["layers"][layer], cache[f"{prefix}.{layer}.{kind}.A"][0])
    walk = session.walkthrough("ab", SOURCE, site="cross", layer=1, head=0)["steps"]
    for step in walk:
        name = f"blocks.1.cross_attn.{step['key']}"
        if step["key"] in ("Q", "K", "V", "scores", "scaled", "A", "heads"):
            close(step["values"], cache[name][0, 0], atol=1e-6)
        elif step["key"] in ("concat", "out"):
            close(step["values"], cache[name][0], atol=1e-6)
    views = session.positions("ab", SOURCE)["views"]
    close(views[0]["values"], cache["encoder.embed.P"])  # the signal added to the source
    close(views[1]["values"], cache["tgt_embed.P"])
    heads = [(0, 1)]
    with torch.no_grad(), inspect.ablate_heads(model, heads, site="cross"):
        p = model.decode(tgt, model.encode(src)).logits[0, -1].softmax(-1)
    got = session.next_token("ab", SOURCE, ablate=[["cross", 0, 1]])["candidates"]
    close([c["p"] for c in got], p[[c["id"] for c in got]])
    plain = session.next_token("ab", SOURCE)["candidates"]
    close([c["p"] for c in plain], logits[0, -1].softmax(-1)[[c["id"] for c in plain]])


def test_a_switched_off_heads_walkthrough_shows_its_a_v_and_the_zeros_it_becomes(models):
    """head_h = A V is shown as computed, marked switched off; the concatenation holds zeros in
    its columns, and A, V are those of the unablated model (the intervention comes after)."""
    session = Session(models["s2s"], TOK)
    plain = {
        s["key"]: s
        for s in session.walkthrough("ab", SOURCE, site="cross", layer=1, head=0)["steps"]
    }
    off = session.walkthrough("ab", SOURCE, site="cross", layer=1, head=0, ablate=[["cross", 1, 0]])
    steps = {s["key"]: s for s in off["steps"]}
    assert "switched off" in steps["heads"]["title"] and "→ 0" in steps["heads"]["equation"]
    a, v = torch.tensor(steps["A"]["values"]), torch.tensor(steps["V"]["values"])
    close(steps["heads"]["values"], a @ v, atol=1e-6)
    close(steps["heads"]["values"], plain["heads"]["values"], atol=1e-6)
    dv = v.size(-1)
    assert torch.count_nonzero(torch.tensor(steps["concat"]["values"])[:, :dv]) == 0
    assert "switched off" not in plain["heads"]["title"]


def test_the_lstm_alignment_is_inspects_alpha(models):
    from attnlab import inspect

    model = models["lstm"]
    with torch.no_grad():
        _, cache = inspect.run_with_cache(model, ids(SOURCE), ids("ab", bos=True))
    got = Session(model, TOK).attention("ab", SOURCE)["sites"]["alignment"]["layers"][0][0]
    close(got, cache["alpha"][0])


# -------------------------------------------------------------------------------- walkthrough
@pytest.mark.parametrize(
    ("name", "site"),
    [("lm", "decoder"), ("rotary", "decoder"), ("s2s", "cross"), ("s2s", "encoder")],
)
def test_walkthrough_steps_follow_the_equation(clients, models, name, site):
    source = SOURCE if name == "s2s" else None
    got = post(clients[name], "walkthrough", text="ab", source=source, site=site, layer=1, head=1)
    steps = {s["key"]: np.asarray(s["values"], dtype=np.float64) for s in got["steps"]}
    module = models[name].get_submodule(got["module"])
    dk, dv, h = module.d_head, module.d_v, 1
    q, k, v = steps["Q"], steps["K"], steps["V"]
    if name != "rotary":  # with RoPE, Q and K are the rotated projections
        src = steps.get("M", steps["X"])
        w = module.q_proj.weight if site == "cross" else module.qkv_proj.weight
        b = module.q_proj.bias if site == "cross" else module.qkv_proj.bias
        wq, bq = w[h * dk : (h + 1) * dk].double().detach(), b[h * dk : (h + 1) * dk].double()
        close(q, steps["X"] @ wq.numpy().T + bq.detach().numpy(), atol=1e-5)
        assert src.shape[0] == k.shape[0]
    close(steps["scores"], q @ k.T, atol=1e-5)
    close(steps["scaled"], steps["scores"] / math.sqrt(dk), atol=1e-5)
    mask = steps["mask"].astype(bool)
    oracle = reference.attention(q, k, v, mask)  # NumPy loops, float64
    close(steps["A"], oracle.weights)
    close(steps["heads"], oracle.out, atol=1e-5)
    close(steps["concat"][:, h * dv : (h + 1) * dv], steps["heads"])
    wo, bo = module.out_proj.weight.double().detach().numpy(), module.out_proj.bias.detach()
    close(steps["out"], steps["concat"] @ wo.T + bo.double().numpy(), atol=1e-5)
    attention = post(clients[name], "attention", text="ab", source=source)["sites"][site]
    close(steps["A"], attention["layers"][1][1])
    if site == "decoder":
        assert (np.triu(np.ones_like(mask), 1).astype(bool) & mask).sum() == 0  # future masked


def test_bahdanau_walkthrough_follows_004_eq_5_to_8(clients, models):
    got = post(clients["lstm"], "walkthrough", text="ab", source=SOURCE)
    assert got["head"] == {"site": "alignment", "layer": 0, "head": 0}
    q = {s["key"]: torch.tensor(s["values"], dtype=torch.float64) for s in got["steps"]}
    score = copy.deepcopy(models["lstm"].score).double()
    with torch.no_grad():
        close(q["keys"], score.U(q["f"]), atol=1e-5)  # U f_t
        for step in (1, 2):  # e_l = v^T tanh(W h^d_{l-1} + U f_t) from the previous state
            close(q["e"][step], score(q["h_dec"][step - 1][None], q["keys"][None])[0], atol=1e-5)
    close(q["alpha"], q["e"].softmax(-1))
    close(q["v_l"], q["alpha"] @ q["f"], atol=1e-5)
    alignment = post(clients["lstm"], "attention", text="ab", source=SOURCE)["sites"]["alignment"]
    close(alignment["layers"][0][0], q["alpha"])


# ---------------------------------------------------------------------------------- positions
def test_positions_show_each_models_signal(clients, models):
    learned = post(clients["lm"], "positions", text="abc")["views"][0]
    assert learned["kind"] == "learned"
    close(learned["values"], models["lm"].embed.pos_enc.table.weight[:3].detach())
    sin = post(clients["sin"], "positions", text="ab", source=SOURCE)["views"]
    assert [(v["kind"], v["side"], len(v["values"])) for v in sin] == [
        ("sinusoidal", "source", len(SOURCE)),
        ("sinusoidal", "target", 3),
    ]
    close(sin[0]["values"], reference.sinusoidal_encoding(len(SOURCE), 16))
    rot = post(clients["rotary"], "positions", text="abcd")["views"][0]
    theta = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    close(rot["values"], np.arange(4)[:, None] * theta)
    lstm = post(clients["lstm"], "positions", text="a", source="b")["views"][0]
    assert lstm["kind"] == "none" and "recurrent" in lstm["note"]


# ------------------------------------------------------------------------------- next token
def test_next_token_distribution_and_controls(clients, models):
    got = post(clients["lm"], "next", text=TEXT, temperature=0.7, top_k=5, top_p=0.9)
    with torch.no_grad():
        logits = models["lm"](ids(TEXT)).logits[0, -1]
    p = logits.softmax(-1)
    cfg = GenerationConfig(temperature=0.7, top_k=5, top_p=0.9)
    q = process_logits(logits[None], cfg, None)[0].softmax(-1)
    cands = got["candidates"]
    assert len(cands) == min(20, TOK.vocab_size)
    assert [c["id"] for c in cands] == torch.topk(p, len(cands)).indices.tolist()
    close([c["p"] for c in cands], p[[c["id"] for c in cands]])
    close([c["p_sample"] for c in cands], q[[c["id"] for c in cands]])
    assert sum(c["p_sample"] > 0 for c in cands) <= 5
    greedy = post(clients["lm"], "next", text=TEXT, temperature=0)["candidates"]
    assert greedy[0]["p_sample"] == 1.0 and all(c["p_sample"] == 0 for c in greedy[1:])


def _without_head(model, path, head):
    """An independent ablation: a copy whose W^O ignores head ``head``'s columns."""
    model = copy.deepcopy(model)
    attn = model.get_submodule(path)
    with torch.no_grad():
        attn.out_proj.weight[:, head * attn.d_v : (head + 1) * attn.d_v] = 0.0
    return model


def test_ablation_changes_the_distribution_as_w_o_editing_predicts(clients, models):
    off = [{"site": "decoder", "layer": 0, "head": 1}]
    got = post(clients["lm"], "next", text=TEXT, ablate=off)
    assert got["ablated"] == off
    edited = _without_head(models["lm"], "blocks.0.self_attn", 1)
    with torch.no_grad():
        p = edited(ids(TEXT)).logits[0, -1].softmax(-1)
    close([c["p"] for c in got["candidates"]], p[[c["id"] for c in got["candidates"]]])
    plain = post(clients["lm"], "next", text=TEXT)["candidates"]
    assert any(abs(a["p"] - b["p"]) > 1e-4 for a, b in zip(plain, got["candidates"]))
    # the ablation lasts only for its request
    assert post(clients["lm"], "next", text=TEXT)["candidates"] == plain
    cross = post(
        clients["s2s"], "next", text="a", source=SOURCE, ablate=[["cross", 1, 0], ["encoder", 0, 1]]
    )["candidates"]
    model = _without_head(models["s2s"], "blocks.1.cross_attn", 0)
    model = _without_head(model, "encoder.stack.blocks.0.self_attn", 1)
    with torch.no_grad():
        p = model.decode(ids("a", bos=True), model.encode(ids(SOURCE))).logits[0, -1].softmax(-1)
    close([c["p"] for c in cross], p[[c["id"] for c in cross]])


# ----------------------------------------------------------------------------------- stream
def events(client, **params):
    query = {k: json.dumps(v) if isinstance(v, list) else str(v) for k, v in params.items()}
    out = []
    with client.stream("GET", "/api/stream", params=query) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


@pytest.mark.parametrize("strategy", ["greedy", "sample", "beam"])
def test_stream_yields_the_generators_tokens_one_event_each(clients, models, strategy):
    got = events(clients["lm"], text=TEXT, strategy=strategy, max_new_tokens=6, seed=5,
                 temperature=0.8, top_k=4, beams=3)  # fmt: skip
    settings = {
        "greedy": dict(temperature=0),
        "sample": dict(temperature=0.8, top_k=4),
        "beam": dict(temperature=0, num_beams=3),
    }
    cfg = GenerationConfig(max_new_tokens=6, seed=5, **settings[strategy])
    want = generate(models["lm"], TOK.encode(TEXT), cfg, tokenizer=TOK).tokens[0]
    tokens = [e["id"] for e in events_of(got, "token")]
    assert tokens == want and got[-1] == {"type": "done", "text": TOK.decode(want), "ids": want}
    assert all(e["token"] == TOK.token_to_str(e["id"]) for e in events_of(got, "token"))


def events_of(evts, kind):
    return [e for e in evts if e["type"] == kind]


def test_stream_seq2seq_and_ablated(clients, models):
    got = events(
        clients["s2s"], source=SOURCE, strategy="greedy", max_new_tokens=5, ablate=[["cross", 0, 0]]
    )
    model = _without_head(models["s2s"], "blocks.0.cross_attn", 0)
    cfg = GenerationConfig(max_new_tokens=5, temperature=0)
    want = generate_seq2seq(model, TOK.encode(SOURCE), cfg, tokenizer=TOK).tokens[0]
    assert [e["id"] for e in events_of(got, "token")] == want


# -------------------------------------------------------------------------- bad input, safety
BAD = [
    ("attention", {"text": ""}, "empty"),
    ("attention", {"text": "a" * 30}, "at most 24"),
    ("attention", {"text": "xyz"}, "cannot read"),
    ("next", {"text": "ab", "ablate": [["decoder", 5, 0]]}, "Unknown head"),
    ("next", {"text": "ab", "ablate": [["cross", 0, 0]]}, "Unknown attention site"),
    ("next", {"text": "ab", "top_p": 2}, "top_p"),
    ("walkthrough", {"text": "ab", "site": "decoder", "layer": 0, "head": 9}, "Unknown head"),
]


@pytest.mark.parametrize(("endpoint", "payload", "message"), BAD)
def test_bad_input_is_one_message_and_the_server_keeps_serving(clients, endpoint, payload, message):
    r = clients["lm"].post(f"/api/{endpoint}", json=payload)
    assert r.status_code == 400 and message in r.json()["error"]
    assert "Traceback" not in r.text and "\n" not in r.json()["error"]
    assert post(clients["lm"], "tokens", text="ab")["target"]["ids"] == TOK.encode("ab")


def test_bad_requests(clients):
    c = clients["lm"]
    bad = c.post("/api/attention", content=b"{nope", headers={"content-type": "application/json"})
    assert bad.json()["error"].startswith("The request body")
    assert c.post("/api/attention", json=[1]).status_code == 400
    assert "source" in clients["s2s"].post("/api/attention", json={"text": "a"}).json()["error"]
    err = events(c, text="ab", strategy="nope")
    message = "strategy must be greedy, sample or beam, not 'nope'"
    assert err == [{"type": "error", "error": message}]
    assert events(c, text="")[0]["type"] == "error"


@pytest.mark.parametrize(
    "path",
    [
        "/static/../app.py",
        "/static/%2e%2e/app.py",
        "/static/..%2fsession.py",
        "/app.py",
        "/static//etc/passwd",
        "/static/%2fetc%2fpasswd",
    ],
)
def test_serves_nothing_outside_its_assets(clients, path):
    r = clients["lm"].get(path)
    assert r.status_code == 404 and "import" not in r.text


def test_serves_its_own_assets(clients):
    c = clients["lm"]
    page = c.get("/")
    assert page.status_code == 200 and 'src="/static/page.js"' in page.text
    js = c.get("/static/explorer.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert "http://" not in js.text.replace("http://www.w3.org", "") and "https://" not in js.text
    assert "https://" not in page.text and "http://" not in page.text  # offline: no CDN


def test_host_check_on_loopback(models):
    app = create_app(Session(models["lm"], TOK), allowed_hosts=["127.0.0.1", "localhost"])
    assert TestClient(app, base_url="http://127.0.0.1").get("/api/info").status_code == 200
    assert TestClient(app, base_url="http://evil.example").get("/api/info").status_code == 400


def test_never_loads_pickle(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(CheckpointError, match="never loads pickle"):
        load(tmp_path)


def test_tokens_name_the_characters_read_as_unk():
    """A tokenizer that maps unseen characters to <unk> reads "The Cat" without an error; the
    tokens view names 'T' and 'C' so the page can say so instead of a silent <unk>."""
    from attnlab.config import ModelConfig
    from attnlab.data import CharTokenizer
    from attnlab.models import build_model
    from explore_models import TINY

    tok = CharTokenizer.train(["the cat sat"], unk=True)
    model = build_model(ModelConfig(kind="decoder_lm", vocab_size=tok.vocab_size, **TINY))
    got = Session(model, tok).tokens("The Cat")["target"]
    assert got["unknown"] == ["T", "C"] and got["ids"].count(tok.unk_id) == 2
    assert Session(model, tok).tokens("the cat")["target"]["unknown"] == []
