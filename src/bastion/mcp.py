"""MCP servers as tools for one turn: `create_mcp_connections`, its definitions and `McpConnectionError`.

A definition names a remote MCP server reached over streamable HTTP or SSE. Its transport and headers
are resolved from the turn's trusted context every time it opens, so each turn (and each user) sends
only its own credentials; nothing is cached across turns. The server's tools are discovered once per
turn and exposed under an alias, or as `<namespace or connection name>__<remote name>`; with an
allowlist, nothing else is exposed, including tools the server adds later.

Clients belong to the turn. They close exactly once: on `close()`, when the cancel signal is set, or
when setup fails (every client opened so far is closed and no partial tool set is returned).

Failures are `McpConnectionError`s with a stable `code` (`configuration_error`, `discovery_failed`,
`execution_failed`, `authorization_required`, `cleanup_failed`), a `reason` within it, and the connection
and tool names; their messages never contain the server's URL, the credentials or anything the server
sent back. An HTTP 401 or 403, a missing or a refused credential is always `authorization_required`, at
discovery (even for an optional connection) and during a call, so the application can ask the user to
reconnect. Calls are never retried. Closing never raises: a client that does not let go and is cut off
after the request timeout is reported to `on_error` as `cleanup_failed`.

Results: a call returns the server's `structuredContent` when it sent one, otherwise
`{"content": [...]}` with the MCP content items as JSON objects. A result the server flagged with
`isError` stays an ordinary result, `{"content": [...], "isError": true}` (plus `structuredContent` if
any), and is also reported to the definition's `on_error` as `execution_failed` with the reason
`tool_error`. `on_error` hears about everything that is not raised to the application directly: optional
connections left out, failed calls (which the turn shows as tool errors), `isError` results and failed
cleanups.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeAlias, TypeVar
from urllib.parse import urlsplit

import httpx2

from bastion._extras import missing_extra

try:
    from mcp import types as mcp_types
    from mcp.client.session import ClientSession
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
except ImportError as error:
    raise missing_extra("bastion.mcp", "mcp", error) from error

from bastion._cancel import AgentCancelledError
from bastion.credentials import ConnectionAuthorizationFailedError, ConnectionAuthorizationRequiredError
from bastion.errors import ToolError
from bastion.tools import Tool, ToolCall

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "McpConnectionDefinition",
    "McpConnectionError",
    "McpConnections",
    "McpErrorCode",
    "McpErrorReason",
    "McpTransport",
    "create_mcp_connections",
]

ContextT = TypeVar("ContextT")
T = TypeVar("T")

logger = logging.getLogger("bastion.mcp")

DEFAULT_REQUEST_TIMEOUT_MS = 30_000
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")
_MAX_TOOL_PAGES = 100
_STREAM_READ_TIMEOUT = 3600.0
"""How long an idle event stream may stay silent; each request has its own, shorter bound."""

McpErrorCode: TypeAlias = Literal[
    "configuration_error",
    "discovery_failed",
    "execution_failed",
    "authorization_required",
    "cleanup_failed",
]
McpErrorReason: TypeAlias = Literal[
    # configuration_error
    "invalid_definitions",
    "invalid_name",
    "duplicate_name",
    "invalid_namespace",
    "invalid_transport",
    "invalid_headers",
    "invalid_auth",
    "invalid_failure",
    "invalid_on_error",
    "invalid_timeout",
    "invalid_include_instructions",
    "invalid_allowlist",
    "invalid_alias",
    "alias_outside_allowlist",
    "duplicate_alias",
    "invalid_tool_name",
    "duplicate_tool_name",
    # authorization_required
    "unauthorized",
    "credential_missing",
    "credential_refused",
    # discovery_failed, execution_failed, cleanup_failed
    "connection_failed",
    "timeout",
    "closed",
    "invalid_arguments",
    "request_failed",
    "tool_error",
]
_FAILS_EVEN_IF_OPTIONAL: frozenset[str] = frozenset({"configuration_error", "authorization_required"})


class McpConnectionError(ToolError):
    """An MCP connection failed. The message names only the connection and the tool.

    `code` is the stable kind: `configuration_error`, `discovery_failed`, `execution_failed`
    (including the report of a result the server flagged `isError`), `authorization_required` or
    `cleanup_failed`. `reason` says which check or step failed within it (for example `timeout`,
    `tool_error`, `credential_refused`, `alias_outside_allowlist`).
    It is a `ToolError`, so when a call fails its message is what the model and the UI are shown.
    """

    def __init__(
        self,
        code: McpErrorCode,
        *,
        reason: McpErrorReason,
        connection: str | None,
        tool: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.code: McpErrorCode = code
        self.reason: McpErrorReason = reason
        self.connection = connection
        self.tool = tool
        super().__init__(_message(code, reason, connection, tool, detail))

    def __repr__(self) -> str:
        return (
            f"McpConnectionError(code={self.code!r}, reason={self.reason!r}, "
            f"connection={self.connection!r}, tool={self.tool!r})"
        )


def _message(
    code: McpErrorCode, reason: McpErrorReason, connection: str | None, tool: str | None, detail: str | None
) -> str:
    """Messages built from names the application chose, never from anything the server sent."""
    where = f"the {connection} connection" if connection else "an MCP connection"
    subject = where[0].upper() + where[1:]  # not `capitalize()`: it would lowercase the name and "MCP"
    if code == "configuration_error":
        return f"MCP configuration error: {detail}" if detail else f"{subject} is misconfigured."
    if code == "authorization_required":
        if reason == "credential_refused":
            return f"The credentials for {where} were refused. Reconnect it and try again."
        return f"{subject} needs authorization. Reconnect it and try again."
    if code == "cleanup_failed":
        return f"{subject} did not close cleanly."
    if code == "execution_failed":
        if reason == "tool_error":
            return f"The tool {tool} on {where} reported an error."
        if reason == "closed":
            return f"{subject} is closed."
        if reason == "timeout":
            return f"The tool {tool} on {where} did not answer in time."
        return f"The tool {tool} failed on {where}."
    if reason == "timeout":
        return f"{subject} did not answer in time."
    return f"{subject} is unavailable."


@dataclass(frozen=True, kw_only=True)
class McpTransport:
    """Where a server is and which headers to send. The URL and headers never appear in a repr."""

    type: Literal["http", "sse"]
    url: str = field(repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


TransportResolver: TypeAlias = Callable[[ContextT], Awaitable[McpTransport]]
HeaderResolver: TypeAlias = Callable[[ContextT], Awaitable[Mapping[str, str]]]
ErrorReporter: TypeAlias = Callable[[McpConnectionError], Awaitable[None] | None]


@dataclass(frozen=True, kw_only=True)
class McpConnectionDefinition(Generic[ContextT]):
    """One named MCP server for a turn.

    - `transport`: an `McpTransport`, or an async function of the context returning one (called at
      every open, so it can read fresh credentials).
    - `auth`: an optional async function of the context returning headers (e.g. `credential_auth`),
      sent on top of the transport's own.
    - `allowlist`: the remote tool names to expose; None exposes whatever the server lists.
    - `aliases`: remote name → exposed name; other tools are `<namespace or name>__<remote name>`.
    - `failure`: `"required"` fails the turn when discovery fails; `"optional"` leaves the connection
      out and reports to `on_error` (authorization and configuration errors always fail).
    - `request_timeout_ms`: the bound on each request to the server (a positive whole number).
    - `include_instructions`: put the server's own instructions into `McpConnections.instructions`.
    """

    name: str
    transport: McpTransport | TransportResolver[ContextT]
    auth: HeaderResolver[ContextT] | None = None
    allowlist: Sequence[str] | None = None
    aliases: Mapping[str, str] = field(default_factory=dict)
    namespace: str | None = None
    failure: Literal["required", "optional"] = "required"
    on_error: ErrorReporter | None = None
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    include_instructions: bool = False

    @property
    def prefix(self) -> str:
        return self.namespace if self.namespace is not None else self.name

    def exposed_name(self, remote: str) -> str:
        return self.aliases.get(remote) or f"{self.prefix}__{remote}"


class McpConnections:
    """The open connections of one turn: their `tools`, opted-in server `instructions`, and `close()`.

    Compose `tools` with local tools in the agent's tool factory and return `close` with them::

        connections = await create_mcp_connections(definitions, context=context, cancel=cancel)
        try:
            return AgentTools(tools=compose_tools(local, connections.tools), close=connections.close)
        except BaseException:
            await connections.close()
            raise
    """

    def __init__(
        self,
        *,
        connections: Sequence[_Connection],
        tools: list[Tool],
        instructions: str | None,
        cancel: asyncio.Event | None,
    ) -> None:
        self._connections = list(connections)
        self.tools = tools
        self.instructions = instructions
        self._closing: asyncio.Task[None] | None = None
        self._watcher = asyncio.ensure_future(self._close_on(cancel)) if cancel is not None else None

    async def _close_on(self, cancel: asyncio.Event) -> None:
        await cancel.wait()
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closing is not None and self._closing.done()

    async def close(self) -> None:
        """Close every client, exactly once however often (and from wherever) it is called."""
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
        if self._closing is None:
            self._closing = asyncio.ensure_future(_close_all(self._connections))
        await asyncio.shield(self._closing)


async def create_mcp_connections(
    definitions: Sequence[McpConnectionDefinition[ContextT]],
    *,
    context: ContextT,
    cancel: asyncio.Event | None = None,
) -> McpConnections:
    """Open the named MCP servers for one turn and discover their tools.

    Every definition is checked before anything connects (`configuration_error`). Connections open
    concurrently. A required connection that fails, an authorization failure on any connection, or two
    tools with one name fail the whole call: every client opened so far is closed first. If `cancel`
    is set during setup, everything opened is closed and `AgentCancelledError` is raised; if it is set
    later, the connections close themselves.
    """
    _validate_all(definitions)
    if cancel is not None and cancel.is_set():
        raise AgentCancelledError
    connections = [_Connection(definition) for definition in definitions]
    try:
        discovered = await _open_all(connections, context, cancel)
        tools = _build_tools(discovered)
    except BaseException:
        await _close_all(connections)
        raise
    instructions = [
        f"Instructions from the {item.definition.name} connection:\n{item.instructions}"
        for item in discovered
        if item.definition.include_instructions and item.instructions
    ]
    return McpConnections(
        connections=connections,
        tools=tools,
        instructions="\n\n".join(instructions) or None,
        cancel=cancel,
    )


@dataclass
class _Discovered:
    connection: _Connection
    remote_tools: list[mcp_types.Tool]
    instructions: str | None

    @property
    def definition(self) -> McpConnectionDefinition[Any]:
        return self.connection.definition


async def _open_all(
    connections: list[_Connection], context: Any, cancel: asyncio.Event | None
) -> list[_Discovered]:
    """Open every connection; return the discovered ones, or raise the first error that must fail."""
    tasks: dict[asyncio.Future[Any], _Connection] = {
        asyncio.ensure_future(connection.open(context)): connection for connection in connections
    }
    waiter: asyncio.Future[Any] | None = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
    failures: dict[_Connection, McpConnectionError] = {}
    results: dict[_Connection, _Discovered] = {}
    pending: set[asyncio.Future[Any]] = set(tasks)
    try:
        while pending:
            watched = pending | ({waiter} if waiter is not None else set())
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if waiter is not None and waiter in done:
                raise AgentCancelledError
            for task in done:
                pending.discard(task)
                connection = tasks[task]
                error = task.exception()
                if error is None:
                    results[connection] = task.result()
                elif not isinstance(error, McpConnectionError) or _must_fail(connection.definition, error):
                    raise error
                else:
                    failures[connection] = error
    finally:
        if waiter is not None:
            waiter.cancel()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for connection, error in failures.items():
        await _report(connection.definition, error)
    return [results[connection] for connection in connections if connection in results]


def _must_fail(definition: McpConnectionDefinition[Any], error: McpConnectionError) -> bool:
    return definition.failure == "required" or error.code in _FAILS_EVEN_IF_OPTIONAL


async def _close_all(connections: Sequence[_Connection]) -> None:
    await asyncio.gather(*(connection.close() for connection in connections))


def _build_tools(discovered: list[_Discovered]) -> list[Tool]:
    """Expose the discovered tools under their final names; a name offered twice is an error."""
    tools: list[Tool] = []
    owners: dict[str, str] = {}
    for item in discovered:
        definition = item.definition
        allowed = set(definition.allowlist) if definition.allowlist is not None else None
        for remote in item.remote_tools:
            if allowed is not None and remote.name not in allowed:
                continue
            name = definition.exposed_name(remote.name)
            if name in owners:
                raise McpConnectionError(
                    "configuration_error",
                    reason="duplicate_tool_name",
                    connection=definition.name,
                    tool=name,
                    detail=f"the tool name {name!r} is offered by {owners[name]!r} and {definition.name!r}.",
                )
            built = _remote_tool(item.connection, remote, name)
            if built is not None:
                owners[name] = definition.name
                tools.append(built)
    return tools


def _remote_tool(connection: _Connection, remote: mcp_types.Tool, name: str) -> Tool | None:
    async def execute(call: ToolCall) -> Any:
        return await connection.call(remote.name, call.input, exposed=name)

    try:
        return Tool(
            name=name,
            description=remote.description or remote.title or "",
            input_schema=dict(remote.input_schema),
            execute=execute,
            dynamic=True,
        )
    except Exception:
        logger.warning(
            "Skipping a tool of the %s connection: its name or input schema is unusable.",
            connection.definition.name,
            exc_info=True,
        )
        return None


class _StatusRecorder(httpx2.Auth):
    """Sees every HTTP response of one client: the SDK hides 401/403 behind generic errors (or a hang)."""

    def __init__(self) -> None:
        self.rejected = asyncio.Event()

    async def async_auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        response = yield request
        if response.status_code in (401, 403):
            self.rejected.set()


class _Connection:
    """One client for one turn. Its transport lives in an owner task, which entered it and must exit it."""

    def __init__(self, definition: McpConnectionDefinition[Any]) -> None:
        self.definition = definition
        self._name = definition.name
        self._timeout = definition.request_timeout_ms / 1000
        self._recorder = _StatusRecorder()
        self._stop = asyncio.Event()
        self._ended = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None
        self._session: ClientSession | None = None
        self._closing: asyncio.Task[None] | None = None

    async def open(self, context: Any) -> _Discovered:
        try:
            transport = await self._resolve(context)
            ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
            ready.add_done_callback(_mark_retrieved)
            self._owner = asyncio.ensure_future(self._hold(transport, ready))
            session = await self._request(_wait_for(ready), stage="connect")
            self._session = session
            initialized = await self._request(session.initialize(), stage="connect")
            tools = await self._list_tools(session)
        except BaseException:
            await self.close()
            raise
        return _Discovered(connection=self, remote_tools=tools, instructions=initialized.instructions)

    async def _resolve(self, context: Any) -> McpTransport:
        definition = self.definition
        try:
            transport = definition.transport
            if not isinstance(transport, McpTransport):
                transport = await transport(context)
            extra = await definition.auth(context) if definition.auth is not None else {}
        except ConnectionAuthorizationRequiredError:
            raise McpConnectionError(
                "authorization_required", reason="credential_missing", connection=self._name
            ) from None
        except ConnectionAuthorizationFailedError:
            raise McpConnectionError(
                "authorization_required", reason="credential_refused", connection=self._name
            ) from None
        except Exception:
            logger.warning("Resolving the transport of the %s connection failed.", self._name, exc_info=True)
            raise McpConnectionError(
                "discovery_failed", reason="connection_failed", connection=self._name
            ) from None
        problem = _transport_problem(transport) or _headers_problem(extra)
        if problem is not None:
            reason, text = problem
            raise McpConnectionError(
                "configuration_error",
                reason=reason,
                connection=self._name,
                detail=f"connection {self._name!r}: {text}",
            )
        return McpTransport(type=transport.type, url=transport.url, headers={**transport.headers, **extra})

    async def _list_tools(self, session: ClientSession) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_TOOL_PAGES):
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
            page = await self._request(session.list_tools(params=params), stage="connect")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools
        logger.warning("The %s connection lists too many pages of tools; using the first ones.", self._name)
        return tools

    async def _hold(self, transport: McpTransport, ready: asyncio.Future[ClientSession]) -> None:
        """Enter the transport and session, wait until told to stop, exit them in this same task."""
        timeout = httpx2.Timeout(self._timeout, read=_STREAM_READ_TIMEOUT)
        headers = dict(transport.headers)
        try:
            async with AsyncExitStack() as stack:
                if transport.type == "http":
                    client = await stack.enter_async_context(
                        httpx2.AsyncClient(headers=headers, timeout=timeout, auth=self._recorder)
                    )
                    streams = await stack.enter_async_context(
                        streamable_http_client(transport.url, http_client=client)
                    )
                else:
                    streams = await stack.enter_async_context(
                        sse_client(
                            transport.url,
                            headers=headers,
                            timeout=self._timeout,
                            sse_read_timeout=_STREAM_READ_TIMEOUT,
                            auth=self._recorder,
                        )
                    )
                session = await stack.enter_async_context(ClientSession(*streams))
                if not ready.done():
                    ready.set_result(session)
                await self._stop.wait()
        except BaseException as error:
            if not ready.done():
                if isinstance(error, Exception):
                    ready.set_exception(error)
                else:
                    ready.cancel()
            elif not self._stop.is_set():
                logger.warning("The %s connection was lost.", self._name, exc_info=True)
        finally:
            self._ended.set()

    async def call(self, remote: str, arguments: Any, *, exposed: str) -> Any:
        """Call a remote tool once, under the request timeout; failures are reported, then raised."""
        try:
            if self._session is None or self._stop.is_set():
                raise McpConnectionError(
                    "execution_failed", reason="closed", connection=self._name, tool=exposed
                )
            if not isinstance(arguments, Mapping):
                raise McpConnectionError(
                    "execution_failed", reason="invalid_arguments", connection=self._name, tool=exposed
                )
            result = await self._request(
                self._session.call_tool(remote, dict(arguments)), stage="call", tool=exposed
            )
        except McpConnectionError as error:
            await _report(self.definition, error)
            raise
        output = _tool_output(result)
        if result.is_error:
            await _report(
                self.definition,
                McpConnectionError(
                    "execution_failed", reason="tool_error", connection=self._name, tool=exposed
                ),
            )
        return output

    async def _request(
        self, work: Coroutine[Any, Any, T], *, stage: Literal["connect", "call"], tool: str | None = None
    ) -> T:
        """Await one request, bounded by the timeout; stop at once if the server refused the credentials."""
        if self._recorder.rejected.is_set():
            work.close()
            raise self._failure(stage, "unauthorized", tool)
        task = asyncio.ensure_future(work)
        watchers = {
            asyncio.ensure_future(self._recorder.rejected.wait()),
            asyncio.ensure_future(self._ended.wait()),
        }
        try:
            await asyncio.wait({task, *watchers}, timeout=self._timeout, return_when=asyncio.FIRST_COMPLETED)
            finished = task.done()
        finally:
            for watcher in watchers:
                watcher.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not finished:
            raise self._failure(stage, self._unfinished_reason(), tool)
        if task.cancelled():
            raise self._failure(stage, "connection_failed", tool)
        error = task.exception()
        if error is None:
            return task.result()
        logger.warning("A request to the %s connection failed.", self._name, exc_info=error)
        raise self._failure(stage, self._failure_reason(error, stage), tool) from None

    def _failure(
        self, stage: Literal["connect", "call"], reason: McpErrorReason, tool: str | None
    ) -> McpConnectionError:
        if reason == "unauthorized":
            code: McpErrorCode = "authorization_required"
        else:
            code = "discovery_failed" if stage == "connect" else "execution_failed"
        return McpConnectionError(code, reason=reason, connection=self._name, tool=tool)

    def _unfinished_reason(self) -> McpErrorReason:
        if self._recorder.rejected.is_set():
            return "unauthorized"
        return "connection_failed" if self._ended.is_set() else "timeout"

    def _failure_reason(self, error: BaseException, stage: str) -> McpErrorReason:
        if self._recorder.rejected.is_set():
            return "unauthorized"
        if isinstance(error, httpx2.TimeoutException):
            return "timeout"
        if self._ended.is_set() or stage == "connect" or isinstance(error, httpx2.TransportError):
            return "connection_failed"
        if isinstance(error, MCPError) and error.code == mcp_types.CONNECTION_CLOSED:
            return "connection_failed"
        return "request_failed"

    async def close(self) -> None:
        """Exit the transport exactly once; a server that does not let go is cut off after the timeout."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shut())
        await asyncio.shield(self._closing)

    async def _shut(self) -> None:
        self._stop.set()
        owner = self._owner
        if owner is None:
            return
        done, _ = await asyncio.wait({owner}, timeout=self._timeout)
        if not done:
            owner.cancel()
            await asyncio.gather(owner, return_exceptions=True)
            logger.warning("The %s connection did not close in time; it was cut off.", self._name)
            # Closing never raises (the turn is over): the application hears of it through on_error.
            await _report(
                self.definition, McpConnectionError("cleanup_failed", reason="timeout", connection=self._name)
            )


