"""Approved MCP tool lists in Postgres (migration 0012): `PostgresToolPins`, one per application.

The lists are the application's, not a user's: they are read and written only through bastion's
database functions, which only the application server's `bastion_runtime` role may execute. A turn's
check runs as that role with the user's claims, so a change records who first saw it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from mcp import types as mcp_types

from bastion.auth import Principal
from bastion.mcp.tool_pins import (
    TOOL_PIN_POLICIES,
    ToolChange,
    ToolPinPolicy,
    tool_definition,
    tool_fingerprint,
)
from bastion.stores.credentials import Pool
from bastion.stores.entities import StoreIdentity
from bastion.stores.errors import InvalidInputError
from bastion.stores.postgres import caller_transaction

__all__ = ["PostgresToolPins"]

_SET_CALLER: Final = (
    "select set_config('role', 'bastion_runtime', true), set_config('request.jwt.claims', %s, true)"
)
_CHANGE_COLUMNS: Final = (
    "id, connection, tool, kind, status, old_definition, new_definition, detected_at, detected_by::text, "
    "decided_at, decided_by"
)


class PostgresToolPins:
    """`bastion.mcp.tool_pins.ToolPins` for `application`, with its `policy` (default `"hold"`).

    `pool` connects as the application's role (member of `bastion_runtime`), or as the database owner for
    an operator's command line.
    """

    def __init__(self, pool: Pool, *, application: str, policy: ToolPinPolicy = "hold") -> None:
        if not isinstance(application, str) or not 1 <= len(application) <= 200:
            raise ValueError("An application name is 1 to 200 characters.")
        if policy not in TOOL_PIN_POLICIES:
            raise ValueError(f"A tool pin policy is 'hold', 'accept' or 'refuse', got {policy!r}.")
        self._pool = pool
        self.application = application
        self._policy = policy

    async def allowed(self, connection: str, tools: Sequence[mcp_types.Tool], *, context: Any) -> set[str]:
        offered = []
        for tool in tools:
            definition = tool_definition(tool)
            offered.append(
                {"tool": tool.name, "fingerprint": tool_fingerprint(definition), "definition": definition}
            )
        async with caller_transaction(self._pool, _SET_CALLER, (_claims(context),)) as conn:
            cursor = await conn.execute(
                "select bastion.mcp_check_tools(%s, %s, %s, %s::jsonb)",
                (self.application, connection, self._policy, json.dumps(offered)),
            )
            rows = await cursor.fetchall()
        return {row[0] for row in rows}

    async def changes(self, *, status: str | None = "pending") -> list[ToolChange]:
        """The application's changes with `status` (None: all), newest first."""
        async with caller_transaction(self._pool, _SET_CALLER, ("",)) as conn:
            cursor = await conn.execute(
                f"select {_CHANGE_COLUMNS} from bastion.mcp_tool_changes(%s, %s)", (self.application, status)
            )
            rows = await cursor.fetchall()
        return [
            ToolChange(
                id=row[0],
                connection=row[1],
                tool=row[2],
                kind=row[3],
                status=row[4],
                old_definition=row[5],
                new_definition=row[6],
                detected_at=row[7],
                detected_by=row[8],
                decided_at=row[9],
                decided_by=row[10],
            )
            for row in rows
        ]

    async def decide(self, change_id: int, *, approve: bool, by: str) -> bool:
        """Approve or refuse an open change; False when there is none with that id."""
        async with caller_transaction(self._pool, _SET_CALLER, ("",)) as conn:
            cursor = await conn.execute(
                "select bastion.mcp_decide_tool_change(%s, %s, %s, %s)",
                (self.application, change_id, approve, by),
            )
            row = await cursor.fetchone()
        return bool(row and row[0])


def _claims(context: Any) -> str:
    """The turn's user as database claims, so a change records who saw it; none for anything else."""
    if isinstance(context, Principal):
        try:
            return StoreIdentity.from_principal(context).database_claims()
        except (InvalidInputError, ValueError):
            return ""
    return ""
