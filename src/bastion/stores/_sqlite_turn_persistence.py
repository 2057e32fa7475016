"""Turns stored in SQLite: `SqliteAgentPersistence`, the turn protocol over the store's one connection.

Because reconciliation runs between two transactions, a turn is claimed optimistically: the second
transaction writes only if the conversation still has the revision the first one read, and every
change to a conversation's history bumps its revision. Of simultaneous turns exactly one proceeds,
as with Postgres's row lock. Messages, runs, events and tool executions change only through this
protocol.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from bastion.approvals import CanRespondToApproval
from bastion.persistence import AgentRunInactiveError, RunInput, RunOutcome, RunStart, ToolOperation
from bastion.stores._leases import DEFAULT_LEASE_SECONDS, LeaseKeeper
from bastion.stores._sqlite_statements import (
    ACTIVE_RUN,
    APPEND_MESSAGE,
    CLAIM_CONVERSATION,
    CLAIM_TOOL,
    CONVERSATION_EXISTS,
    EXISTING_TOOL,
    FIRST_NAMED_SEQ,
    INSERT_EVENT,
    INSERT_RUN,
    INTERRUPT_RUN,
    LAST_MESSAGE,
    LAST_SEQ,
    RECLAIM_TOOL,
    RELEASE_CONVERSATION,
    RENEW_LEASE,
    REPLACE_MESSAGE,
    REQUEST_SEEN,
    SETTLE_RUN,
    SETTLE_TOOL,
    TAIL,
    TRUNCATE,
    TURN_CONVERSATION,
    microseconds_now,
    scope,
)
from bastion.stores._turn_persistence import (
    CheckedOperation,
    TurnPersistence,
    approval_request_events,
    approval_response_events,
    browser_message_ids,
    canonical_json,
    check_response,
    pending_approval_ids,
    plan_history_writes,
    run_event,
    run_status,
)
from bastion.stores.entities import TurnContext, TurnState
from bastion.stores.errors import (
    ConversationBusyError,
    InvalidInputError,
    NotFoundError,
    StoreError,
    ToolOperationConflictError,
    ToolOperationMismatchError,
    ToolOperationUncertainError,
    TurnConflictError,
)

T = TypeVar("T")


class SqliteRunHost(Protocol):
    """What `SqliteAgentPersistence` needs of its store (`SqliteStore` is one): transactions on its
    connection's thread, the worker key it names itself with, and the leases it renews."""

    @property
    def worker_key(self) -> int: ...

    @property
    def leases(self) -> LeaseKeeper: ...

    async def run_in_transaction(self, work: Callable[[sqlite3.Connection], T], *, write: bool) -> T: ...


__all__ = ["LIVE_WORKERS", "SqliteAgentPersistence"]

_FINISH_STATUSES: Final = frozenset({"completed", "failed", "cancelled", "waiting_for_approval"})

# The workers (store instances) alive in this process. A SQLite file serves one process, so a run
# recorded by any other worker belongs to a process that has ended: nothing can still be running it.
LIVE_WORKERS: set[int] = set()


