"""The explorer's requests, shared by the web app (app.py) and the notebook widget (widget.py).

Each endpoint names the :class:`~attnlab.explore.session.Session` method that answers it and the
request fields passed on to it; both front ends send the same JSON and get the same answers.
"""

from __future__ import annotations

from typing import Any

from attnlab.explore.session import ExploreError, Session

# endpoint -> (Session method, request fields it reads)
ENDPOINTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "info": ("info", ()),
    "tokens": ("tokens", ("text", "source")),
    "overview": ("overview", ("text", "source", "ablate")),
    "head": ("head", ("text", "source", "site", "layer", "head", "ablate")),
    "neuron": (
        "neuron",
        ("text", "source", "site", "layer", "head", "query", "key", "ablate"),
    ),
    "attention": ("attention", ("text", "source", "ablate")),
    "walkthrough": (
        "walkthrough",
        ("text", "source", "site", "layer", "head", "ablate", "compact"),
    ),
    "positions": ("positions", ("text", "source")),
    "next": ("next_token", ("text", "source", "temperature", "top_k", "top_p", "ablate")),
}
# the streamed continuation (Session.continuation) reads these
STREAM_FIELDS = (
    "text",
    "source",
    "strategy",
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "beams",
    "seed",
    "ablate",
)


def dispatch(session: Session, endpoint: object, payload: Any) -> dict[str, Any]:
    """Answer one request: ``session.<method>(**fields of payload)``. ``endpoint`` is what the
    front end sent (a widget message may hold any JSON value there)."""
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:
        raise ExploreError(f"Unknown request {endpoint!r}; known: {', '.join(ENDPOINTS)}.")
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise ExploreError("The request body must be a JSON object.")
    method, fields = ENDPOINTS[endpoint]
    unknown = [k for k in payload if k not in fields]
    if unknown:
        known = ", ".join(fields) or "none"
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise ExploreError(f"Unknown field(s) {shown} for {endpoint}; it reads: {known}.")
    return getattr(session, method)(**payload)


def stream_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """The continuation's keyword arguments from a stream request (``pace_ms`` is the front
    end's; other unknown fields are refused)."""
    if not isinstance(params, dict):
        raise ExploreError("The continuation's parameters must be a JSON object.")
    unknown = [k for k in params if k not in STREAM_FIELDS and k != "pace_ms"]
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise ExploreError(f"Unknown field(s) {shown} for the continuation.")
    return {k: params[k] for k in STREAM_FIELDS if k in params}
