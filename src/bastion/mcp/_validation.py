"""The checks on definitions, made before anything connects: each failed rule is a `configuration_error`.

The checks are pure functions of the configuration. Each names its rule by a stable `reason` and says
what to fix; a name that is not usable is never echoed back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias
from urllib.parse import urlsplit

from bastion.mcp._definitions import McpConnectionDefinition, McpTransport
from bastion.mcp._errors import McpConnectionError, McpErrorReason

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,128}")

Problem: TypeAlias = tuple[McpErrorReason, str]
"""A failed configuration check: its reason and what to fix."""


def validate_all(definitions: Sequence[McpConnectionDefinition[Any]]) -> None:
    """Check every definition, and the names they would expose, before anything connects."""
    if isinstance(definitions, str | bytes) or not isinstance(definitions, Sequence):
        raise McpConnectionError(
            "configuration_error",
            reason="invalid_definitions",
            connection=None,
            detail="definitions must be a list of McpConnectionDefinition.",
        )
    names: set[str] = set()
    exposed: dict[str, str] = {}
    for definition in definitions:
        if not isinstance(definition, McpConnectionDefinition):
            raise McpConnectionError(
                "configuration_error",
                reason="invalid_definitions",
                connection=None,
                detail="each definition must be an McpConnectionDefinition.",
            )
        problem = _definition_problem(definition)
        if problem is None and definition.name in names:
            problem = "duplicate_name", "the connection name is used twice."
        if problem is not None:
            reason, text = problem
            raise McpConnectionError(
                "configuration_error",
                reason=reason,
                connection=_safe_name(definition.name),
                detail=f"connection {_safe_name(definition.name)!r}: {text}",
            )
        names.add(definition.name)
        for name in _predicted_names(definition):
            if name in exposed:
                raise McpConnectionError(
                    "configuration_error",
                    reason="duplicate_tool_name",
                    connection=definition.name,
                    tool=name,
                    detail=f"the tool name {name!r} is offered by {exposed[name]!r} and {definition.name!r}.",
                )
            exposed[name] = definition.name


def transport_problem(transport: Any) -> Problem | None:
    if not isinstance(transport, McpTransport):
        return "invalid_transport", "the transport must be an McpTransport."
    if transport.type not in ("http", "sse"):
        return "invalid_transport", "the transport type must be 'http' or 'sse'."
    try:
        parts = urlsplit(transport.url) if isinstance(transport.url, str) else None
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return "invalid_transport", "the transport URL must be an http or https URL."
    return headers_problem(transport.headers)


def headers_problem(headers: Any) -> Problem | None:
    if not isinstance(headers, Mapping):
        return "invalid_headers", "headers must be a mapping of strings."
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str) or "\n" in value or "\r" in value:
            return "invalid_headers", "headers must be a mapping of strings."
    return None


def _definition_problem(definition: McpConnectionDefinition[Any]) -> Problem | None:
    if not _is_name(definition.name):
        return "invalid_name", "the name must be 1–64 letters, digits, underscores or hyphens."
    if definition.namespace is not None and not _is_name(definition.namespace):
        return "invalid_namespace", "the namespace must be 1–64 letters, digits, underscores or hyphens."
    if isinstance(definition.transport, McpTransport):
        problem = transport_problem(definition.transport)
        if problem is not None:
            return problem
    elif not callable(definition.transport):
        return (
            "invalid_transport",
            "the transport must be an McpTransport or an async function of the context.",
        )
    if definition.auth is not None and not callable(definition.auth):
        return "invalid_auth", "auth must be an async function of the context."
    if definition.failure not in ("required", "optional"):
        return "invalid_failure", "failure must be 'required' or 'optional'."
    if definition.on_error is not None and not callable(definition.on_error):
        return "invalid_on_error", "on_error must be a function."
    if not _is_positive_whole(definition.request_timeout_ms):
        return "invalid_timeout", "request_timeout_ms must be a positive whole number of milliseconds."
    if not isinstance(definition.include_instructions, bool):
        return "invalid_include_instructions", "include_instructions must be True or False."
    return _tool_names_problem(definition)


def _tool_names_problem(definition: McpConnectionDefinition[Any]) -> Problem | None:
    allowlist = definition.allowlist
    if allowlist is not None:
        if isinstance(allowlist, str) or not all(isinstance(item, str) and item for item in allowlist):
            return "invalid_allowlist", "allowlist must be a list of tool names."
        if len(set(allowlist)) != len(allowlist):
            return "invalid_allowlist", "allowlist names a tool twice."
    if not isinstance(definition.aliases, Mapping):
        return "invalid_alias", "aliases must map remote tool names to exposed names."
    for remote, alias in definition.aliases.items():
        if not isinstance(remote, str) or not _is_tool_name(alias):
            return "invalid_alias", "each alias must be 1–128 letters, digits, underscores or hyphens."
        if allowlist is not None and remote not in allowlist:
            return "alias_outside_allowlist", f"the alias for {remote!r} names a tool outside the allowlist."
    if len(set(definition.aliases.values())) != len(definition.aliases):
        return "duplicate_alias", "two remote tools share one alias."
    for name in _predicted_names(definition):
        if not _is_tool_name(name):
            return (
                "invalid_tool_name",
                f"the exposed tool name {name!r} is not 1–128 letters, digits, underscores or hyphens.",
            )
    return None


def _predicted_names(definition: McpConnectionDefinition[Any]) -> list[str]:
    """The names this definition will expose, as far as they are known before discovery."""
    aliases = list(definition.aliases.values())
    allowed = [definition.exposed_name(remote) for remote in definition.allowlist or ()]
    return list(dict.fromkeys(aliases + allowed))


def _is_positive_whole(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and float(value).is_integer() and value > 0


def _is_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def _is_tool_name(name: object) -> bool:
    return isinstance(name, str) and _TOOL_NAME.fullmatch(name) is not None


def _safe_name(name: object) -> str | None:
    return name if isinstance(name, str) and _is_name(name) else None
