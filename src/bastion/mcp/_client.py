"""One client of one turn: its transport held by an owner task, each request bounded, closed exactly once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping
from contextlib import AsyncExitStack
from typing import Any, Literal, TypeVar

import httpx2
from mcp import types as mcp_types
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from bastion.mcp._definitions import McpConnectionDefinition, McpTransport, report
from bastion.mcp._errors import McpConnectionError, McpErrorCode, McpErrorReason
from bastion.mcp._output import tool_output

T = TypeVar("T")

logger = logging.getLogger("bastion.mcp")

_STREAM_READ_TIMEOUT = 3600.0
"""How long an idle event stream may stay silent; each request has its own, shorter bound."""

Stage = Literal["connect", "call"]
_FAILURE_CODES: dict[Stage, McpErrorCode] = {"connect": "discovery_failed", "call": "execution_failed"}
"""What a failed request is at each stage (a refused credential is `authorization_required` at both)."""


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


class McpClient:
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
        # Set by discovery when tools are pinned: re-checks a changed listing, returns the tools to withhold.
        self.on_tools_changed: Callable[[], Awaitable[set[str]]] | None = None
        self._withheld: set[str] = set()
        self._withhold_all = False
        self._recheck: asyncio.Future[None] | None = None

    async def connect(self, transport: McpTransport) -> ClientSession:
        """Start the owner task and wait, under the request bound, for its session."""
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        ready.add_done_callback(_mark_retrieved)
        self._owner = asyncio.ensure_future(self._hold(transport, ready))
        session = await self.request(_wait_for(ready), stage="connect")
        self._session = session
        return session

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
                session = await stack.enter_async_context(
                    ClientSession(*streams, message_handler=self._message)
                )
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

    async def _message(self, message: Any) -> None:
        """A `tools/list_changed` notification starts the same check as discovery (the calls wait for it)."""
        notification = getattr(message, "root", message)
        if (
            isinstance(notification, mcp_types.ToolListChangedNotification)
            and self.on_tools_changed is not None
        ):
            self._recheck = asyncio.ensure_future(self._withhold(self.on_tools_changed))

    async def _withhold(self, recheck: Callable[[], Awaitable[set[str]]]) -> None:
        try:
            self._withheld = await recheck()
        except Exception:  # fail closed: nothing of a listing that could not be checked is used
            logger.warning("Re-checking the %s connection's changed tools failed.", self._name, exc_info=True)
            self._withhold_all = True

    def withheld(self, remote: str) -> bool:
        return self._withhold_all or remote in self._withheld

    async def call(self, remote: str, arguments: Any, *, exposed: str) -> Any:
        """Call a remote tool once, under the request timeout; failures are reported, then raised."""
        try:
            if self._session is None or self._stop.is_set():
                raise McpConnectionError(
                    "execution_failed", reason="closed", connection=self._name, tool=exposed
                )
            if self._recheck is not None:
                await asyncio.shield(self._recheck)
            if self.withheld(remote):
                raise McpConnectionError(
                    "execution_failed", reason="tool_withheld", connection=self._name, tool=exposed
                )
            if not isinstance(arguments, Mapping):
                raise McpConnectionError(
                    "execution_failed", reason="invalid_arguments", connection=self._name, tool=exposed
                )
            result = await self.request(
                self._session.call_tool(remote, dict(arguments)), stage="call", tool=exposed
            )
        except McpConnectionError as error:
            await report(self.definition, error)
            raise
        output = tool_output(result)
        if result.is_error:
            await report(
                self.definition,
                McpConnectionError(
                    "execution_failed", reason="tool_error", connection=self._name, tool=exposed
                ),
            )
        return output

    async def request(self, work: Coroutine[Any, Any, T], *, stage: Stage, tool: str | None = None) -> T:
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

    def _failure(self, stage: Stage, reason: McpErrorReason, tool: str | None) -> McpConnectionError:
        code = "authorization_required" if reason == "unauthorized" else _FAILURE_CODES[stage]
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
            await report(
                self.definition, McpConnectionError("cleanup_failed", reason="timeout", connection=self._name)
            )


async def _wait_for(ready: asyncio.Future[ClientSession]) -> ClientSession:
    return await asyncio.shield(ready)


def _mark_retrieved(future: asyncio.Future[Any]) -> None:
    """A connect failure nobody waits for any more (after a timeout) is not an unhandled error."""
    if not future.cancelled():
        future.exception()
