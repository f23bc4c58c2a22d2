"""docs/attention_walkthrough.ipynb runs cleanly (nbclient), and the widget answers like the page.

The notebook trains a small model, opens the explorer widget on it and checks each step of the
attention equation against the widget's numbers, so executing it is itself a test.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from attnlab.errors import UserError
from attnlab.explore import Session
from attnlab.explore.endpoints import dispatch
from explore_models import TOK, tiny_model

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "attention_walkthrough.ipynb"


def test_the_walkthrough_notebook_executes_cleanly(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    paths = [str(NOTEBOOK.parents[1] / "src"), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))  # the kernel's attnlab
    where = {"metadata": {"path": str(NOTEBOOK.parent)}}
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources=where)
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    widget_outputs = [o for o in outputs if WIDGET_VIEW in o.get("data", {})]
    assert widget_outputs, "the notebook displays the explorer widget"


def test_the_widget_answers_exactly_as_the_page():
    pytest.importorskip("anywidget")
    from attnlab.explore.widget import ExplorerWidget, explore

    session = Session(tiny_model("decoder_lm"), TOK)
    w = explore(session, None, "abc", head="decoder:1:0")
    assert isinstance(w, ExplorerWidget) and (w.text, w.head) == ("abc", "decoder:1:0")
    assert "export function mountExplorer" in w._esm and "export default" in w._esm
    requests = [
        ("info", None),
        ("attention", {"text": "abc", "ablate": []}),
        ("next", {"text": "abc", "ablate": [["decoder", 0, 1]]}),
    ]
    for endpoint, payload in requests:
        assert w.call(endpoint, payload) == dispatch(session, endpoint, payload)
    sent = []
    w.send = sent.append  # the comm's outgoing messages
    w._on_message(w, {"kind": "call", "id": 7, "endpoint": "tokens", "payload": {"text": ""}}, [])
    assert sent == [{"id": 7, "error": "The input is empty: type some text to see its attention."}]
    w._on_message(
        w, {"kind": "stream", "id": 8, "params": {"text": "abc", "max_new_tokens": 3}}, []
    )
    wait_for(lambda: sent[-1].get("event", {}).get("type") == "done")
    assert [m["event"]["type"] for m in sent[1:]] == ["token", "token", "token", "done"]
    assert all(m["id"] == 8 for m in sent[1:])
    for endpoint in (None, ["tokens"]):  # any JSON value can arrive: one sentence, not a crash
        sent.clear()
        w._on_message(w, {"kind": "call", "id": 9, "endpoint": endpoint}, [])
        with pytest.raises(UserError) as caught:
            dispatch(session, endpoint, None)
        assert sent == [{"id": 9, "error": str(caught.value)}]
        assert str(caught.value).startswith(f"Unknown request {endpoint!r}; known: info, tokens")


def wait_for(condition, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the widget did not answer"
        time.sleep(0.01)


def test_widget_stop_stops_the_kernel_side_work_beam_search_included():
    pytest.importorskip("anywidget")
    from attnlab.explore.widget import ExplorerWidget

    session = Session(tiny_model("decoder_lm"), TOK)
    w = ExplorerWidget(session)
    sent, steps = [], []
    w.send = sent.append
    # count decode steps: every step runs the token embedding once
    hook = session.model.embed.tok_emb.register_forward_pre_hook(lambda m, a: steps.append(1))
    started = threading.Event()
    gate = threading.Event()

    def slow(_m, _a):  # the first decode step waits until Stop was sent
        started.set()
        gate.wait(30)

    slow_hook = session.model.embed.tok_emb.register_forward_pre_hook(slow)
    params = {"text": "abc", "strategy": "beam", "beams": 4, "max_new_tokens": 20}
    w._on_message(w, {"kind": "stream", "id": 1, "params": params}, [])
    assert started.wait(30)
    w._on_message(w, {"kind": "stop", "id": 1}, [])
    gate.set()
    wait_for(lambda: sent and sent[-1]["event"]["type"] in ("stopped", "done"))
    hook.remove(), slow_hook.remove()
    assert sent[-1]["event"]["type"] == "stopped" and len(sent) == 1
    assert len(steps) <= 2  # not the 20 steps of the whole search
    assert not w._streams  # forgotten once stopped
    assert session.lock.acquire(timeout=5)  # the model is free again
    session.lock.release()


def test_widget_paces_tokens_and_always_ends_with_a_message(monkeypatch):
    pytest.importorskip("anywidget")
    from attnlab.explore import widget as widget_module

    session = Session(tiny_model("decoder_lm"), TOK)
    w = widget_module.ExplorerWidget(session)
    naps = []
    monkeypatch.setattr(widget_module.time, "sleep", naps.append)
    events = list(w.stream({"text": "abc", "max_new_tokens": 3, "pace_ms": 40}))
    assert [e["type"] for e in events] == ["token"] * 3 + ["done"] and naps == [0.04] * 3
    bad = list(w.stream({"text": "abc", "pace_ms": "fast"}))
    assert bad == [{"type": "error", "error": "pace_ms must be a number, got 'fast'."}]
    not_an_object = list(w.stream(["abc"]))  # type: ignore[arg-type]  # what a page might send
    message = "The continuation's parameters must be a JSON object."
    assert not_an_object == [{"type": "error", "error": message}]

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(session, "next_token", broken)
    sent = []
    w.send = sent.append
    w._on_message(w, {"kind": "call", "id": 3, "endpoint": "next", "payload": {"text": "a"}}, [])
    assert sent == [{"id": 3, "error": "Internal error (RuntimeError): boom"}]
