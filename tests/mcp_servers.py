"""Real MCP servers for tests, built with the `mcp` SDK and served by uvicorn on 127.0.0.1.

Each server speaks streamable HTTP or SSE and sits behind a small ASGI layer that plays the server's
part in a scenario: it can require bearer tokens (answering 401 with a body that holds a secret),
answer 401/403 only to tool calls, hold back its tool listing, or cut the connection while answering a
call. It records every HTTP request (its Authorization header, JSON-RPC method and tool arguments)
so tests can see exactly what a client sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ListToolsResult, PaginatedRequestParams, ResourceLink, TextContent
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.live_server import live_server

SECRET_BODY = "SECRET-BODY-d41d8cd9"
SECRET_PATH = "SECRET-PATH-8f00b204"
SERVER_INSTRUCTIONS = "SERVER-INSTRUCTIONS: always cite the document id."
DROP_TOOL = "disconnect"
PROTOCOL_ERROR_TOOL = "explode"

TransportKind = Literal["http", "sse"]


class SearchResult(TypedDict):
    hits: list[str]
    query: str


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    authorization: str | None
    session_id: str | None
    rpc_method: str | None = None
    tool: str | None = None
    arguments: Any = None


@dataclass
class ServerLog:
    """What the server received; written by the server thread, read by tests."""

    requests: list[RecordedRequest] = field(default_factory=list)
    deletes: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: RecordedRequest) -> None:
        with self.lock:
            self.requests.append(request)
        if request.method == "DELETE":
            self.deletes.release()

    def tool_calls(self, tool: str | None = None) -> list[RecordedRequest]:
        with self.lock:
            return [r for r in self.requests if r.rpc_method == "tools/call" and tool in (None, r.tool)]

    def count_rpc(self, rpc_method: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.rpc_method == rpc_method)

    def count(self, method: str) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.method == method)


@dataclass(frozen=True)
class Behavior:
    """How the server treats requests. `tokens`: accepted bearer tokens (None accepts any request)."""

    tokens: frozenset[str] | None = None
    token_status: int = 401
    reject_calls_with: int | None = None
    slow_discovery: bool = False
    hold_deletes: bool = False
    paged_tools: Literal["one_per_page", "endless"] | None = None
    refuse_rpc: str | None = None


@dataclass
class RunningServer:
    transport: TransportKind
    url: str
    log: ServerLog
    mcp: MCPServer
    release_slow: threading.Event


class _DocumentsServer(MCPServer):
    """An MCP server whose tool listing can be held back until the test releases it, or paged: one tool
    per page, or pages without end (each empty, each pointing to the next)."""

    def __init__(
        self,
        *,
        slow_discovery: bool,
        release: threading.Event,
        paged: Literal["one_per_page", "endless"] | None = None,
    ) -> None:
        super().__init__("documents", instructions=SERVER_INSTRUCTIONS, log_level="WARNING")
        self._slow_discovery = slow_discovery
        self._release = release
        self._paged = paged

    async def list_tools(self) -> list[Any]:
        if self._slow_discovery:
            await asyncio.to_thread(self._release.wait, 30)
        return await super().list_tools()

    async def _handle_list_tools(self, ctx: Any, params: PaginatedRequestParams | None) -> ListToolsResult:
        if self._paged is None:
            return await super()._handle_list_tools(ctx, params)
        page = int(params.cursor) if params is not None and params.cursor is not None else 0
        if self._paged == "endless":
            return ListToolsResult(tools=[], next_cursor=str(page + 1))
        tools = await self.list_tools()
        following = str(page + 1) if page + 1 < len(tools) else None
        return ListToolsResult(tools=tools[page : page + 1], next_cursor=following)


def build_mcp_server(
    release_slow: threading.Event,
    *,
    slow_discovery: bool = False,
    paged: Literal["one_per_page", "endless"] | None = None,
) -> MCPServer:
    """The MCP server every scenario uses: a few tools, one slow, one failing, one that adds a tool."""
    server = _DocumentsServer(slow_discovery=slow_discovery, release=release_slow, paged=paged)

    @server.tool()
    def search(query: str) -> SearchResult:
        """Search the documents."""
        return {"hits": [f"doc-{query}"], "query": query}

    @server.tool(structured_output=False)
    def read(id: str) -> str:
        """Read one document (plain text content, no structured result)."""
        return f"Contents of {id}."

    @server.tool()
    def whoami(user: str) -> str:
        """Echo the caller's claimed name; the server log shows which credential came with it."""
        return user

    @server.tool()
    async def slow() -> str:
        """Answer only when the test releases it."""
        await asyncio.to_thread(release_slow.wait, 30)
        return "finally"

    @server.tool()
    def broken() -> str:
        """Fail with a domain error: the result carries isError."""
        raise ToolError("The document store is offline.")

    @server.tool()
    def flagged() -> CallToolResult:
        """Fail with a result of its own: content, structured details and isError."""
        return CallToolResult(
            content=[TextContent(type="text", text="Quota exceeded.")],
            structured_content={"retry_after": 30},
            is_error=True,
        )

    @server.tool(structured_output=False)
    def cite(id: str) -> ResourceLink:
        """Point to a document instead of returning it."""
        return ResourceLink(
            type="resource_link", uri=f"file:///docs/{id}", name=f"doc-{id}", mime_type="text/plain"
        )

    @server.tool(title="Titled, not described")
    def titled() -> str:
        return "titled"

    @server.tool()
    def undescribed() -> str:
        return "undescribed"

    @server.tool(name="has.dot")
    def dotted() -> str:
        """A name no exposed tool name may contain."""
        return "dotted"

    @server.tool()
    def unlock() -> str:
        """Add a tool to the server after clients have discovered its tools."""

        def added_later() -> str:
            """A tool that did not exist at discovery."""
            return "surprise"

        server.add_tool(added_later)
        return "unlocked"

    @server.tool(name=PROTOCOL_ERROR_TOOL)
    def explode() -> str:
        """Over streamable HTTP, answered with a JSON-RPC error (holding a secret) instead of a result."""
        return "never delivered"

    @server.tool(name=DROP_TOOL)
    def disconnect() -> str:
        """The server cuts the connection while answering this call."""
        return "never delivered"

    return server


