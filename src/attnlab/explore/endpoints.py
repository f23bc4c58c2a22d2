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
    "attention": ("attention", ("text", "source", "ablate")),
    "walkthrough": ("walkthrough", ("text", "source", "site", "layer", "head")),
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


def dispatch(session: Session, endpoint: str, payload: Any) -> dict[str, Any]:
    """Answer one request: ``session.<method>(**fields of payload)``."""
    if endpoint not in ENDPOINTS:
        raise ExploreError(f"Unknown request {endpoint!r}; known: {', '.join(ENDPOINTS)}.")
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise ExploreError("The request body must be a JSON object.")
    method, fields = ENDPOINTS[endpoint]
    return getattr(session, method)(**{k: payload[k] for k in fields if k in payload})


def stream_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """The continuation's keyword arguments from a stream request."""
    return {k: params[k] for k in STREAM_FIELDS if k in params}
