"""The explorer's web app: a Starlette ASGI app with JSON endpoints and a token stream (SSE).

    GET  /                  the page (static/index.html)
    GET  /static/...        the page's own files (StaticFiles: nothing outside static/)
    GET  /api/info          the model: kind, attention sites (layers x heads), positions, example
    POST /api/tokens        {text, source?} -> the tokens as the tokenizer cut them
    POST /api/overview      {text, source?, ablate?} -> every head as a small packed thumbnail
    POST /api/head          {text, source?, site, layer, head, ablate?} -> one head's A, packed
    POST /api/neuron        {text, source?, site, layer, head, query, key, ablate?} -> q_i, k_j, q∘k
    POST /api/attention     {text, source?, ablate?} -> A per site, layer, head (JSON lists)
    POST /api/walkthrough   {text, source?, site, layer, head, ablate?, compact?} -> the steps
    POST /api/positions     {text, source?} -> the position signal
    POST /api/next          {text, source?, temperature, top_k, top_p, ablate?} -> top 20
    GET  /api/stream?...    text, source, strategy, max_new_tokens, temperature, top_k, top_p,
                            beams, seed, ablate (JSON), pace_ms -> server-sent events
                            "token" {id, token}, then "done" {text, ids}, "stopped" or "error"

Every handler calls :class:`attnlab.explore.session.Session`; model work runs in a worker thread
that hands back plain bytes (no exception object outlives its request). A bad request answers
400 with {"error": "one readable sentence"}; the server keeps serving. Guards: POST bodies must be
``application/json`` (a form or ``text/plain`` post from another page is refused), at most
MAX_BODY bytes (counted while reading); a request carrying another site's ``Origin`` is refused
(403), and on loopback a ``Host`` naming another machine too (DNS rebinding; 400).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from attnlab.errors import UserError
from attnlab.explore import fields
from attnlab.explore.endpoints import ENDPOINTS, dispatch, stream_kwargs
from attnlab.explore.session import Session

log = logging.getLogger("attnlab.explore")
MAX_BODY = 1 << 20  # bytes of JSON a request may send
STATIC = resources.files("attnlab.explore") / "static"


def error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


async def _body(request: Request) -> dict[str, Any]:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise UserError("Send the request body as JSON (Content-Type: application/json).")
    length = request.headers.get("content-length", "")
    too_big = f"The request is larger than {MAX_BODY} bytes; send less text."
    if length.isdigit() and int(length) > MAX_BODY:
        raise UserError(too_big)
    raw, size = bytearray(), 0
    async for chunk in request.stream():  # stop reading as soon as the limit is passed
        size += len(chunk)
        if size > MAX_BODY:
            raise UserError(too_big)
        raw += chunk
    problem: str | None
    try:
        data = json.loads(raw or b"{}", parse_constant=_refuse_constant)
    except RecursionError:
        data, problem = None, "The request body is nested too deeply."
    except ValueError:
        data, problem = None, "The request body is not valid JSON."
    else:
        problem = None if isinstance(data, dict) else "The request body must be a JSON object."
    if problem:
        raise UserError(problem)
    return data


def _answer(session: Session, name: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """(status, JSON bytes) of one request, made in the worker thread."""
    try:
        result = dispatch(session, name, body)
        return 200, json.dumps(result, allow_nan=False).encode()
    except UserError as err:
        message = str(err)
    except Exception as err:  # a bug must not take the server down: log it, say so
        log.exception("explorer: %s failed", name)
        return 500, _json({"error": f"Internal error ({type(err).__name__}): {err}"})
    return 400, _json({"error": message})


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


def _foreign(request: Request) -> str | None:
    """Why a request comes from another web page (refused), or None. A browser names the page
    that makes a request in ``Origin`` (and ``Sec-Fetch-Site``); the explorer's own page has the
    server's own origin."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "Requests from other web pages are refused."
    origin = request.headers.get("origin")
    if origin is None:
        return None  # not a browser's cross-origin request (curl, scripts, same-origin GET)
    host = request.headers.get("host", "")
    if origin.split("://", 1)[-1].rstrip("/").lower() != host.lower():
        return f"Requests from {fields.shown(origin, 60)} are refused; open the explorer itself."
    return None