async def _wait_for(ready: asyncio.Future[ClientSession]) -> ClientSession:
    return await asyncio.shield(ready)


def _mark_retrieved(future: asyncio.Future[Any]) -> None:
    """A connect failure nobody waits for any more (after a timeout) is not an unhandled error."""
    if not future.cancelled():
        future.exception()


def _tool_output(result: mcp_types.CallToolResult) -> Any:
    content = [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in result.content]
    if not result.is_error:
        if result.structured_content is not None:
            return result.structured_content
        return {"content": content}
    output: dict[str, Any] = {"content": content, "isError": True}
    if result.structured_content is not None:
        output["structuredContent"] = result.structured_content
    return output


async def _report(definition: McpConnectionDefinition[Any], error: McpConnectionError) -> None:
    """Tell the application; a failing reporter is logged and never changes the outcome."""
    if definition.on_error is None:
        return
    try:
        reported = definition.on_error(error)
        if inspect.isawaitable(reported):
            await reported
    except Exception:
        logger.warning("The on_error hook of the %s connection failed.", definition.name, exc_info=True)


_Problem: TypeAlias = tuple[McpErrorReason, str]
"""A failed configuration check: its reason and what to fix."""


def _transport_problem(transport: Any) -> _Problem | None:
    if not isinstance(transport, McpTransport):
        return "invalid_transport", "the transport must be an McpTransport."
    if transport.type not in ("http", "sse"):
        return "invalid_transport", "the transport type must be 'http' or 'sse'."
    try:
        parts = urlsplit(transport.url) if isinstance(transport.url, str) else None
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return "invalid_transport", "the transport URL must be an http or https URL."
    return _headers_problem(transport.headers)


