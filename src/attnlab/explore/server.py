"""Serving the explorer with uvicorn: in the foreground (the CLI) or in a background thread.

The server listens on 127.0.0.1 unless another host is asked for; on a loopback address it also
rejects requests whose Host header names another machine (a guard against DNS rebinding).
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

import uvicorn

from attnlab.errors import UserError
from attnlab.explore.app import create_app
from attnlab.explore.session import Session

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _allowed_hosts(host: str) -> list[str] | None:
    if host in ("0.0.0.0", "::", ""):
        return None  # the user chose to serve every interface
    return sorted({host, *LOOPBACK})


def check_port(host: str, port: int) -> None:
    """Raise a UserError naming the fix when ``host:port`` cannot be listened on (in use, or an
    address this machine does not have); uvicorn would only log and exit."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        raise UserError(
            f"cannot listen on {host!r}: not an address of this machine; use 127.0.0.1 (the "
            "default), ::1 or 0.0.0.0"
        ) from None
    family, kind, proto, _, address = infos[0]
    problem = None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            problem = err.errno
    if problem == errno.EADDRINUSE:
        raise UserError(
            f"port {port} on {host} is already in use (another program, or an explorer still "
            f"running); choose another port, e.g. port={port + 1 if port < 65535 else 8001}",
            fields=("port",),
        )
    if problem is not None:
        raise UserError(
            f"cannot listen on {host} port {port} ({errno.errorcode.get(problem, problem)}); "
            "choose another host or port (ports below 1024 need administrator rights)",
            fields=("host", "port"),
        )


def _server(session: Session, host: str, port: int) -> uvicorn.Server:
    check_port(host, port)
    app = create_app(session, allowed_hosts=_allowed_hosts(host))
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    return uvicorn.Server(config)


def url_of(server: uvicorn.Server) -> str:
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/"


def serve(
    session: Session,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until interrupted; ``on_ready(url)`` is called once the socket is listening."""
    server = _server(session, host, port)
    if on_ready is not None:
        watcher = threading.Thread(target=_when_started, args=(server, on_ready), daemon=True)
        watcher.start()
    server.run()


def _when_started(server: uvicorn.Server, on_ready: Callable[[str], None]) -> None:
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.02)
    on_ready(url_of(server))


class Running(NamedTuple):
    url: str
    stop: Callable[[], None]


def start_in_thread(session: Session, host: str = "127.0.0.1", port: int = 0) -> Running:
    """Serve in a daemon thread (tests, notebooks, benchmarks); ``port=0`` picks a free port."""
    server = _server(session, host, port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the explorer server did not start on {host}:{port}")
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=10)

    return Running(url_of(server), stop)
