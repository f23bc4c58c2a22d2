"""The explorer page in a real browser: Debian's headless Chromium driven by Playwright.

The page loads with zero console errors; the heatmap cells in the DOM equal the model's weights;
hovering a cell shows its value; switching a head off changes the next-token distribution exactly
as the API predicts; a continuation appears token by token; each bad input shows its message.
The test also takes the screenshots of docs/explorer.md: with ATTNLAB_SCREENSHOTS=1 it writes them
to docs/images/explorer/ from briefly trained models (see docs/explorer.md), otherwise it takes
them of random-weight models into a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data import LabelSet
from attnlab.explore import Session
from attnlab.explore.probes import unpack
from attnlab.explore.server import start_in_thread
from explore_models import TOK, bert_dir, tiny_model, trained_lm, trained_reverser
from hf_dirs import spread

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images" / "explorer"
# ATTNLAB_SCREENSHOTS=1 writes docs/explorer.md's images, from models trained for a few seconds
# so that the maps show learned patterns; otherwise the same views of random-weight models.
SHOOT = os.environ.get("ATTNLAB_SCREENSHOTS") == "1"
TEXT = "abc dea"
PERIODS = "piano%20piano%20pia"  # a word said again: the trained LM copies its next letter

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"Chromium not found at {CHROMIUM}: install it (Debian/Ubuntu: `apt-get install -y "
    "chromium`) or point ATTNLAB_CHROMIUM at a Chromium binary",
)


@pytest.fixture(scope="module")
def servers():
    sessions = {
        "lm": Session(trained_lm() if SHOOT else tiny_model(), TOK, name="tiny LM"),
        "s2s": Session(
            trained_reverser() if SHOOT else tiny_model("encoder_decoder", seed=1),
            TOK,
            name="tiny encoder-decoder (reverses letters)",
        ),
        "clf": Session(
            tiny_model("classifier", n_classes=3),
            TOK,
            name="tiny classifier",
            labels=LabelSet(["neg", "neu", "pos"]),
        ),
        "rnn": Session(tiny_model("rnn_lm"), TOK, name="tiny RNN LM (no attention)"),
        "lstm": Session(
            tiny_model("lstm_seq2seq", seed=2, rnn_attention="additive"),
            TOK,
            name="tiny Bahdanau LSTM",
        ),
        "long": Session(  # larger random weights: sharper attention, some structure to see
            spread(tiny_model("decoder_lm", max_len=1024), 0.4), TOK, name="tiny LM, 1,024"
        ),
        "enc": Session(tiny_model("encoder"), TOK, name="tiny encoder"),
    }
    running = {k: (start_in_thread(s), s) for k, s in sessions.items()}
    yield {k: (r.url, s) for k, (r, s) in running.items()}
    for r, _ in running.values():
        r.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": 1200, "height": 900},
        )
        yield context
        context.close()


class Console(list):
    """Console errors and uncaught exceptions of one page."""


@pytest.fixture
def page(browser):
    page = browser.new_page()
    errors = Console()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    yield page
    page.close()


def open_page(page, url, query=""):
    page.goto(url + query)
    page.wait_for_function("document.getElementById('app').dataset.ready === 'true'")
    settle(page)


def settle(page):
    page.wait_for_function("document.getElementById('app').dataset.busy === '0'")


def run(page, text, source=None):
    if source is not None:
        page.fill("#ax-source", source)
    page.fill("#ax-text", text)
    page.click("#ax-run")
    page.wait_for_timeout(50)
    settle(page)


def cells(page, selector="#ax-heatmap"):
    """The values a canvas map draws (its axMatrix accessor) as a (T, S) array."""
    got = page.eval_on_selector(
        selector, "m => ({shape: m.axMatrix.shape, values: Array.from(m.axMatrix.values)})"
    )
    return np.asarray(got["values"], dtype=np.float64).reshape(got["shape"])


def hover_cell(page, i, j, selector="#ax-heatmap"):
    """Move the mouse over cell (i, j) of a canvas map; returns the tooltip's text."""
    at = page.eval_on_selector(selector, f"m => m.axCellAt({i}, {j})")  # the cell's centre
    page.eval_on_selector(  # the cell mid-screen first: a long map is taller than the window
        f"{selector} .ax-map-overlay",
        "(o, at) => { const r = o.getBoundingClientRect();"
        " window.scrollBy(r.left + at.x - innerWidth / 2, r.top + at.y - innerHeight / 2); }",
        at,
    )
    # the pointer on the first whole pixel inside the cell: pointer positions are whole pixels,
    # and where cells are 1 px (600 keys) and the map sits at a fractional offset, the pixel
    # nearest the cell's centre can belong to the next cell
    x, y = page.eval_on_selector(
        selector,
        "(m, at) => { const r = m.querySelector('.ax-map-overlay').getBoundingClientRect();"
        " const half = +m.dataset.cell / 2, first = (v) => Math.ceil(v - half - 1e-9);"
        " return [first(r.left + at.x), first(r.top + at.y)]; }",
        at,
    )
    page.mouse.move(x, y)
    page.wait_for_selector(f"{selector}[data-hover-row='{i}'][data-hover-col='{j}']")
    return page.inner_text(".ax-tooltip")


