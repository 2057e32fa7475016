"""`create_mcp_connections` and `McpConnections`: a turn's clients, opened together and closed together."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from bastion._cancel import AgentCancelledError
from bastion.mcp._client import McpClient
from bastion.mcp._definitions import ContextT, McpConnectionDefinition, report
from bastion.mcp._discovery import Discovered, build_tools, discover
from bastion.mcp._errors import FAILS_EVEN_IF_OPTIONAL, McpConnectionError
from bastion.mcp._validation import validate_all
from bastion.tools import Tool


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
        connections: Sequence[McpClient],
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
    validate_all(definitions)
    if cancel is not None and cancel.is_set():
        raise AgentCancelledError
    connections = [McpClient(definition) for definition in definitions]
    try:
        discovered = await _open_all(connections, context, cancel)
        tools = build_tools(discovered)
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


async def _open_all(
    connections: list[McpClient], context: Any, cancel: asyncio.Event | None
) -> list[Discovered]:
    """Open every connection; return the discovered ones, or raise the first error that must fail."""
    tasks: dict[asyncio.Future[Any], McpClient] = {
        asyncio.ensure_future(discover(connection, context)): connection for connection in connections
    }
    waiter: asyncio.Future[Any] | None = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
    failures: dict[McpClient, McpConnectionError] = {}
    results: dict[McpClient, Discovered] = {}
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
        await report(connection.definition, error)
    return [results[connection] for connection in connections if connection in results]


def _must_fail(definition: McpConnectionDefinition[Any], error: McpConnectionError) -> bool:
    return definition.failure == "required" or error.code in FAILS_EVEN_IF_OPTIONAL


async def _close_all(connections: Sequence[McpClient]) -> None:
    await asyncio.gather(*(connection.close() for connection in connections))
