"""A definition's transport and headers for one open, resolved from the turn's trusted context."""

from __future__ import annotations

import logging
from typing import Any

from bastion.credentials import ConnectionAuthorizationFailedError, ConnectionAuthorizationRequiredError
from bastion.mcp._definitions import McpConnectionDefinition, McpTransport
from bastion.mcp._errors import McpConnectionError
from bastion.mcp._validation import headers_problem, transport_problem

logger = logging.getLogger("bastion.mcp")


async def resolve_transport(definition: McpConnectionDefinition[Any], context: Any) -> McpTransport:
    """The transport to open now, with the auth headers on top; resolved afresh, so nothing is cached."""
    name = definition.name
    try:
        transport = definition.transport
        if not isinstance(transport, McpTransport):
            transport = await transport(context)
        extra = await definition.auth(context) if definition.auth is not None else {}
    except ConnectionAuthorizationRequiredError as error:
        raise McpConnectionError(
            "authorization_required",
            reason="credential_missing",
            connection=name,
            can_authorize=error.can_authorize,
        ) from None
    except ConnectionAuthorizationFailedError:
        raise McpConnectionError(
            "authorization_required", reason="credential_refused", connection=name
        ) from None
    except Exception:
        logger.warning("Resolving the transport of the %s connection failed.", name, exc_info=True)
        raise McpConnectionError("discovery_failed", reason="connection_failed", connection=name) from None
    problem = transport_problem(transport) or headers_problem(extra)
    if problem is not None:
        reason, text = problem
        raise McpConnectionError(
            "configuration_error",
            reason=reason,
            connection=name,
            detail=f"connection {name!r}: {text}",
        )
    return McpTransport(type=transport.type, url=transport.url, headers={**transport.headers, **extra})