class SqliteAgentPersistence(TurnPersistence):
    """Turns stored in SQLite: claims with revisions and leases, exactly-once tool operations, events.

    - `start_run`: read the conversation's stored tail (a turn in progress, a stale revision or a
      repeated request id is a conflict), reconcile the browser's messages outside any transaction,
      then claim the turn and write what changed in one transaction that first checks the revision
      is still the one read. The model gets the last `history_window` messages.
    - `execute_tool`: claim the call before its side effect; the results of this run's earlier calls
      are recorded in the same transaction (or by `finish_run`).
    - `finish_run`: fenced by run id and idempotent; appends (or replaces, when continuing it) only
      the response message and releases the claim.

    A run holds its claim for `lease_seconds` (30 s by default), renewed while this store runs it;
    a newer turn replaces a run whose lease expired, or whose store is not open in this process
    any more, and records it as interrupted. A conversation a live turn holds is refused with
    `ConversationBusyError`, which carries `Retry-After`.
    """

    def __init__(
        self,
        store: SqliteRunHost,
        *,
        history_window: int = 100,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        can_respond_to_approval: CanRespondToApproval[TurnContext] | None = None,
    ) -> None:
        super().__init__(
            history_window=history_window,
            lease_seconds=lease_seconds,
            can_respond_to_approval=can_respond_to_approval,
        )
        self._store = store
        self._lease_us = round(self._lease_seconds * 1_000_000)

    async def start_run(self, context: TurnContext, input: RunInput) -> RunStart[TurnState]:
        params = scope(context.identity, context.conversation_id) | {"request": context.request_id}
        ids = json.dumps(browser_message_ids(input.messages))
        revision, last_seq, tail = await self._store.run_in_transaction(
            lambda conn: self._load_turn(conn, context, params, ids), write=False
        )
        history = await self._reconcile([message for _, message in tail], input, context)
        plan = plan_history_writes(tail, history, last_seq=last_seq)
        run_id = str(uuid.uuid4())
        events = [run_event(run_id, "started"), *approval_response_events(tail, history)]

        def claim(conn: sqlite3.Connection) -> None:
            now = microseconds_now()
            at = params | {"run": run_id, "now": now}
            _require_claimable(conn, at, revision=revision, now=now)
            conn.execute(INSERT_RUN, at | {"lease": now + self._lease_us, "worker": self._store.worker_key})
            if plan.truncate_after is not None:
                conn.execute(TRUNCATE, at | {"after": plan.truncate_after})
            for write in plan.writes:
                _write_history(conn, at, write)
            _insert_events(conn, at, events)
            conn.execute(CLAIM_CONVERSATION, at)

        await self._store.run_in_transaction(lambda conn: _conflicts(conn, claim), write=True)
        self._store.leases.hold(run_id, self._lease_seconds)
        state = TurnState(
            conversation_id=context.conversation_id,
            run_id=run_id,
            revision=revision + 1,
            pending_approval_ids=pending_approval_ids(history),
        )
        return RunStart(messages=history[-self._window :], state=state, operation_scope=run_id)

    def _load_turn(
        self, conn: sqlite3.Connection, context: TurnContext, params: dict[str, Any], ids: str
    ) -> tuple[int, int, list[tuple[int, dict[str, Any]]]]:
        """What reconciliation needs: the stored messages from the earliest one the browser names,
        and at least the last `history_window`; refuses a turn that could not be claimed anyway."""
        row = conn.execute(TURN_CONVERSATION, params).fetchone()
        if row is None:
            raise NotFoundError()
        revision, active_run = row
        stale = context.expected_revision is not None and context.expected_revision != revision
        now = microseconds_now()
        lease = _running(conn, params, active_run)
        if lease is not None and lease > now:
            raise ConversationBusyError((lease - now) / 1_000_000)
        if stale or _request_seen(conn, params):
            raise TurnConflictError()
        last_seq = conn.execute(LAST_SEQ, params).fetchone()[0]
        named = conn.execute(FIRST_NAMED_SEQ, params | {"ids": ids}).fetchone()[0]
        start = min(last_seq + 1 if named is None else named, last_seq - self._window + 1)
        tail = conn.execute(TAIL, params | {"from": start}).fetchall()
        return revision, last_seq, [(seq, json.loads(message)) for seq, message in tail]

    async def execute_tool(self, context: TurnContext, state: TurnState, operation: ToolOperation) -> Any:
        checked = self._checked_operation(state, operation)
        replayed, output = self._replayed(state, checked)
        if replayed:
            return output
        results = list(state.unrecorded_results)
        params = scope(context.identity, state.conversation_id) | {
            "run": state.run_id,
            "key": checked.key,
            "call": checked.call_id,
            "name": checked.name,
            "input": canonical_json(checked.input),
        }
        state.running_tool_calls.add(checked.key)
        claimed = False
        try:
            outcome, output = await self._store.run_in_transaction(
                lambda conn: self._claim_tool(conn, params, checked, results), write=True
            )
            del state.unrecorded_results[: len(results)]
            if outcome == "completed":
                return output
            if outcome == "in_flight":
                raise ToolOperationConflictError()
            if outcome == "mismatch":
                raise ToolOperationMismatchError()
            if outcome != "claimed":
                raise ToolOperationUncertainError()
            claimed = True
            return await self._execute(state, operation, checked)
        finally:
            if not claimed:
                state.running_tool_calls.discard(checked.key)

    def _claim_tool(
        self,
        conn: sqlite3.Connection,
        params: dict[str, Any],
        checked: CheckedOperation,
        results: list[dict[str, Any]],
    ) -> tuple[str, Any]:
        """Record this run's earlier results and claim the operation: the outcome and any stored output."""
        now = microseconds_now()
        at = params | {"now": now}
        if conn.execute(CONVERSATION_EXISTS, at).fetchone() is None:
            raise NotFoundError()
        if not _is_active(conn, at):
            raise AgentRunInactiveError()
        _record_tool_results(conn, at, results)
        conn.execute(RENEW_LEASE, at | {"lease": now + self._lease_us})
        started = [_tool_event("tool.started", checked.call_id, checked.name)]
        if conn.execute(CLAIM_TOOL, at).rowcount == 1:
            _insert_events(conn, at, started)
            return "claimed", None
        name, stored_input, status, output, run_status, lease, worker = conn.execute(
            EXISTING_TOOL, at
        ).fetchone()
        if name != checked.name or stored_input != params["input"]:
            return "mismatch", None
        if status == "completed":
            return "completed", json.loads(output)
        if status == "in_flight" and run_status == "running" and _holds(lease, worker, now):
            return "in_flight", None
        if checked.idempotent:
            conn.execute(RECLAIM_TOOL, at)
            _insert_events(conn, at, started)
            return "claimed", None
        return "uncertain", None

    async def finish_run(self, context: TurnContext, state: TurnState, outcome: RunOutcome) -> None:
        message = outcome.response_message
        if message is not None:
            check_response(message)
        status = run_status(outcome.status, message)
        if status not in _FINISH_STATUSES:
            raise InvalidInputError()
        events = [
            *approval_request_events(message, known=state.pending_approval_ids),
            run_event(state.run_id, status, message),
        ]
        results = list(state.unrecorded_results)
        params = scope(context.identity, state.conversation_id) | {"run": state.run_id, "status": status}
        self._store.leases.release(state.run_id)

        def finish(conn: sqlite3.Connection) -> None:
            at = params | {"now": microseconds_now()}
            if conn.execute(CONVERSATION_EXISTS, at).fetchone() is None:
                return
            _record_tool_results(conn, at, results)
            if not _is_active(conn, at):
                return
            if message is not None:
                _save_response(conn, at, message)
            conn.execute(SETTLE_RUN, at)
            _insert_events(conn, at, events)
            conn.execute(RELEASE_CONVERSATION, at)

        await self._store.run_in_transaction(lambda conn: _conflicts(conn, finish), write=True)
        del state.unrecorded_results[: len(results)]