def _headers_problem(headers: Any) -> _Problem | None:
    if not isinstance(headers, Mapping):
        return "invalid_headers", "headers must be a mapping of strings."
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str) or "\n" in value or "\r" in value:
            return "invalid_headers", "headers must be a mapping of strings."
    return None


def _validate_all(definitions: Sequence[McpConnectionDefinition[Any]]) -> None:
    """Check every definition, and the names they would expose, before anything connects."""
    if isinstance(definitions, str | bytes) or not isinstance(definitions, Sequence):
        raise McpConnectionError(
            "configuration_error",
            reason="invalid_definitions",
            connection=None,
            detail="definitions must be a list of McpConnectionDefinition.",
        )
    names: set[str] = set()
    exposed: dict[str, str] = {}
    for definition in definitions:
        if not isinstance(definition, McpConnectionDefinition):
            raise McpConnectionError(
                "configuration_error",
                reason="invalid_definitions",
                connection=None,
                detail="each definition must be an McpConnectionDefinition.",
            )
        problem = _definition_problem(definition)
        if problem is None and definition.name in names:
            problem = "duplicate_name", "the connection name is used twice."
        if problem is not None:
            reason, text = problem
            raise McpConnectionError(
                "configuration_error",
                reason=reason,
                connection=_safe_name(definition.name),
                detail=f"connection {_safe_name(definition.name)!r}: {text}",
            )
        names.add(definition.name)
        for name in _predicted_names(definition):
            if name in exposed:
                raise McpConnectionError(
                    "configuration_error",
                    reason="duplicate_tool_name",
                    connection=definition.name,
                    tool=name,
                    detail=f"the tool name {name!r} is offered by {exposed[name]!r} and {definition.name!r}.",
                )
            exposed[name] = definition.name


