"""A lean HTTP/1.1 client for the load: one keep-alive connection per simulated user.

The load client shares the machine with the server it measures, so it does as little as it can: it
writes the request, reads the whole (chunked or sized) body as bytes, and leaves parsing to the
verifier, which runs after the latency clock has stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

_MAX_HEADER_LINES = 100
_TEXT_DELTA = b'"text-delta"'


class HttpProtocolError(Exception):
    """The server's response could not be read as HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One request: the path on the system's server, extra headers and a JSON body."""

    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """The status, lower-cased headers and the full body of a response; `first_delta_at` is when the
    piece of the body holding its first text delta arrived (`time.perf_counter()`), if it had one."""

    status: int
    headers: dict[str, str]
    body: bytes
    first_delta_at: float | None = None


class HttpConnection:
    """A keep-alive connection to 127.0.0.1:`port`; requests on it run one after another."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, request: HttpRequest) -> HttpResponse:
        if self._writer is None or self._reader is None or self._reader.at_eof():
            await self.close()
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self._port)
        head = [f"{request.method} {request.path} HTTP/1.1", f"host: 127.0.0.1:{self._port}"]
        head += [f"{name}: {value}" for name, value in request.headers.items()]
        head += ["content-type: application/json", f"content-length: {len(request.body)}", "", ""]
        self._writer.write("\r\n".join(head).encode("latin-1") + request.body)
        await self._writer.drain()
        try:
            return await _read_response(self._reader)
        except (asyncio.IncompleteReadError, ValueError) as exc:
            await self.close()
            raise HttpProtocolError(f"unreadable response: {exc}") from exc

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> HttpResponse:
    status_line = (await reader.readuntil(b"\r\n")).decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise HttpProtocolError(f"not an HTTP/1.1 status line: {status_line!r}")
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADER_LINES):
        line = (await reader.readuntil(b"\r\n")).decode("latin-1")
        if line == "\r\n":
            break
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    else:
        raise HttpProtocolError("too many header lines")
    first_delta_at = None
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body, first_delta_at = await _read_chunked(reader)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = await reader.read()
    return HttpResponse(status=int(parts[1]), headers=headers, body=body, first_delta_at=first_delta_at)


async def _read_chunked(reader: asyncio.StreamReader) -> tuple[bytes, float | None]:
    """The body, and when the HTTP chunk holding the first text delta arrived (a byte search per HTTP
    chunk until then; the events themselves are parsed by the verifier, after the clock stops)."""
    chunks: list[bytes] = []
    first_delta_at = None
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return b"".join(chunks), first_delta_at
        chunk = await reader.readexactly(size)
        if first_delta_at is None and _TEXT_DELTA in chunk:
            first_delta_at = time.perf_counter()
        chunks.append(chunk)
        await reader.readexactly(2)