def weights(model, layer, head):
    with torch.no_grad():
        out = model(torch.tensor([TOK.encode(TEXT)]), need_weights=True)
    return out.attentions[layer].self_attn[0, head].numpy()


def test_page_loads_with_zero_console_errors(servers, page):
    for name, query in (
        ("lm", f"?text={TEXT}"),
        ("s2s", "?text=ab&source=hello"),
        ("lstm", "?text=ab&source=hello"),
        ("clf", "?text=abc"),
    ):
        open_page(page, servers[name][0], query)
        page.wait_for_selector("#ax-heatmap canvas")
        assert page.is_hidden("#ax-error")
    classes = page.eval_on_selector_all(
        "#ax-next-table td.ax-token-cell", "t => t.map(x => x.textContent)"
    )
    assert sorted(classes) == ["neg", "neu", "pos"] and page.is_hidden("#ax-continue")
    open_page(page, servers["rnn"][0], "?text=abc")  # no attention: tokens, positions, next token
    page.wait_for_selector("#ax-next-table tr[data-id]")
    assert page.is_hidden("#ax-error") and page.query_selector("#ax-heatmap") is None
    assert page.errors == []


def test_heatmap_cells_equal_the_models_weights(servers, page):
    url, session = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    np.testing.assert_allclose(cells(page), weights(session.model, 0, 0), atol=1e-6)
    page.click("#ax-model-view button[data-layer='1'][data-head='1']")  # open layer 1, head 1
    page.wait_for_selector("#ax-model-view button.ax-selected[data-layer='1'][data-head='1']")
    settle(page)
    np.testing.assert_allclose(cells(page), weights(session.model, 1, 1), atol=1e-6)
    np.testing.assert_allclose(cells(page, "#ax-lines"), weights(session.model, 1, 1), atol=1e-6)
    assert int(page.get_attribute("#ax-lines", "data-drawn")) > 0
    assert page.errors == []


def test_hover_shows_the_value(servers, page):
    url, session = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    tip = hover_cell(page, 3, 1)
    value = float(page.get_attribute("#ax-heatmap", "data-hover-value"))
    assert str(value) in tip and "row 3" in tip and "column 1" in tip
    assert abs(value - weights(session.model, 0, 0)[3, 1]) < 1e-6


def next_table(page):
    row = "[+r.dataset.id, +r.querySelector('[data-p]').dataset.p, "
    row += "+r.querySelector('[data-p-sample]').dataset.pSample]"
    return page.eval_on_selector_all("#ax-next-table tr[data-id]", f"rs => rs.map(r => {row})")


