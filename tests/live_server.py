"""Serve an ASGI application with uvicorn on 127.0.0.1 (a free port): in a background thread
(`live_server`: the application runs in the server thread's own event loop), or on the test's own
event loop (`served_here`: for an application sharing the test's store, pools and tasks).

Tests talk to it over real HTTP.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import uvicorn
from starlette.types import ASGIApp


def reserve_socket() -> socket.socket:
    """A socket bound to a free port on 127.0.0.1, for an app that must know its URL before it is built."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def base_url(sock: socket.socket) -> str:
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextmanager
def live_server(app: ASGIApp, *, sock: socket.socket | None = None) -> Iterator[str]:
    """Yield the base URL of `app` served by uvicorn until the block exits (on `sock` when given)."""
    sock = sock if sock is not None else reserve_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("The test server did not start.")
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@asynccontextmanager
async def served_here(app: ASGIApp) -> AsyncIterator[str]:
    """Yield the base URL of `app` served by uvicorn on this event loop until the block exits
    (no lifespan: the test opens and closes what the application uses)."""
    sock = reserve_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # the server failed to start: its error
                raise RuntimeError("The test server did not start.")
            await asyncio.sleep(0.01)
        yield base_url(sock)
    finally:
        server.should_exit = True
        await task
        sock.close()