def _endpoint(name: str):
    """A POST handler answering ``name`` (endpoints.ENDPOINTS) from the JSON body."""

    async def handler(request: Request) -> Response:
        if (why := _foreign(request)) is not None:
            return error(why, 403)
        try:
            body = await _body(request)
        except UserError as err:
            return error(str(err))
        session: Session = request.app.state.session
        status, payload = await run_in_threadpool(_answer, session, name, body)
        return Response(payload, status_code=status, media_type="application/json")

    return handler


async def index(request: Request) -> Response:
    return FileResponse(str(STATIC / "index.html"), media_type="text/html")


async def no_icon(request: Request) -> Response:
    return Response(status_code=204)  # browsers ask for /favicon.ico; the page has none


async def info(request: Request) -> Response:
    if (why := _foreign(request)) is not None:
        return error(why, 403)
    status, payload = await run_in_threadpool(_answer, request.app.state.session, "info", {})
    return Response(payload, status_code=status, media_type="application/json")


async def stream(request: Request) -> Response:
    """Server-sent events, one per token as the model makes it (``pace_ms`` slows the display).
    When the client leaves (or Stop closes the connection) the generation stops within one
    decode step and the model is free for the next request."""
    if (why := _foreign(request)) is not None:
        return error(why, 403)
    session: Session = request.app.state.session
    try:
        typed = fields.from_query(dict(request.query_params))
        pace = fields.number("pace_ms", typed.get("pace_ms", 0.0), 0.0, 2000.0) / 1000.0
        for key in ("text", "source"):
            fields.text(key, typed.get(key))
        kwargs = stream_kwargs(typed)
    except UserError as err:
        return error(str(err))
    loop, cancel = asyncio.get_running_loop(), threading.Event()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def produce() -> None:
        def put(event):
            loop.call_soon_threadsafe(queue.put_nowait, event)

        message = None
        try:
            for event in session.continuation(**kwargs, cancel=cancel):
                put(event)
        except UserError as err:
            message = str(err)
        except Exception as err:
            log.exception("explorer: stream failed")
            message = f"Internal error ({type(err).__name__}): {err}"
        if message is not None:
            put({"type": "error", "error": message})

    async def events():
        worker = asyncio.ensure_future(run_in_threadpool(produce))
        try:
            while True:
                event = await queue.get()
                yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                if event["type"] != "token":
                    break
                if pace:
                    await asyncio.sleep(pace)
        finally:
            cancel.set()  # the next decode step raises: the worker ends and frees the lock
            await asyncio.shield(worker)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


class HostGuard:
    """Refuse requests whose Host header names a machine outside ``allowed`` (DNS rebinding);
    reads bracketed IPv6 hosts ("[::1]:8000") as the address inside the brackets."""

    def __init__(self, app, allowed: list[str]):
        self.app, self.allowed = app, {h.strip("[]").lower() for h in allowed}

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            name = host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]
            if name not in self.allowed:
                response = error("Invalid host header: open the explorer by its own address.")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(session: Session, *, allowed_hosts: list[str] | None = None) -> Starlette:
    """The ASGI app over ``session``. ``allowed_hosts`` guards against DNS rebinding."""
    routes = [
        Route("/", index),
        Route("/favicon.ico", no_icon),
        Route("/api/info", info),
        *(Route(f"/api/{name}", _endpoint(name), methods=["POST"]) for name in ENDPOINTS),
        Route("/api/stream", stream),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    middleware = [Middleware(GZipMiddleware, minimum_size=4096, compresslevel=1)]
    if allowed_hosts:
        middleware.insert(0, Middleware(HostGuard, allowed=allowed_hosts))
    app = Starlette(routes=routes, middleware=middleware)
    app.state.session = session
    return app