def test_toggling_a_head_off_changes_the_distribution_as_the_api_predicts(servers, page):
    url, session = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    page.fill("#ax-top-k", "5")
    page.dispatch_event("#ax-top-k", "change")
    page.wait_for_timeout(50)
    settle(page)
    before = next_table(page)
    page.click("#ax-ablate button[data-site='decoder'][data-layer='0'][data-head='1']")
    page.wait_for_selector("#ax-next-table[data-ablate*='\"head\":1']")
    settle(page)
    after = next_table(page)
    heads = [{"site": "decoder", "layer": 0, "head": 1}]
    want = session.next_token(TEXT, top_k=5, ablate=heads)["candidates"]
    assert after == [[c["id"], c["p"], c["p_sample"]] for c in want]
    assert after != before
    assert sum(row[2] > 0 for row in after) == 5
    page.click("#ax-ablate button[data-site='decoder'][data-layer='0'][data-head='1']")
    page.wait_for_selector("#ax-next-table[data-ablate='[]']")
    settle(page)
    assert next_table(page) == before  # switched back on
    assert page.errors == []


def test_streaming_shows_tokens_one_by_one(servers, page):
    url, session = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    page.fill("#ax-max-new", "6")
    page.fill("#ax-pace", "150")
    page.click("#ax-continue")
    page.wait_for_selector("#ax-stream .ax-token")
    assert page.inner_text("#ax-stream-from") == f"continues {json.dumps(TEXT)}"
    partial = int(page.get_attribute("#ax-stream", "data-count"))
    page.wait_for_selector("#ax-stream[data-state='done']", timeout=10_000)
    spans = page.eval_on_selector_all(
        "#ax-stream .ax-token", "s => s.map(x => [+x.dataset.id, +x.dataset.t])"
    )
    from attnlab.generate import GenerationConfig, generate

    cfg = GenerationConfig(max_new_tokens=6, temperature=0)
    want = generate(session.model, TOK.encode(TEXT), cfg, tokenizer=TOK).tokens[0]
    assert [s[0] for s in spans] == want
    assert partial < len(want)  # the first token was on screen before the last one arrived
    gaps = np.diff([s[1] for s in spans])
    assert (gaps > 50).all(), gaps  # one token per event, paced
    page.fill("#ax-max-new", "40")
    page.click("#ax-continue")
    page.wait_for_selector("#ax-stream .ax-token")
    page.click("#ax-stop")  # stops the display and closes the connection
    shown = int(page.get_attribute("#ax-stream", "data-count"))
    page.wait_for_timeout(400)
    assert int(page.get_attribute("#ax-stream", "data-count")) == shown < 40
    assert page.get_attribute("#ax-stream", "data-state") == "stopped"
    assert page.errors == []


@pytest.mark.parametrize(
    ("name", "text", "source", "message"),
    [
        ("lm", "", None, "empty"),
        ("lm", "a" * 30, None, "accepts at most 24"),
        ("lm", "xyz!", None, "cannot read"),
        ("s2s", "ab", "", "source is empty"),
    ],
)
def test_each_bad_input_shows_its_message(servers, page, name, text, source, message):
    url, _ = servers[name]
    open_page(page, url)
    run(page, text, source)
    page.wait_for_selector("#ax-error:not([hidden])")
    shown = page.inner_text("#ax-error")
    assert message in shown and "\n" not in shown.strip()
    for view in ("#ax-tokens", "#ax-model-view", "#ax-head-view", "#ax-walkthrough"):
        assert page.eval_on_selector(view, "v => v.children.length") == 0  # not the old input's
    run(page, "ab", "hello" if name == "s2s" else None)  # the server keeps serving
    assert page.is_hidden("#ax-error")
    page.wait_for_selector("#ax-heatmap canvas")


