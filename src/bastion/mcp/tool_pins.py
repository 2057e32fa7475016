"""Approved tool lists for MCP connections (the rug-pull protection): `ToolPins`, its policies, fingerprints.

A tool's description and schema are instructions to the model, so a server that changes them after a
connection was approved changes what the agent does. With `McpConnectionDefinition.tool_pins`, every
listing is checked against what was approved for the application: the first listing is recorded as
approved; later, a changed or new tool is held out of the agent's tools (and recorded, with its old and
new definition, for an administrator to approve or refuse), and a removed tool is gone at once.

The policy (`ToolPinPolicy`) says what a difference does: `"hold"` (the default) holds the changed and new
tools until approved, `"accept"` records the change and uses the new tools, `"refuse"` offers none of the
connection's tools while anything differs.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias

from mcp import types as mcp_types

__all__ = [
    "ToolChange",
    "ToolPinPolicy",
    "ToolPinReview",
    "ToolPins",
    "change_diff",
    "changes_report",
    "tool_definition",
    "tool_fingerprint",
]

ToolPinPolicy: TypeAlias = Literal["hold", "accept", "refuse"]
TOOL_PIN_POLICIES: frozenset[str] = frozenset({"hold", "accept", "refuse"})


class ToolPins(Protocol):
    """Where approved tool lists live. `allowed` records what changed and returns the names to offer."""

    async def allowed(
        self, connection: str, tools: Sequence[mcp_types.Tool], *, context: Any
    ) -> set[str]: ...


class ToolPinReview(Protocol):
    """An administrator's side of the approved lists: the recorded changes, and deciding them."""

    async def changes(self, *, status: str | None = "pending") -> list[ToolChange]: ...

    async def decide(self, change_id: int, *, approve: bool, by: str) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class ToolChange:
    """A difference between a listing and the approved list, and what became of it."""

    id: int
    connection: str
    tool: str
    kind: Literal["added", "changed", "removed"]
    status: Literal["pending", "approved", "refused", "accepted"]
    old_definition: Mapping[str, Any] | None = field(repr=False)
    new_definition: Mapping[str, Any] | None = field(repr=False)
    detected_at: datetime
    detected_by: str | None
    decided_at: datetime | None
    decided_by: str | None


def tool_definition(tool: mcp_types.Tool) -> dict[str, Any]:
    """What is pinned of a tool: everything the model is shown or that changes how it is called."""
    annotations = tool.annotations.model_dump(mode="json", exclude_none=True) if tool.annotations else None
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "annotations": annotations,
    }


def tool_fingerprint(definition: Mapping[str, Any]) -> str:
    """SHA-256 of the definition's canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def change_diff(change: ToolChange) -> str:
    """The change as a unified diff of the two definitions' indented JSON, for an administrator to read."""
    before = _lines(change.old_definition)
    after = _lines(change.new_definition)
    label = f"{change.connection}/{change.tool}"
    return "".join(difflib.unified_diff(before, after, f"approved {label}", f"offered {label}"))


def changes_report(changes: Sequence[ToolChange]) -> list[str]:
    """Changes as text for an operator: one heading line each, then its diff."""
    if not changes:
        return ["No tool changes."]
    lines: list[str] = []
    for change in changes:
        seen = f" by {change.detected_by}" if change.detected_by else ""
        decided = f", {change.status} by {change.decided_by}" if change.decided_by else ""
        lines.append(
            f"#{change.id} {change.connection}/{change.tool}: {change.kind}, {change.status}"
            f" (seen {change.detected_at:%Y-%m-%d %H:%M:%S}{seen}{decided})"
        )
        lines.extend(line.rstrip("\n") for line in change_diff(change).splitlines())
    return lines


def _lines(definition: Mapping[str, Any] | None) -> list[str]:
    if definition is None:
        return []
    return [line + "\n" for line in json.dumps(definition, indent=2, sort_keys=True).splitlines()]
