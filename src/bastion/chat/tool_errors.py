"""A turn whose tools could not be opened is the request's refusal, in the tool source's own words.

An agent's tools may come from a factory that opens connections for the caller (`create_mcp_connections`
in a `tools=` factory). When that fails before the turn streams, the client gets a clear answer with a
stable code instead of an internal error: 403 `authorization_required` when the caller must connect
first, else 502 `tools_unavailable`. The message is the `ToolError`'s, which a tool source writes to
be shown (it names the connection, never a secret or what the server said).
"""

from __future__ import annotations

from typing import ClassVar

from bastion.errors import BastionError, ToolError

__all__ = ["ToolsNeedAuthorizationError", "ToolsUnavailableError", "tools_refusal"]


class ToolsUnavailableError(BastionError):
    """The turn's tools could not be opened (a connection failed); nothing ran."""

    code: ClassVar[str] = "tools_unavailable"
    status: ClassVar[int] = 502


class ToolsNeedAuthorizationError(ToolsUnavailableError):
    """A connection the turn needs has no usable credential for the caller: connect it, then retry."""

    code: ClassVar[str] = "authorization_required"
    status: ClassVar[int] = 403


def tools_refusal(error: BaseException) -> BastionError | None:
    """The client's answer for `error` raised while the turn's tools were opened, if it is a tool
    source's failure (a `ToolError` the application did not already turn into an answer)."""
    if not isinstance(error, ToolError) or isinstance(error, BastionError):
        return None
    if getattr(error, "code", None) == "authorization_required":
        return ToolsNeedAuthorizationError(error.message)
    return ToolsUnavailableError(error.message)