def test_screenshots_of_each_view(servers, page, tmp_path):
    out = DOCS_IMAGES if SHOOT else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    shots = {
        "lm": [
            ("input", "#ax-sec-input"),
            ("model-view", "#ax-sec-model"),
            ("head-view", "#ax-sec-head"),
            ("walkthrough", "#ax-sec-walk"),
            ("positions", "#ax-sec-positions"),
            ("next-token", "#ax-sec-next"),
            ("neuron", "#ax-neuron"),
            ("heads-off", "#ax-sec-ablate"),
        ],
        "s2s": [("seq2seq-model-view", "#ax-sec-model")],
        "lstm": [("bahdanau", "#ax-sec-head")],
    }
    for name, views in shots.items():
        url, _ = servers[name]
        query = f"?text={PERIODS}&head=decoder:0:0" if name == "lm" else "?text=edc&source=abcde"
        open_page(page, url, query)
        page.wait_for_selector("#ax-heatmap canvas")
        if name == "lm":
            page.click("#ax-ablate button[data-site='decoder'][data-layer='0'][data-head='1']")
            page.wait_for_timeout(50)
            settle(page)
            page.fill("#ax-pace", "0")
            page.click("#ax-continue")
            page.wait_for_selector("#ax-stream[data-state='done']")
        for view, selector in views:
            page.locator(selector).screenshot(path=str(out / f"{view}.png"))
    open_long(page, servers["long"][0], LONG)  # 600 tokens, every key; each row's colours stretched
    page.click("#ax-heatmap .ax-stretch")
    page.wait_for_selector("#ax-heatmap[data-scale='rows']")
    page.locator("#ax-sec-head").screenshot(path=str(out / "long-input.png"))
    written = sorted(p.name for p in out.glob("*.png"))
    assert len(written) >= 11 and all((out / n).stat().st_size > 1000 for n in written)
    if out is tmp_path:
        shutil.rmtree(tmp_path, ignore_errors=True)
    assert page.errors == []


WIDGET_HOST = """
async (esm) => {
  // A stand-in for the notebook: anywidget's model object, its messages carried to the
  // server's endpoints (the widget's Python side answers with the same dispatch).
  const mod = await import(URL.createObjectURL(new Blob([esm], { type: "text/javascript" })));
  let handler = null;
  const values = { text: "abc dea", source: "", head: "decoder:1:1" };
  const model = {
    get: (k) => values[k],
    on: (_event, cb) => { handler = cb; },
    off: () => { handler = null; },
    send: async (msg) => {
      if (msg.kind === "stream") {
        const q = new URLSearchParams({ ...msg.params, ablate: JSON.stringify(msg.params.ablate) });
        const source = new EventSource(`/api/stream?${q}`);
        const relay = (e) => {
          const event = JSON.parse(e.data);
          handler({ id: msg.id, event });
          if (event.type !== "token") source.close();
        };
        source.addEventListener("token", relay);
        source.addEventListener("done", relay);
        return;
      }
      const body = JSON.stringify(msg.payload);
      const headers = { "Content-Type": "application/json" };
      const init = msg.payload === null ? {} : { method: "POST", body, headers };
      const r = await fetch(`/api/${msg.endpoint}`, init);
      const data = await r.json();
      handler(r.ok ? { id: msg.id, result: data } : { id: msg.id, error: data.error });
    },
  };
  const el = document.createElement("div");
  el.id = "widget";
  document.body.replaceChildren(el);
  mod.default.render({ model, el });
}
"""


def test_the_widget_front_end_runs_the_same_views(servers, page):
    pytest.importorskip("anywidget")
    from attnlab.explore.widget import ExplorerWidget

    url, session = servers["lm"]
    page.goto(url + "static/explorer.css")  # same origin as the endpoints, nothing else loaded
    page.evaluate(WIDGET_HOST, ExplorerWidget._esm)
    page.wait_for_function("document.getElementById('widget').dataset.ready === 'true'")
    page.wait_for_selector("#widget #ax-heatmap canvas")
    page.wait_for_function("document.getElementById('widget').dataset.busy === '0'")
    np.testing.assert_allclose(cells(page), weights(session.model, 1, 1), atol=1e-6)
    page.fill("#ax-max-new", "4")
    page.click("#ax-continue")
    page.wait_for_selector("#ax-stream[data-state='done']")
    assert page.get_attribute("#ax-stream", "data-count") == "4"
    assert page.errors == []