# The store's thread: everything below runs inside a transaction.


def _conflicts(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], None]) -> None:
    """A unique key hit by a race (a message id written twice) is a conflict, as in Postgres."""
    try:
        work(conn)
    except sqlite3.IntegrityError as error:
        raise TurnConflictError() from error


def _running(conn: sqlite3.Connection, params: dict[str, Any], active_run: str | None) -> int | None:
    """When the conversation's active run is still running, the end of its lease (0 when its
    worker is gone: it is not running any more); else `None`."""
    if active_run is None:
        return None
    row = conn.execute(ACTIVE_RUN, params | {"run": active_run}).fetchone()
    if row is None or row[1] != "running":
        return None
    _, _, lease, worker = row
    return lease if worker is None or worker in LIVE_WORKERS else 0


def _holds(lease: int, worker: int | None, now: int) -> bool:
    """Whether a running run still holds what it claimed: within its lease and its worker alive."""
    return lease > now and (worker is None or worker in LIVE_WORKERS)


def _request_seen(conn: sqlite3.Connection, params: dict[str, Any]) -> bool:
    return conn.execute(REQUEST_SEEN, params).fetchone() is not None


def _require_claimable(conn: sqlite3.Connection, params: dict[str, Any], *, revision: int, now: int) -> None:
    """The conversation is unchanged since it was read and free, else a conflict; a run whose lease
    expired is replaced and recorded as interrupted."""
    row = conn.execute(TURN_CONVERSATION, params).fetchone()
    if row is None:
        raise NotFoundError()
    current, active_run = row
    if current != revision or _request_seen(conn, params):
        raise TurnConflictError()
    active = _running(conn, params, active_run)
    if active is None:
        return
    if active > now:
        raise ConversationBusyError((active - now) / 1_000_000)
    conn.execute(INTERRUPT_RUN, params | {"run": active_run})
    _insert_events(conn, params | {"run": active_run}, [run_event(active_run, "interrupted")])


