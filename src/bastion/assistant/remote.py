"""The assistant's optional MCP connection: one server, an allowlist of its tools, the app's credential.

Remote tools are exposed as `mcp__<tool>` and each needs the user's approval, since the assistant cannot
know what a remote tool changes. The connection is opened per turn and closed with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar

from bastion import AgentTools
from bastion.assistant.config import AssistantConfig
from bastion.auth import Principal
from bastion.errors import BastionError
from bastion.mcp import McpConnectionDefinition, McpConnectionError, McpTransport, create_mcp_connections

__all__ = ["ConnectionFailedError", "ConnectionNeedsAuthorizationError", "remote_tool_names", "remote_tools"]

CONNECTION_NAME = "mcp"


class ConnectionNeedsAuthorizationError(BastionError):
    """The MCP server refused the assistant's credential; an operator has to renew it."""

    code: ClassVar[str] = "authorization_required"
    status: ClassVar[int] = 403


class ConnectionFailedError(BastionError):
    """The MCP server could not be reached or answered wrongly."""

    code: ClassVar[str] = "connection_failed"
    status: ClassVar[int] = 502


def remote_tool_names(config: AssistantConfig) -> tuple[str, ...]:
    return tuple(f"{CONNECTION_NAME}__{name}" for name in config.mcp_tools) if config.mcp_url else ()


def remote_tools(
    config: AssistantConfig,
) -> Callable[[Principal], Callable[[], Awaitable[AgentTools]]] | None:
    """A per-turn opener of the configured MCP server, or None when none is configured."""
    if config.mcp_url is None:
        return None
    headers = {"Authorization": f"Bearer {config.mcp_token}"} if config.mcp_token else {}
    definition: McpConnectionDefinition[Principal] = McpConnectionDefinition(
        name=CONNECTION_NAME,
        transport=McpTransport(
            type="sse" if config.mcp_transport == "sse" else "http", url=config.mcp_url, headers=headers
        ),
        allowlist=list(config.mcp_tools),
    )

    def for_user(principal: Principal) -> Callable[[], Awaitable[AgentTools]]:
        async def open_tools() -> AgentTools:
            try:
                connections = await create_mcp_connections([definition], context=principal)
            except McpConnectionError as error:
                raise _client_error(error) from None
            return AgentTools(
                tools=connections.tools, close=connections.close, instructions=connections.instructions
            )

        return open_tools

    return for_user


def _client_error(error: McpConnectionError) -> BastionError:
    if error.code in ("authorization_required", "authorization_failed"):
        return ConnectionNeedsAuthorizationError(str(error))
    return ConnectionFailedError(str(error))