# ------------------------------------------------------------ issue 34: real sizes, every kind
LONG = ("abc dea fgh ijk lmn op " * 40)[:600]


def open_long(page, url, text):
    """Type a long input (too long for a URL) and run it with Enter."""
    open_page(page, url, "?text=ab")
    page.fill("#ax-text", text)
    page.press("#ax-text", "Enter")
    page.wait_for_function(
        f"document.querySelector('#ax-heatmap')?.dataset.shape === '{len(text)},{len(text)}'"
    )
    settle(page)


def test_a_long_input_draws_every_key_on_canvas_and_hover_reads_the_array(servers, page):
    url, session = servers["long"]
    open_long(page, url, LONG)
    want = unpack(session.head(LONG, site="decoder", layer=0, head=0)["weights"]).numpy()
    got = cells(page)
    assert got.shape == (600, 600)  # all 600 key columns, not the first 64
    np.testing.assert_allclose(got, want, atol=1e-7)  # exactly what the server sent (float16)
    assert page.eval_on_selector_all("#ax-head-view td", "t => t.length") == 0  # no DOM cells
    tip = hover_cell(page, 599, 450)
    value = float(page.get_attribute("#ax-heatmap", "data-hover-value"))
    assert abs(value - want[599, 450]) < 1e-6 and "row 599" in tip and "column 450" in tip
    concat = page.eval_on_selector(
        "#ax-step-concat", "m => [m.dataset.highlight, m.axMatrix.shape]"
    )
    assert concat == ["0,8", [600, 16]]  # head 0's 8 columns of 2 x 8
    page.select_option("#ax-head", "1")  # switching head redraws the head view
    page.wait_for_function("document.getElementById('ax-head-view').dataset.head === 'decoder:0:1'")
    page.wait_for_function(
        "document.getElementById('ax-walkthrough').dataset.head === 'decoder:0:1'"
    )
    settle(page)
    concat = page.eval_on_selector("#ax-step-concat", "m => m.dataset.highlight")
    assert concat == "8,16"  # the chosen head's columns, also past the first 64 of big models
    want = unpack(session.head(LONG, site="decoder", layer=0, head=1)["weights"]).numpy()
    np.testing.assert_allclose(cells(page), want, atol=1e-7)
    assert page.errors == []


def test_views_agree_on_one_screen_with_a_head_switched_off(servers, page):
    url, session = servers["lm"]
    open_page(page, url, f"?text={TEXT}&head=decoder:1:0")
    plain = cells(page)
    page.click("#ax-ablate button[data-site='decoder'][data-layer='0'][data-head='0']")
    page.wait_for_function(
        "document.getElementById('ax-walkthrough').dataset.ablate.includes('\"layer\": 0')"
        " || document.getElementById('ax-walkthrough').dataset.ablate.includes('\"layer\":0')"
    )
    settle(page)
    off = [["decoder", 0, 0]]
    want = unpack(session.head(TEXT, site="decoder", layer=1, head=0, ablate=off)["weights"])
    head_view, walk = cells(page), cells(page, "#ax-step-A")
    np.testing.assert_allclose(head_view, want.numpy(), atol=1e-6)
    np.testing.assert_allclose(walk, head_view, atol=1e-7)  # the two views show one matrix
    assert np.abs(head_view - plain).max() > 1e-7
    assert "ax-off" in page.get_attribute(
        "#ax-model-view button[data-layer='0'][data-head='0']", "class"
    )
    thumb = cells(page, "#ax-model-view button[data-layer='1'][data-head='0'] canvas")
    np.testing.assert_allclose(thumb, head_view, atol=head_view.max() / 255)  # model view too
    neuron = page.eval_on_selector("#ax-neuron", "n => [+n.dataset.query, +n.dataset.key]")
    got = session.neuron(TEXT, site="decoder", layer=1, head=0, query=neuron[0], key=neuron[1],
                         ablate=off)  # fmt: skip
    assert f"A = {got['weight']:.4f}" in page.inner_text("#ax-neuron-sum")
    assert page.errors == []