def _is_active(conn: sqlite3.Connection, params: dict[str, Any]) -> bool:
    """The run is still running and still the conversation's active run (not replaced, not finished)."""
    row = conn.execute(TURN_CONVERSATION, params).fetchone()
    if row is None or row[1] != params["run"]:
        return False
    run = conn.execute(ACTIVE_RUN, params).fetchone()
    return run is not None and run[1] == "running"


def _write_history(conn: sqlite3.Connection, params: dict[str, Any], write: dict[str, Any]) -> None:
    """Apply one planned row: a replaced row keeps its id and role; an added row is a user message."""
    message = write["message"]
    values = params | {
        "seq": write["seq"],
        "message_id": message.get("id"),
        "role": message.get("role"),
        "message": json.dumps(message, separators=(",", ":")),
    }
    if write["replace"]:
        if conn.execute(REPLACE_MESSAGE, values).rowcount != 1:
            raise StoreError()
    elif message.get("role") != "user":
        raise StoreError()
    else:
        conn.execute(APPEND_MESSAGE, values)


def _save_response(conn: sqlite3.Connection, params: dict[str, Any], message: dict[str, Any]) -> None:
    """Append the response, or replace the latest message when the response continues it."""
    last = conn.execute(LAST_MESSAGE, params).fetchone()
    values = params | {
        "message_id": message["id"],
        "role": "assistant",
        "message": json.dumps(message, separators=(",", ":")),
    }
    if last is not None and last[1] == message["id"]:
        if last[2] != "assistant":
            raise StoreError()
        conn.execute(REPLACE_MESSAGE, values | {"seq": last[0]})
    else:
        conn.execute(APPEND_MESSAGE, values | {"seq": (last[0] if last is not None else 0) + 1})


def _record_tool_results(
    conn: sqlite3.Connection, params: dict[str, Any], results: list[dict[str, Any]]
) -> None:
    """Settle tool calls this run claimed and ran; each settles once, with its own event."""
    for result in results:
        status = result["status"]
        values = params | {
            "key": result["operationKey"],
            "status": status,
            "output": json.dumps(result["output"]) if status == "completed" else None,
        }
        row = conn.execute(SETTLE_TOOL, values).fetchone()
        if row is not None:
            kind = "tool.completed" if status == "completed" else "tool.failed"
            _insert_events(conn, values, [_tool_event(kind, row[1], row[0])])


def _insert_events(conn: sqlite3.Connection, params: dict[str, Any], events: list[dict[str, Any]]) -> None:
    conn.executemany(
        INSERT_EVENT,
        [params | {"type": event["type"], "data": json.dumps(event.get("data", {}))} for event in events],
    )


def _tool_event(kind: str, call_id: str, name: str) -> dict[str, Any]:
    return {"type": kind, "data": {"toolCallId": call_id, "toolName": name}}