def _definition_problem(definition: McpConnectionDefinition[Any]) -> _Problem | None:
    if not _is_name(definition.name):
        return "invalid_name", "the name must be 1–64 letters, digits, underscores or hyphens."
    if definition.namespace is not None and not _is_name(definition.namespace):
        return "invalid_namespace", "the namespace must be 1–64 letters, digits, underscores or hyphens."
    if isinstance(definition.transport, McpTransport):
        problem = _transport_problem(definition.transport)
        if problem is not None:
            return problem
    elif not callable(definition.transport):
        return (
            "invalid_transport",
            "the transport must be an McpTransport or an async function of the context.",
        )
    if definition.auth is not None and not callable(definition.auth):
        return "invalid_auth", "auth must be an async function of the context."
    if definition.failure not in ("required", "optional"):
        return "invalid_failure", "failure must be 'required' or 'optional'."
    if definition.on_error is not None and not callable(definition.on_error):
        return "invalid_on_error", "on_error must be a function."
    if not _is_positive_whole(definition.request_timeout_ms):
        return "invalid_timeout", "request_timeout_ms must be a positive whole number of milliseconds."
    if not isinstance(definition.include_instructions, bool):
        return "invalid_include_instructions", "include_instructions must be True or False."
    return _tool_names_problem(definition)