@pytest.fixture(scope="module")
def bert_servers(tmp_path_factory):
    pytest.importorskip("transformers")
    from attnlab.explore import load

    running = {}
    for kind in ("masked_lm", "classifier"):
        root, _ = bert_dir(tmp_path_factory.mktemp(f"bert-{kind}"), kind)
        loaded = load(root)
        session = Session(loaded.model, loaded.tokenizer, name=loaded.name, labels=loaded.labels)
        running[kind] = (start_in_thread(session), session)
    yield {k: (r.url, s) for k, (r, s) in running.items()}
    for r, _ in running.values():
        r.stop()


@pytest.mark.parametrize(
    "kind", ["lm", "s2s", "clf", "lstm", "enc", "rnn", "masked_lm", "classifier"]
)
def test_every_model_kind_opens_on_an_example_with_every_view(servers, bert_servers, page, kind):
    url, session = (bert_servers if kind in ("masked_lm", "classifier") else servers)[kind]
    open_page(page, url)  # no input given: the page shows its example
    assert page.input_value("#ax-text") == session.info()["example"]["text"]
    assert page.is_hidden("#ax-error"), page.inner_text("#ax-error")
    if kind == "rnn":
        assert page.query_selector("#ax-heatmap") is None and page.is_hidden("#ax-sec-ablate")
    else:
        page.wait_for_selector("#ax-heatmap canvas")
        page.wait_for_selector("#ax-model-view canvas.ax-thumb")
    if kind == "s2s":
        assert "greedy output" in page.inner_text("#ax-example-note")
        assert page.query_selector("#ax-site option[value='cross']") is not None
    if kind in ("lm", "masked_lm", "classifier", "enc", "s2s"):
        assert page.is_visible("#ax-ablate button.ax-toggle")  # the head grid
    if kind == "masked_lm":
        text = page.input_value("#ax-text")
        want = session.next_token(text)["masks"]
        got = page.eval_on_selector_all(
            ".ax-mask", "ms => ms.map(m => +m.querySelector('tr[data-id]').dataset.id)"
        )
        assert got == [m["candidates"][0]["id"] for m in want] and got
        assert page.is_hidden("#ax-continue") and page.is_hidden("#ax-temperature")
    if kind in ("clf", "classifier"):
        assert page.eval_on_selector_all("#ax-next-table tr[data-id]", "r => r.length") == 3
        assert page.is_hidden("#ax-temperature") and page.is_hidden("#ax-continue")
    if kind == "enc":
        assert page.is_hidden("#ax-sec-next") and page.is_visible("#ax-sec-ablate")
    assert page.errors == []


def test_enter_runs_and_shift_enter_adds_a_line(servers, page):
    url, _ = servers["lm"]
    open_page(page, url, "?text=ab")
    page.fill("#ax-text", "abc")
    page.press("#ax-text", "Enter")
    page.wait_for_function("document.querySelectorAll('#ax-tokens .ax-token').length === 3")
    settle(page)
    assert page.input_value("#ax-text") == "abc"  # Enter ran, it inserted nothing
    page.press("#ax-text", "Shift+Enter")
    assert page.input_value("#ax-text") == "abc\n"
    assert page.errors == []