class _ScenarioLayer:
    """ASGI layer in front of the MCP app: records requests and plays the scenario's behavior."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        behavior: Behavior,
        log: ServerLog,
        transport: TransportKind,
        release: threading.Event,
    ) -> None:
        self.app = app
        self.release = release
        self.behavior = behavior
        self.log = log
        self.transport = transport
        self._drop_sessions: set[str] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        body = b""
        if scope["method"] == "POST":
            body = await _read_body(receive)
        rpc = _parse_rpc(body)
        session_id = headers.get("mcp-session-id") or _query_session(scope)
        params = rpc.get("params") or {}
        tool = params.get("name") if rpc.get("method") == "tools/call" else None
        self.log.add(
            RecordedRequest(
                method=scope["method"],
                path=scope["path"],
                authorization=headers.get("authorization"),
                session_id=session_id,
                rpc_method=rpc.get("method"),
                tool=tool,
                arguments=params.get("arguments"),
            )
        )
        tokens = self.behavior.tokens
        if tokens is not None and headers.get("authorization") not in {f"Bearer {t}" for t in tokens}:
            await _reject(send, self.behavior.token_status, rpc)
            return
        if self.behavior.hold_deletes and scope["method"] == "DELETE":
            # A server that does not let go of the session until the test releases it.
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        if self.behavior.reject_calls_with is not None and rpc.get("method") == "tools/call":
            await _reject(send, self.behavior.reject_calls_with, rpc)
            return
        if tool == PROTOCOL_ERROR_TOOL and self.transport == "http":
            await _reject(send, 200, rpc)
            return
        if self.behavior.refuse_rpc is not None and rpc.get("method") == self.behavior.refuse_rpc:
            await _reject(send, 200, rpc)  # a JSON-RPC error answer, over a healthy connection
            return
        replay = _replay(body) if scope["method"] == "POST" else receive
        if tool == DROP_TOOL:
            if self.transport == "http":
                await self.app(scope, replay, _cut_after_start(send))
                return
            if session_id is not None:
                self._drop_sessions.add(session_id)
        if self.transport == "sse" and scope["method"] == "GET" and session_id is None:
            send = self._droppable_stream(send)
        await self.app(scope, replay, send)

    def _droppable_stream(self, send: Send) -> Send:
        """The SSE stream of a session dies when it would deliver the answer to a dropped call."""
        sessions: list[str] = []

        async def wrapped(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] == "http.response.body" and b"session_id=" in body and not sessions:
                sessions.append(body.decode().split("session_id=", 1)[1].split()[0].strip())
            if sessions and sessions[0] in self._drop_sessions and b"event: message" in body:
                raise ConnectionResetError("The test server dropped the connection.")
            await send(message)

        return wrapped


def _cut_after_start(send: Send) -> Send:
    """Start the response, then fail before any body: uvicorn closes the connection mid-response."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            raise ConnectionResetError("The test server dropped the connection.")
        await send(message)

    return wrapped


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return receive


def _parse_rpc(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body) if body else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _query_session(scope: Scope) -> str | None:
    query = scope.get("query_string", b"").decode()
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key == "session_id" and value:
            return value
    return None


async def _reject(send: Send, status: int, rpc: dict[str, Any]) -> None:
    """Answer with a JSON-RPC error body that holds a secret, as a careless server might."""
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": rpc.get("id"),
            "error": {"code": -32001, "message": f"token rejected {SECRET_BODY}"},
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
        }
    )
    await send({"type": "http.response.body", "body": body})


@contextmanager
def serve_mcp(transport: TransportKind, behavior: Behavior | None = None) -> Iterator[RunningServer]:
    """Serve a fresh MCP server over `transport` on a free port until the block exits."""
    behavior = behavior or Behavior()
    release_slow = threading.Event()
    server = build_mcp_server(
        release_slow, slow_discovery=behavior.slow_discovery, paged=behavior.paged_tools
    )
    log = ServerLog()
    if transport == "http":
        app = server.streamable_http_app(streamable_http_path=f"/{SECRET_PATH}/mcp")
        path = f"/{SECRET_PATH}/mcp"
    else:
        app = server.sse_app(sse_path=f"/{SECRET_PATH}/sse", message_path=f"/{SECRET_PATH}/messages/")
        path = f"/{SECRET_PATH}/sse"
    layer = _ScenarioLayer(app, behavior=behavior, log=log, transport=transport, release=release_slow)
    with live_server(layer) as base:
        running = RunningServer(
            transport=transport, url=base + path, log=log, mcp=server, release_slow=release_slow
        )
        try:
            yield running
        finally:
            release_slow.set()
