"""The explorer's web app: a Starlette ASGI app with JSON endpoints and a token stream (SSE).

    GET  /                  the page (static/index.html)
    GET  /static/...        the page's own files (StaticFiles: nothing outside static/)
    GET  /api/info          the model: kind, attention sites (layers x heads), positions
    POST /api/tokens        {text, source?} -> the tokens as the tokenizer cut them
    POST /api/attention     {text, source?, ablate?} -> A per site, layer, head
    POST /api/walkthrough   {text, source?, site, layer, head} -> the head's steps
    POST /api/positions     {text, source?} -> the position signal
    POST /api/next          {text, source?, temperature, top_k, top_p, ablate?} -> top 20
    GET  /api/stream?...    text, source, strategy, max_new_tokens, temperature, top_k, top_p,
                            beams, seed, ablate (JSON), pace_ms -> server-sent events
                            "token" {id, token}, then "done" {text, ids} or "error" {error}

Every handler calls :class:`attnlab.explore.session.Session`; model work runs in a worker thread.
A bad request answers 400 with {"error": "one readable sentence"}; the server keeps serving.
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
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from attnlab.errors import UserError
from attnlab.explore.endpoints import ENDPOINTS, dispatch, stream_kwargs
from attnlab.explore.session import Session

log = logging.getLogger("attnlab.explore")
MAX_BODY = 1 << 20  # bytes of JSON a request may send
STATIC = resources.files("attnlab.explore") / "static"


def error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise UserError(f"The request is larger than {MAX_BODY} bytes; send less text.")
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        raise UserError("The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise UserError("The request body must be a JSON object.")
    return data


def _endpoint(name: str):
    """A POST handler answering ``name`` (endpoints.ENDPOINTS) from the JSON body."""

    async def handler(request: Request) -> Response:
        session: Session = request.app.state.session
        try:
            body = await _body(request)
            result = await run_in_threadpool(dispatch, session, name, body)
        except UserError as err:
            return error(str(err))
        except Exception as err:  # a bug must not take the server down: log it, say so
            log.exception("explorer: %s failed", name)
            return error(f"Internal error ({type(err).__name__}): {err}", 500)
        return JSONResponse(result)

    return handler


async def index(request: Request) -> Response:
    return FileResponse(str(STATIC / "index.html"), media_type="text/html")


async def no_icon(request: Request) -> Response:
    return Response(status_code=204)  # browsers ask for /favicon.ico; the page has none


async def info(request: Request) -> Response:
    return JSONResponse(request.app.state.session.info())


async def stream(request: Request) -> Response:
    """Server-sent events, one per token as the model makes it (``pace_ms`` slows the display)."""
    session: Session = request.app.state.session
    q = request.query_params
    kwargs = stream_kwargs(dict(q))
    try:
        pace = min(max(float(q.get("pace_ms", 0)), 0.0), 2000.0) / 1000.0
        kwargs["ablate"] = json.loads(q["ablate"]) if q.get("ablate") else None
    except ValueError:
        return error("pace_ms must be a number and ablate a JSON list of heads")
    loop, queue, cancel = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

    def produce() -> None:
        try:
            for event in session.continuation(**kwargs, cancel=cancel):
                loop.call_soon_threadsafe(queue.put_nowait, event)
        except UserError as err:
            loop.call_soon_threadsafe(queue.put_nowait, {"type": "error", "error": str(err)})
        except Exception as err:
            log.exception("explorer: stream failed")
            event = {"type": "error", "error": f"Internal error ({type(err).__name__}): {err}"}
            loop.call_soon_threadsafe(queue.put_nowait, event)

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
            cancel.set()
            await worker

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


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
    middleware = []
    if allowed_hosts:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
    app = Starlette(routes=routes, middleware=middleware)
    app.state.session = session
    return app
