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

A user's connection can sign the user in with the server's own OAuth (`bastion.mcp.oauth.McpOAuth`,
whose `auth(name)` is the definition's `auth`), and a definition's `tool_pins` check every listing
against the tools approved for the application (`bastion.mcp.tool_pins`): changed and new tools are held
out until an administrator approves them, also after a `tools/list_changed` notification mid-turn
(`execution_failed`, reason `tool_withheld`).

Results: a call returns the server's `structuredContent` when it sent one, otherwise
`{"content": [...]}` with the MCP content items as JSON objects. A result the server flagged with
`isError` stays an ordinary result, `{"content": [...], "isError": true}` (plus `structuredContent` if
any), and is also reported to the definition's `on_error` as `execution_failed` with the reason
`tool_error`. `on_error` hears about everything that is not raised to the application directly: optional
connections left out, failed calls (which the turn shows as tool errors), `isError` results and failed
cleanups.
"""

from __future__ import annotations

from bastion._extras import missing_extra

try:
    import mcp  # noqa: F401  (the SDK the clients and the result conversion are built on)
except ImportError as error:
    raise missing_extra("bastion.mcp", "mcp", error) from error

from bastion.mcp._connections import McpConnections, create_mcp_connections
from bastion.mcp._definitions import DEFAULT_REQUEST_TIMEOUT_MS, McpConnectionDefinition, McpTransport
from bastion.mcp._errors import McpConnectionError, McpErrorCode, McpErrorReason

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
