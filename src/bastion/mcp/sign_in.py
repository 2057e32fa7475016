"""Signing in to an MCP connection from inside a turn: the turn pauses with a card, the callback resumes it.

`create_mcp_connections_with_sign_in` opens a signed-in user's connections like `create_mcp_connections`,
except that an interactive OAuth connection (`bastion.mcp.oauth`) the user has not connected, or must
connect again, is left out instead of failing the turn; each interactive OAuth connection adds a
`connect_<name>` tool (`connect_tool`). When the model calls it and the user is not connected, the call
pauses the way an approval does: its part carries `toolMetadata.authorization` = `{"connection", "url"}`,
the authorization URL whose `state` is bound to the user, the conversation and this call (single use,
expiring). The page shows a "Connect" card; once the callback stored the tokens, the page answers the
paused call (approved) and the continuation runs it: `{"connection", "connected": true}`, and the
connection's tools are offered from then on, since the continuation opens the connections again. A user
who cancelled or was refused answers it as denied with the reason, which the model is told; an approval
given without a finished sign-in fails the call ("was not authorized"), so the answer grants nothing.

A context that is not a `Principal` (a job, an inbox contact) never gets a card: its connections open
with `create_mcp_connections`, and a missing credential stays `authorization_required`; so does a
connection declared `interactive=False`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Final

from bastion.auth import Principal
from bastion.errors import ToolError
from bastion.mcp._connections import McpConnections, create_mcp_connections
from bastion.mcp._definitions import ContextT, McpConnectionDefinition
from bastion.mcp._errors import McpConnectionError
from bastion.mcp._oauth_errors import McpOAuthError
from bastion.mcp.oauth import McpOAuth
from bastion.tools import Tool, ToolCall

__all__ = ["CONNECT_TOOL_PREFIX", "connect_tool", "create_mcp_connections_with_sign_in"]

CONNECT_TOOL_PREFIX: Final = "connect_"


def connect_tool(oauth: McpOAuth, name: str, principal: Principal, *, conversation_id: str | None) -> Tool:
    """The tool the model calls to have the user sign in to the connection `name`; see the module."""
    oauth.connection(name)

    async def connected() -> bool:
        return (await oauth.status(principal, name)).status == "connected"

    async def sign_in(call: ToolCall) -> Mapping[str, Any] | None:
        if await connected():
            return None
        try:
            url = await oauth.start(
                principal, name, conversation_id=conversation_id, tool_call_id=call.tool_call_id
            )
        except McpOAuthError as error:  # its message names no secret and nothing the server sent
            raise ToolError(error.message) from None
        return {"connection": name, "url": url}

    async def connect(call: ToolCall) -> dict[str, Any]:
        if not await connected():
            raise ToolError(f"The {name} connection was not authorized.")
        return {"connection": name, "connected": True}

    return Tool(
        name=f"{CONNECT_TOOL_PREFIX}{name}",
        description=(
            f"Connect the user's {name} account. Call it when the request needs {name} and its tools "
            "are not offered: the user signs in, then its tools are available."
        ),
        execute=connect,
        sign_in=sign_in,
        idempotent=True,
    )


async def create_mcp_connections_with_sign_in(
    definitions: Sequence[McpConnectionDefinition[ContextT]],
    *,
    context: ContextT,
    oauth: McpOAuth,
    conversation_id: str | None,
    cancel: asyncio.Event | None = None,
) -> McpConnections:
    """`create_mcp_connections`, where a signed-in user may connect an interactive OAuth connection from the
    turn. A definition is the OAuth connection of the same name when `oauth` has one."""
    if not isinstance(context, Principal):
        return await create_mcp_connections(definitions, context=context, cancel=cancel)
    signable = [d.name for d in definitions if _offers_sign_in(oauth, d.name)]
    remaining = list(definitions)
    while True:  # at most once per connection: each round leaves out the one that asks to sign in
        try:
            connections = await create_mcp_connections(remaining, context=context, cancel=cancel)
            break
        except McpConnectionError as error:
            if not (
                error.code == "authorization_required"
                and error.can_authorize
                and error.connection in signable
                and any(d.name == error.connection for d in remaining)
            ):
                raise
            remaining = [d for d in remaining if d.name != error.connection]
    connections.tools.extend(
        connect_tool(oauth, name, context, conversation_id=conversation_id) for name in signable
    )
    return connections


def _offers_sign_in(oauth: McpOAuth, name: str) -> bool:
    try:
        return oauth.connection(name).interactive
    except McpOAuthError:
        return False
