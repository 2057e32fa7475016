"""A durable turn's workflow row, written and ended by the store beside its run (stores migration 0020).

The process running a durable chat turn never has DBOS execute it: DBOS only has to find the turn's
workflow (PENDING, on this process's executor) if the process dies, and hand it to a live one. So the
store writes that row in one round trip while the turn is prepared (`begin`), and the turn's close
ends it in its own transaction (`end_in_close`); `end` is for a turn whose close did not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from bastion.stores._postgres_connection import Connection, database_errors, single_value
from bastion.stores.entities import TurnContext, TurnState

if TYPE_CHECKING:
    from bastion.stores._postgres_turn_persistence import PostgresRunHost

__all__ = ["TurnWorkflowRow", "TurnWorkflowRows"]

_END: Final = "select bastion.end_turn_workflow(%s, %s, %s)"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnWorkflowRow:
    """What DBOS recovers a turn's workflow from: the executor running it (this process's), the
    application it belongs to, and the workflow's input (plain JSON data)."""

    executor_id: str
    application_version: str
    application_name: str
    input: dict[str, Any]


class TurnWorkflowRows:
    """The turn workflows' rows, written and ended as the turn's caller."""

    def __init__(self, store: PostgresRunHost) -> None:
        self._store = store

    async def begin(self, context: TurnContext, state: TurnState, row: TurnWorkflowRow) -> bool:
        """Write the workflow's row for the run, if it is still the conversation's running turn and
        this process runs it; whether it was written. One round trip."""
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute(
                    "select bastion.begin_turn_workflow(%s, %s, %s, %s, %s, %s, %s)",
                    (
                        state.conversation_id,
                        state.run_id,
                        self._store.worker_key,
                        json.dumps(row.input, separators=(",", ":")),
                        row.executor_id,
                        row.application_version,
                        row.application_name,
                    ),
                )
            return bool(single_value(await cursor.fetchone()))

    async def end(self, context: TurnContext, state: TurnState, executor_id: str) -> bool:
        """End the row this process began and nobody took over; whether there was one. One round trip."""
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute(_END, (state.conversation_id, state.run_id, executor_id))
            return bool(single_value(await cursor.fetchone()))


async def end_in_close(conn: Connection, state: TurnState) -> Any:
    """Queue, in the turn's close, the end of the workflow row of a turn this process began (its
    checkpoints name the workflow's executor); None for any other turn."""
    executor = state.checkpoints.workflow_executor if state.checkpoints is not None else None
    if executor is None:
        return None
    return await conn.execute(_END, (state.conversation_id, state.run_id, executor))
