"""The explorer inline in Jupyter: an ``anywidget`` running the page's own JavaScript.

    from attnlab.explore.widget import explore
    explore(model, tokenizer, "the cat sat")            # a widget with every view of the page

The widget's front end is ``static/explorer.js`` (the page's module) plus a small entry point that
carries requests over the widget's comm instead of HTTP; the Python side answers them with the same
:func:`attnlab.explore.endpoints.dispatch` as the web app, so page and widget show the same numbers.
Needs ``anywidget`` (``pip install 'attnlab[notebook]'``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from importlib import resources
from typing import Any

from attnlab.errors import UserError
from attnlab.explore import fields
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
log = logging.getLogger("attnlab.explore")

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
        return () => {  // Stop: the kernel stops generating within one decode step
          if (streams.delete(id)) model.send({ kind: "stop", id });
        };
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
        self._streams: dict[Any, threading.Event] = {}  # running continuations: their Stop
        self.on_msg(self._on_message)

    def call(self, endpoint: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer a request exactly as the front end's messages are answered."""
        return dispatch(self.session, endpoint, payload)

    def _on_message(self, _widget: Any, content: dict[str, Any], _buffers: Any) -> None:
        request_id = content.get("id")
        kind = content.get("kind")
        if kind == "stop":
            cancel = self._streams.get(request_id)
            if cancel is not None:
                cancel.set()
            return
        if kind == "stream":  # in a thread, so that Stop (a later message) is heard
            cancel = self._streams.setdefault(request_id, threading.Event())
            params = content.get("params") or {}
            worker = threading.Thread(
                target=self._relay, args=(request_id, params, cancel), daemon=True
            )
            worker.start()
            return
        try:
            result = dispatch(self.session, content.get("endpoint"), content.get("payload"))
            message = {"id": request_id, "result": result}
        except UserError as err:
            message = {"id": request_id, "error": str(err)}
        except Exception as err:  # the view must leave its busy state with a message
            log.exception("explorer widget: %s failed", content.get("endpoint"))
            message = {"id": request_id, "error": f"Internal error ({type(err).__name__}): {err}"}
        self.send(message)

    def _relay(self, request_id: Any, params: dict[str, Any], cancel: threading.Event) -> None:
        try:
            for event in self.stream(params, cancel):
                self.send({"id": request_id, "event": event})
        finally:
            self._streams.pop(request_id, None)

    def stream(self, params: dict[str, Any], cancel: threading.Event | None = None):
        """The continuation's events ({"type": "token"|"done"|"stopped"|"error", ...}), as the
        page gets them, ``pace_ms`` apart; ``cancel`` stops the generation."""
        cancel = cancel or threading.Event()
        try:
            kwargs = stream_kwargs(params)  # checks params first: one clear message
            pace = fields.number("pace_ms", params.get("pace_ms", 0), 0.0, 2000.0) / 1000.0
            for event in self.session.continuation(**kwargs, cancel=cancel):
                yield event
                if event["type"] == "token" and pace:
                    time.sleep(pace)
        except UserError as err:
            yield {"type": "error", "error": str(err)}
        except Exception as err:
            log.exception("explorer widget: the continuation failed")
            yield {"type": "error", "error": f"Internal error ({type(err).__name__}): {err}"}


def explore(
    model: Any, tokenizer: Any = None, text: str = "", source: str = "", head: str = ""
) -> ExplorerWidget:
    """The explorer widget over ``model`` (any attnlab model) and its tokenizer, showing ``text``
    (and ``source`` for a sequence-to-sequence model); ``head`` = "site:layer:head" opens it.

    ``model`` may also be a path (a run directory, checkpoint or local Hugging Face directory, as
    for ``attnlab explore``), whose own tokenizer is then used, or a ready Session.
    """
    if isinstance(model, (str, os.PathLike)):
        loaded = load(model)
        model = Session.from_loaded(loaded)
    session = model if isinstance(model, Session) else Session(model, tokenizer)
    return ExplorerWidget(session, text=text, source=source, head=head)
