"""The explorer page in a real browser: Debian's headless Chromium driven by Playwright.

The page loads with zero console errors; the heatmap cells in the DOM equal the model's weights;
hovering a cell shows its value; switching a head off changes the next-token distribution exactly
as the API predicts; a continuation appears token by token; each bad input shows its message.
The test also takes the screenshots of docs/explorer.md: with ATTNLAB_SCREENSHOTS=1 it writes them
to docs/images/explorer/ from briefly trained models (see docs/explorer.md), otherwise it takes
them of random-weight models into a temporary folder.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data import LabelSet
from attnlab.explore import Session
from attnlab.explore.server import start_in_thread
from explore_models import TOK, tiny_model, trained_lm, trained_reverser

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
DOCS_IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images" / "explorer"
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
    at = page.eval_on_selector(selector, f"m => m.axCellAt({i}, {j})")
    page.hover(f"{selector} .ax-map-overlay", position=at)
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
    ("name", "query", "text", "source", "message"),
    [
        ("lm", "", "", None, "empty"),
        ("lm", "", "a" * 30, None, "accepts at most 24"),
        ("lm", "", "xyz!", None, "cannot read"),
        ("s2s", "", "ab", "", "source is empty"),
        ("lm", "?head=decoder:5:0", TEXT, None, "Unknown head"),
        ("lm", "?head=cross:0:0", TEXT, None, "Unknown attention site"),
    ],
)
def test_each_bad_input_shows_its_message(servers, page, name, query, text, source, message):
    url, _ = servers[name]
    open_page(page, url, query)
    run(page, text, source)
    page.wait_for_selector("#ax-error:not([hidden])")
    shown = page.inner_text("#ax-error")
    assert message in shown and "\n" not in shown.strip()
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
    written = sorted(p.name for p in out.glob("*.png"))
    assert len(written) >= 8 and all((out / n).stat().st_size > 1000 for n in written)
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
