"""`McpConnectionError`: stable codes and reasons, and messages naming only what the application chose."""

from __future__ import annotations

from typing import Literal, TypeAlias

from bastion.errors import ToolError

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
    "tool_withheld",
]
FAILS_EVEN_IF_OPTIONAL: frozenset[str] = frozenset({"configuration_error", "authorization_required"})
"""Codes that fail the turn even when the connection is optional: the application must act on them."""


class McpConnectionError(ToolError):
    """An MCP connection failed. The message names only the connection and the tool.

    `code` is the stable kind: `configuration_error`, `discovery_failed`, `execution_failed`
    (including the report of a result the server flagged `isError`), `authorization_required` or
    `cleanup_failed`. `reason` says which check or step failed within it (for example `timeout`,
    `tool_error`, `credential_refused`, `alias_outside_allowlist`).
    It is a `ToolError`, so when a call fails its message is what the model and the UI are shown.
    `can_authorize` says that an `authorization_required` user can be sent to sign in right away
    (an interactive OAuth connection, `bastion.mcp.oauth`, in a signed-in user's turn).
    """

    def __init__(
        self,
        code: McpErrorCode,
        *,
        reason: McpErrorReason,
        connection: str | None,
        tool: str | None = None,
        detail: str | None = None,
        can_authorize: bool = False,
    ) -> None:
        self.code: McpErrorCode = code
        self.can_authorize = can_authorize
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
        if reason == "tool_withheld":
            return f"The tool {tool} on {where} changed and waits for an administrator's approval."
        if reason == "timeout":
            return f"The tool {tool} on {where} did not answer in time."
        return f"The tool {tool} failed on {where}."
    if reason == "timeout":
        return f"{subject} did not answer in time."
    return f"{subject} is unavailable."