def _tool_names_problem(definition: McpConnectionDefinition[Any]) -> _Problem | None:
    allowlist = definition.allowlist
    if allowlist is not None:
        if isinstance(allowlist, str) or not all(isinstance(item, str) and item for item in allowlist):
            return "invalid_allowlist", "allowlist must be a list of tool names."
        if len(set(allowlist)) != len(allowlist):
            return "invalid_allowlist", "allowlist names a tool twice."
    if not isinstance(definition.aliases, Mapping):
        return "invalid_alias", "aliases must map remote tool names to exposed names."
    for remote, alias in definition.aliases.items():
        if not isinstance(remote, str) or not _is_tool_name(alias):
            return "invalid_alias", "each alias must be 1–128 letters, digits, underscores or hyphens."
        if allowlist is not None and remote not in allowlist:
            return "alias_outside_allowlist", f"the alias for {remote!r} names a tool outside the allowlist."
    if len(set(definition.aliases.values())) != len(definition.aliases):
        return "duplicate_alias", "two remote tools share one alias."
    for name in _predicted_names(definition):
        if not _is_tool_name(name):
            return (
                "invalid_tool_name",
                f"the exposed tool name {name!r} is not 1–128 letters, digits, underscores or hyphens.",
            )
    return None


def _predicted_names(definition: McpConnectionDefinition[Any]) -> list[str]:
    """The names this definition will expose, as far as they are known before discovery."""
    names = dict.fromkeys(definition.aliases.values())
    for remote in definition.allowlist or ():
        names[definition.exposed_name(remote)] = None
    return list(names)


def _is_positive_whole(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and float(value).is_integer() and value > 0


def _is_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _is_tool_name(name: object) -> bool:
    return isinstance(name, str) and _TOOL_NAME.fullmatch(name) is not None


def _safe_name(name: object) -> str | None:
    return name if isinstance(name, str) and _is_name(name) else None