def test_stop_ends_beam_search_and_the_busy_state(servers, page):
    url, session = servers["long"]
    open_page(page, url, f"?text={TEXT}")
    page.select_option("#ax-strategy", "beam")
    page.fill("#ax-beams", "16")
    page.fill("#ax-max-new", "500")
    page.click("#ax-continue")
    page.wait_for_selector("#ax-busy:not([hidden])")
    assert "generating" in page.inner_text("#ax-busy")
    page.click("#ax-stop")
    assert page.get_attribute("#ax-stream", "data-state") == "stopped"
    page.wait_for_selector("#ax-busy", state="hidden")
    assert session.lock.acquire(timeout=60)  # the server stopped searching, the model is free
    session.lock.release()
    page.fill("#ax-text", "abc")
    page.press("#ax-text", "Enter")  # the next request is answered
    page.wait_for_function("document.querySelectorAll('#ax-tokens .ax-token').length === 3")
    assert page.errors == []


def test_the_url_carries_the_state_and_views_export(servers, page, tmp_path):
    url, _ = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    page.click("#ax-model-view button[data-layer='1'][data-head='1']")
    page.wait_for_function("document.getElementById('ax-head-view').dataset.head === 'decoder:1:1'")
    page.click("#ax-ablate button[data-site='decoder'][data-layer='0'][data-head='1']")
    page.wait_for_timeout(50)
    settle(page)
    page.fill("#ax-temperature", "0.7")
    page.dispatch_event("#ax-temperature", "change")
    page.wait_for_timeout(50)
    settle(page)
    link = page.url
    assert "head=decoder%3A1%3A1" in link and "ablate=decoder%3A0%3A1" in link
    assert "temperature=0.7" in link and "top_k" not in link  # only what differs from defaults
    shown, sampled = cells(page), next_table(page)
    other = page.context.new_page()
    try:
        open_page(other, link)  # the link reproduces the view
        assert other.get_attribute("#ax-head-view", "data-head") == "decoder:1:1"
        assert (
            other.get_attribute("#ax-ablate button[data-layer='0'][data-head='1']", "aria-pressed")
            == "true"
        )
        np.testing.assert_allclose(cells(other), shown, atol=0)
        assert other.input_value("#ax-temperature") == "0.7" and next_table(other) == sampled
    finally:
        other.close()
    with page.expect_download() as got:
        page.click("#ax-heatmap .ax-export-json")
    data = json.loads(Path(got.value.path()).read_text())
    np.testing.assert_allclose(np.asarray(data["values"]), shown, atol=1e-7)
    with page.expect_download() as got:
        page.click("#ax-heatmap .ax-export-png")
    assert Path(got.value.path()).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with page.expect_download() as got:
        page.click("#ax-heatmap .ax-export-svg")
    svg = Path(got.value.path()).read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == shown.size
    assert page.errors == []


def test_a_link_naming_heads_this_model_lacks_opens_with_them_dropped_and_named(servers, page):
    """ablate/head entries of another model (or mistyped) are left out with a note, so the page
    still works, and the address is rewritten without them."""
    url, _ = servers["lm"]
    open_page(page, url, f"?text={TEXT}&ablate=decoder:9:9,decoder:0,decoder:0:1&head=cross:0:0")
    note = page.inner_text("#ax-link-note")
    assert (
        "ablate=decoder:9:9" in note and "ablate=decoder:0:NaN" in note and "head=cross:0:0" in note
    )
    assert "decoder layers 0-1 × heads 0-1" in note
    assert (
        page.get_attribute("#ax-ablate button[data-layer='0'][data-head='1']", "aria-pressed")
        == "true"
    )
    assert "decoder%3A9%3A9" not in page.url and "ablate=decoder%3A0%3A1" in page.url
    run(page, TEXT)  # every view still answers
    assert page.is_hidden("#ax-error") and page.errors == []


