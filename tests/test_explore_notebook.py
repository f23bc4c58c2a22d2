"""docs/attention_walkthrough.ipynb runs cleanly (nbclient), and the widget answers like the page.

The notebook trains a small model, opens the explorer widget on it and checks each step of the
attention equation against the widget's numbers, so executing it is itself a test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attnlab.explore import Session
from attnlab.explore.endpoints import dispatch
from explore_models import TOK, tiny_model

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "attention_walkthrough.ipynb"


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
    assert [m["event"]["type"] for m in sent[1:]] == ["token", "token", "token", "done"]
    assert all(m["id"] == 8 for m in sent[1:])
