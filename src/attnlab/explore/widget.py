"""The explorer inline in Jupyter: an ``anywidget`` running the page's own JavaScript.

    from attnlab.explore.widget import explore
    explore(model, tokenizer, "the cat sat")            # a widget with every view of the page

The widget's front end is ``static/explorer.js`` (the page's module) plus a small entry point that
carries requests over the widget's comm instead of HTTP; the Python side answers them with the same
:func:`attnlab.explore.endpoints.dispatch` as the web app, so page and widget show the same numbers.
Needs ``anywidget`` (``pip install 'attnlab[notebook]'``).
"""

from __future__ import annotations

import os
from importlib import resources
from typing import Any

from attnlab.errors import UserError
from attnlab.explore.endpoints import dispatch, stream_kwargs
from attnlab.explore.loading import load
from attnlab.explore.session import Session

try:
    import anywidget
    import traitlets
except ModuleNotFoundError as err:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "the explorer widget needs anywidget: pip install 'attnlab[notebook]'", name=err.name
    ) from None

STATIC = resources.files("attnlab.explore") / "static"

# The anywidget entry point: requests and stream events travel as comm messages {id, ...}.
_ENTRY = """
export default {
  render({ model, el }) {
    let next = 0;
    const pending = new Map();
    const streams = new Map();
    const onMessage = (msg) => {
      if (pending.has(msg.id)) {
        const { resolve, reject } = pending.get(msg.id);
        pending.delete(msg.id);
        if (msg.error) reject(new Error(msg.error));
        else resolve(msg.result);
      } else if (streams.has(msg.id)) {
        streams.get(msg.id)(msg.event);
        if (msg.event.type !== "token") streams.delete(msg.id);
      }
    };
    model.on("msg:custom", onMessage);
    const transport = {
      call(endpoint, payload) {
        return new Promise((resolve, reject) => {
          const id = ++next;
          pending.set(id, { resolve, reject });
          const body = payload === undefined ? null : payload;
          model.send({ kind: "call", id, endpoint, payload: body });
        });
      },
      stream(params, onEvent) {
        const id = ++next;
        streams.set(id, onEvent);
        model.send({ kind: "stream", id, params });
        return () => streams.delete(id);
      },
    };
    mountExplorer(el, transport, {
      text: model.get("text"), source: model.get("source"), head: model.get("head"),
    });
    return () => model.off("msg:custom", onMessage);
  },
};
"""


class ExplorerWidget(anywidget.AnyWidget):
    """Every view of the explorer page, inline; ``text``/``source``/``head`` are the first input."""

    _esm = (STATIC / "explorer.js").read_text(encoding="utf-8") + _ENTRY
    _css = (STATIC / "explorer.css").read_text(encoding="utf-8")
    text = traitlets.Unicode("").tag(sync=True)
    source = traitlets.Unicode("").tag(sync=True)
    head = traitlets.Unicode("").tag(sync=True)  # "site:layer:head" to open first

    def __init__(self, session: Session, **kwargs: Any):
        super().__init__(**kwargs)
        self.session = session
        self.on_msg(self._on_message)

    def call(self, endpoint: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer a request exactly as the front end's messages are answered."""
        return dispatch(self.session, endpoint, payload)

    def _on_message(self, _widget: Any, content: dict[str, Any], _buffers: Any) -> None:
        request_id = content.get("id")
        if content.get("kind") == "stream":
            for event in self.stream(content.get("params") or {}):
                self.send({"id": request_id, "event": event})
            return
        try:
            self.send(
                {"id": request_id, "result": self.call(content["endpoint"], content.get("payload"))}
            )
        except UserError as err:
            self.send({"id": request_id, "error": str(err)})

    def stream(self, params: dict[str, Any]):
        """The continuation's events ({"type": "token"|"done"|"error", ...}), as the page gets."""
        try:
            yield from self.session.continuation(**stream_kwargs(params))
        except UserError as err:
            yield {"type": "error", "error": str(err)}


def explore(
    model: Any, tokenizer: Any = None, text: str = "", source: str = "", head: str = ""
) -> ExplorerWidget:
    """The explorer widget over ``model`` (any attnlab model) and its tokenizer, showing ``text``
    (and ``source`` for a sequence-to-sequence model); ``head`` = "site:layer:head" opens it.

    ``model`` may also be a path (a run directory, checkpoint or local GPT-2 directory, as for
    ``attnlab explore``), whose own tokenizer is then used, or a ready Session.
    """
    if isinstance(model, (str, os.PathLike)):
        loaded = load(model)
        model = Session(loaded.model, loaded.tokenizer, name=loaded.name, labels=loaded.labels)
    session = model if isinstance(model, Session) else Session(model, tokenizer)
    return ExplorerWidget(session, text=text, source=source, head=head)