def test_each_thumbnail_writes_its_own_maximum(servers, page):
    url, _ = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    shown = page.eval_on_selector_all(
        "#ax-model-view button.ax-cell",
        "bs => bs.map(b => [b.querySelector('.ax-thumb-max').textContent, "
        "Math.max(...b.querySelector('canvas').axMatrix.values)])",
    )
    assert shown
    for text, largest in shown:
        assert text.startswith("max ") and abs(float(text[4:]) - largest) <= 0.05 * largest


@pytest.mark.parametrize(
    ("box", "value", "message"),
    [
        ("#ax-seed", "1e30", "seed must be a whole number below 2^53"),
        ("#ax-max-new", "", "new tokens: give a number"),
        ("#ax-temperature", "", "temperature: give a number"),
        ("#ax-seed", "-1", "seed"),  # read by the page, refused by the server: its message shown
    ],
)
def test_a_bad_continuation_box_is_named_not_a_lost_connection(servers, page, box, value, message):
    url, _ = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    page.select_option("#ax-strategy", "sample")
    page.fill(box, value)
    page.click("#ax-continue")
    page.wait_for_selector("#ax-error:not([hidden])")
    shown = page.inner_text("#ax-error")
    assert message in shown and "connection" not in shown
    assert page.get_attribute("#ax-stream", "data-state") == "error"


def test_the_example_note_goes_once_the_input_is_edited(servers, page):
    url, _ = servers["s2s"]
    open_page(page, url)
    assert page.is_visible("#ax-example-note")
    page.fill("#ax-source", "hello")
    assert page.is_hidden("#ax-example-note")


def test_a_phone_wide_window_does_not_scroll_sideways(servers, page):
    """375 px: maps scroll inside their own boxes; the page itself is never wider than the
    window (a sideways-scrolling page hides half of every view)."""
    page.set_viewport_size({"width": 375, "height": 800})
    for name, query in (("s2s", "?text=ab&source=hello&head=cross:0:0"), ("lm", f"?text={TEXT}")):
        open_page(page, servers[name][0], query)
        wide = page.evaluate(
            "() => [...document.querySelectorAll('#app *')]"
            ".filter(e => e.getBoundingClientRect().right > innerWidth + 1)"
            ".map(e => e.id || e.className || e.tagName).slice(0, 12)"
        )
        assert page.evaluate("document.documentElement.scrollWidth") <= 375, (name, wide)


def test_the_keyboard_keeps_its_place_when_a_view_is_rebuilt(servers, page):
    """Enter on a head's on/off button, and arrow keys in the layer box, rebuild those controls;
    the focus stays on the same control instead of falling to <body>."""
    url, _ = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    button = "#ax-ablate button[data-site='decoder'][data-layer='0'][data-head='1']"
    page.focus(button)
    page.keyboard.press("Enter")
    page.wait_for_selector(f"{button}[aria-pressed='true']")
    settle(page)
    focused = "() => [document.activeElement.id, document.activeElement.dataset.layer,"
    focused += " document.activeElement.dataset.head]"
    assert page.evaluate(focused) == ["", "0", "1"]
    page.focus("#ax-layer")
    page.keyboard.press("ArrowDown")
    page.wait_for_function("document.getElementById('ax-head-view').dataset.head === 'decoder:1:0'")
    settle(page)
    assert page.evaluate("document.activeElement.id") == "ax-layer"
    page.keyboard.press("ArrowUp")
    page.wait_for_function("document.getElementById('ax-head-view').dataset.head === 'decoder:0:0'")
    assert page.errors == []


def test_the_mask_step_reads_as_a_mask(servers, page):
    """The 0/1 mask has no row stretch and its legend says what 1 and 0 mean; A keeps both."""
    url, _ = servers["lm"]
    open_page(page, url, f"?text={TEXT}")
    assert page.query_selector("#ax-step-mask .ax-stretch") is None
    assert "1 = may attend, 0 = may not" in page.inner_text("#ax-step-mask .ax-legend")
    assert page.query_selector("#ax-step-A .ax-stretch") is not None
