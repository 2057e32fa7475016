"""What an application declares: `McpConnectionDefinition`, `McpTransport`, and its `on_error` reports."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeAlias, TypeVar

from bastion.mcp._errors import McpConnectionError
from bastion.mcp.tool_pins import ToolPins

ContextT = TypeVar("ContextT")

logger = logging.getLogger("bastion.mcp")

DEFAULT_REQUEST_TIMEOUT_MS = 30_000


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
    - `tool_pins`: check every listing against the application's approved tools
      (`bastion.mcp.tool_pins`); changed and new tools are held out until approved.
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
    tool_pins: ToolPins | None = None

    @property
    def prefix(self) -> str:
        return self.namespace if self.namespace is not None else self.name

    def exposed_name(self, remote: str) -> str:
        return self.aliases.get(remote) or f"{self.prefix}__{remote}"


async def report(definition: McpConnectionDefinition[Any], error: McpConnectionError) -> None:
    """Tell the application; a failing reporter is logged and never changes the outcome."""
    if definition.on_error is None:
        return
    try:
        reported = definition.on_error(error)
        if inspect.isawaitable(reported):
            await reported
    except Exception:
        logger.warning("The on_error hook of the %s connection failed.", definition.name, exc_info=True)
