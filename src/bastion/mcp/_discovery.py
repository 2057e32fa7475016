"""Discovery: open a client, read the server's tool listing, and expose its tools under their final names."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from mcp import types as mcp_types
from mcp.client.session import ClientSession

from bastion.mcp._client import McpClient
from bastion.mcp._definitions import McpConnectionDefinition
from bastion.mcp._errors import McpConnectionError
from bastion.mcp._resolve import resolve_transport
from bastion.mcp.tool_pins import tool_definition, tool_fingerprint
from bastion.tools import Tool, ToolCall

logger = logging.getLogger("bastion.mcp")

_MAX_TOOL_PAGES = 100


@dataclass
class Discovered:
    """An open client with what its server offered at discovery."""

    client: McpClient
    remote_tools: list[mcp_types.Tool]
    instructions: str | None

    @property
    def definition(self) -> McpConnectionDefinition[Any]:
        return self.client.definition


async def discover(client: McpClient, context: Any) -> Discovered:
    """Resolve, connect, initialize and list the tools; on any failure the client is closed first."""
    try:
        transport = await resolve_transport(client.definition, context)
        session = await client.connect(transport)
        initialized = await client.request(session.initialize(), stage="connect")
        tools = await pinned(client.definition, await _list_tools(client, session), context)
    except BaseException:
        await client.close()
        raise
    if client.definition.tool_pins is not None:
        client.on_tools_changed = functools.partial(_recheck, client, session, context, _fingerprints(tools))
    return Discovered(client=client, remote_tools=tools, instructions=initialized.instructions)


async def _list_tools(client: McpClient, session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_TOOL_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor)
        page = await client.request(session.list_tools(params=params), stage="connect")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
    logger.warning(
        "The %s connection lists too many pages of tools; using the first ones.", client.definition.name
    )
    return tools


async def pinned(
    definition: McpConnectionDefinition[Any], tools: list[mcp_types.Tool], context: Any
) -> list[mcp_types.Tool]:
    """The tools the application's approved list lets through (all, without `tool_pins`); fails closed."""
    if definition.tool_pins is None:
        return tools
    allowlist = set(definition.allowlist) if definition.allowlist is not None else None
    exposed = [tool for tool in tools if allowlist is None or tool.name in allowlist]
    try:
        allowed = await definition.tool_pins.allowed(definition.name, exposed, context=context)
    except Exception:
        logger.warning(
            "Checking the %s connection's tools against the approved list failed.",
            definition.name,
            exc_info=True,
        )
        raise McpConnectionError(
            "discovery_failed", reason="connection_failed", connection=definition.name
        ) from None
    return [tool for tool in exposed if tool.name in allowed]


async def _recheck(
    client: McpClient, session: ClientSession, context: Any, opened: dict[str, str]
) -> set[str]:
    """After `tools/list_changed`: this turn's tools to withhold, those no longer approved as they were."""
    now = _fingerprints(await pinned(client.definition, await _list_tools(client, session), context))
    return {name for name, fingerprint in opened.items() if now.get(name) != fingerprint}


def _fingerprints(tools: list[mcp_types.Tool]) -> dict[str, str]:
    return {tool.name: tool_fingerprint(tool_definition(tool)) for tool in tools}


def build_tools(discovered: list[Discovered]) -> list[Tool]:
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
            built = _remote_tool(item.client, remote, name)
            if built is not None:
                owners[name] = definition.name
                tools.append(built)
    return tools


def _remote_tool(client: McpClient, remote: mcp_types.Tool, name: str) -> Tool | None:
    async def execute(call: ToolCall) -> Any:
        return await client.call(remote.name, call.input, exposed=name)

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
            client.definition.name,
            exc_info=True,
        )
        return None
