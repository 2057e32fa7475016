"""The SQLite store: the Postgres store's contract for one process and no server, rules in the queries.

SQLite has no roles and no row-level security, so the rules the database enforces for Postgres are
enforced here by the statements themselves: every statement names the caller's owner id and tenant
(`tenant_id is ?`, so a caller without a tenant sees only rows without one), a missing and a foreign
conversation give the same `NotFoundError`, and messages, runs, events and tool executions change only
through the turn protocol of `SqliteAgentPersistence`.

All database work runs on one dedicated thread that owns the only connection (a single-worker
executor is the queue). SQLite admits one writer at a time anyway; serializing the process's
transactions on one connection means none of them waits on a file lock or fails to upgrade a read
lock to a write lock, each runs from `begin` to `commit` without interleaving, and no Python callback
(reconciliation, an approval policy, a tool) ever runs while a transaction is open. `asyncio.to_thread`
would spread transactions over a pool of threads and connections that contend for the same lock.

Because reconciliation runs between two transactions, a turn is claimed optimistically: the second
transaction writes only if the conversation still has the revision the first one read, and every
change to a conversation's history bumps its revision. Of simultaneous turns exactly one proceeds,
as with Postgres's row lock.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from importlib import resources
from types import TracebackType
from typing import Any, Final, Self, TypeVar

from bastion.approvals import CanRespondToApproval
from bastion.persistence import (
    AgentRunInactiveError,
    RunInput,
    RunOutcome,
    RunStart,
    ToolOperation,
)
from bastion.stores._conversation_queries import (
    conversation_from_row,
    new_conversation_values,
    sqlite_insert,
    sqlite_list,
    sqlite_select,
)
from bastion.stores._leases import DEFAULT_LEASE_SECONDS, LeaseKeeper, new_worker_key
from bastion.stores._migrations import Migration, MigrationChangedError, check_component
from bastion.stores._turns import (
    CheckedOperation,
    TurnPersistence,
    approval_request_events,
    approval_response_events,
    browser_message_ids,
    canonical_json,
    check_response,
    check_title,
    pending_approval_ids,
    plan_history_writes,
    run_event,
    run_status,
)
from bastion.stores.entities import (
    MAX_COMMENT,
    Conversation,
    Feedback,
    Rating,
    RunEvent,
    StoredMessage,
    StoreIdentity,
    TurnContext,
    TurnState,
    check_cursor,
    check_limit,
    check_text,
    parse_uuid,
)
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
from bastion.stores.filters import ConversationFilter
from bastion.stores.schema import ConversationSchema

__all__ = ["SqliteAgentPersistence", "SqliteStore"]

T = TypeVar("T")
Work = Callable[[sqlite3.Connection], T]

_MIGRATION_FILE: Final = "sqlite_migrations"
_RATINGS: Final = frozenset({"up", "down"})
_FINISH_STATUSES: Final = frozenset({"completed", "failed", "cancelled", "waiting_for_approval"})
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# Named statements. `:owner` and `:tenant` are the caller's; every statement touching a row filters
# on them, so a foreign row is invisible exactly like a missing one.
_OWNED: Final = "owner_id = :owner and tenant_id is :tenant"

_DELETE_CONVERSATION: Final = f"delete from bastion_conversations where id = :id and {_OWNED} returning id"
_CONVERSATION_EXISTS: Final = f"select 1 from bastion_conversations where id = :id and {_OWNED}"
_LIST_MESSAGES: Final = (
    "select seq, id, role, message, created_at from bastion_messages "
    f"where conversation_id = :id and {_OWNED} and seq > :after order by seq limit :limit"
)
_UPSERT_FEEDBACK: Final = (
    "insert into bastion_feedback "
    "(conversation_id, message_id, owner_id, tenant_id, rating, comment, created_at, updated_at) "
    "select m.conversation_id, m.id, m.owner_id, m.tenant_id, :rating, :comment, :now, :now "
    "from bastion_messages m where m.conversation_id = :id and m.id = :message "
    "and m.owner_id = :owner and m.tenant_id is :tenant "
    "on conflict (conversation_id, message_id, owner_id) do update "
    "set rating = excluded.rating, comment = excluded.comment, updated_at = excluded.updated_at "
    "returning conversation_id, message_id, rating, comment, updated_at"
)
_LIST_EVENTS: Final = (
    "select id, run_id, type, data, created_at from bastion_run_events "
    f"where conversation_id = :id and {_OWNED} and id > :after order by id limit :limit"
)

# The turn protocol.
_TURN_CONVERSATION: Final = (
    f"select revision, active_run_id from bastion_conversations where id = :id and {_OWNED}"
)
_ACTIVE_RUN: Final = (
    "select id, status, lease_expires_at, worker_key from bastion_runs "
    f"where id = :run and conversation_id = :id and {_OWNED}"
)
_REQUEST_SEEN: Final = (
    f"select 1 from bastion_runs where conversation_id = :id and {_OWNED} and request_id = :request"
)
_LAST_SEQ: Final = (
    f"select coalesce(max(seq), 0) from bastion_messages where conversation_id = :id and {_OWNED}"
)
_FIRST_NAMED_SEQ: Final = (
    f"select min(seq) from bastion_messages where conversation_id = :id and {_OWNED} "
    "and id in (select value from json_each(:ids))"
)
_TAIL: Final = (
    "select seq, message from bastion_messages "
    f"where conversation_id = :id and {_OWNED} and seq >= :from order by seq"
)
_INTERRUPT_RUN: Final = (
    f"update bastion_runs set status = 'interrupted', finished_at = :now where id = :run and {_OWNED}"
)
_INSERT_RUN: Final = (
    "insert into bastion_runs (id, conversation_id, owner_id, tenant_id, request_id, status, "
    "lease_expires_at, started_at, worker_key) "
    "values (:run, :id, :owner, :tenant, :request, 'running', :lease, :now, :worker)"
)
_TRUNCATE: Final = f"delete from bastion_messages where conversation_id = :id and {_OWNED} and seq > :after"
_REPLACE_MESSAGE: Final = (
    "update bastion_messages set message = :message "
    f"where conversation_id = :id and {_OWNED} and seq = :seq and id = :message_id and role = :role"
)
_APPEND_MESSAGE: Final = (
    "insert into bastion_messages (conversation_id, owner_id, tenant_id, seq, id, role, message, created_at) "
    "values (:id, :owner, :tenant, :seq, :message_id, :role, :message, :now)"
)
_LAST_MESSAGE: Final = (
    "select seq, id, role from bastion_messages "
    f"where conversation_id = :id and {_OWNED} order by seq desc limit 1"
)
_INSERT_EVENT: Final = (
    "insert into bastion_run_events (conversation_id, run_id, owner_id, tenant_id, type, data, created_at) "
    "values (:id, :run, :owner, :tenant, :type, :data, :now)"
)
_CLAIM_CONVERSATION: Final = (
    "update bastion_conversations set revision = revision + 1, active_run_id = :run, updated_at = :now "
    f"where id = :id and {_OWNED}"
)
_RELEASE_CONVERSATION: Final = (
    "update bastion_conversations set revision = revision + 1, active_run_id = null, updated_at = :now "
    f"where id = :id and {_OWNED}"
)
_RENEW_LEASE: Final = f"update bastion_runs set lease_expires_at = :lease where id = :run and {_OWNED}"
_RENEW_WORKER_LEASES: Final = (
    "update bastion_runs set lease_expires_at = :lease "
    "where id in (select value from json_each(:runs)) and worker_key = :worker and status = 'running'"
)
_SETTLE_RUN: Final = (
    f"update bastion_runs set status = :status, finished_at = :now where id = :run and {_OWNED}"
)
_CLAIM_TOOL: Final = (
    "insert into bastion_tool_executions (conversation_id, operation_key, tool_call_id, run_id, owner_id, "
    "tenant_id, tool_name, input, status, started_at) "
    "values (:id, :key, :call, :run, :owner, :tenant, :name, :input, 'in_flight', :now) "
    "on conflict (conversation_id, operation_key) do nothing"
)
_EXISTING_TOOL: Final = (
    "select t.tool_name, t.input, t.status, t.output, r.status, r.lease_expires_at, r.worker_key "
    "from bastion_tool_executions t join bastion_runs r on r.id = t.run_id "
    "where t.conversation_id = :id and t.operation_key = :key "
    "and t.owner_id = :owner and t.tenant_id is :tenant"
)
_RECLAIM_TOOL: Final = (
    "update bastion_tool_executions set run_id = :run, tool_call_id = :call, status = 'in_flight', "
    "output = null, started_at = :now, finished_at = null "
    f"where conversation_id = :id and operation_key = :key and {_OWNED}"
)
_SETTLE_TOOL: Final = (
    "update bastion_tool_executions set status = :status, output = :output, finished_at = :now "
    f"where conversation_id = :id and operation_key = :key and run_id = :run and {_OWNED} "
    "and status = 'in_flight' returning tool_name, tool_call_id"
)

# The workers (store instances) alive in this process. A SQLite file serves one process, so a run
# recorded by any other worker belongs to a process that has ended: nothing can still be running it.
_LIVE_WORKERS: set[int] = set()


class SqliteStore:
    """Conversations and turns in one SQLite file, for one process; the same API as `PostgresStore`.

    Open with `SqliteStore.open(path)` (a file path, or `":memory:"`), then `migrate()`. Use one
    store per file per process: rules are enforced by this store's statements, not by the database.
    Because of that, a run left `running` by a store that is no longer open in this process (a
    process that died, then started again) is released as soon as a claim meets it.
    """

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        connection: sqlite3.Connection,
        *,
        schema: ConversationSchema[Any] | None = None,
    ) -> None:
        self._executor = executor
        self._connection = connection
        self._closed = False
        self.worker_key: Final = new_worker_key()
        _LIVE_WORKERS.add(self.worker_key)
        self._leases = LeaseKeeper(self._renew_leases)
        self.schema: Final = schema or ConversationSchema()

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, schema: ConversationSchema[Any] | None = None
    ) -> SqliteStore:
        """A store over the database file at `path`, created if absent; `schema` as for `PostgresStore`."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bastion-sqlite")
        try:
            connection = await asyncio.get_running_loop().run_in_executor(executor, _connect, os.fspath(path))
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(executor, connection, schema=schema)

    async def close(self) -> None:
        """Close the connection after the work already queued; later calls raise `RuntimeError`."""
        if self._closed:
            return
        await self._leases.close()
        self._closed = True
        _LIVE_WORKERS.discard(self.worker_key)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._connection.close)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def migrate(self, *, upto: int | None = None) -> list[int]:
        """Apply pending migrations (up to version `upto`) in one transaction; return their versions."""
        migrations = [m for m in available_sqlite_migrations() if upto is None or m.version <= upto]
        return await self._run(lambda conn: _apply_migrations(conn, migrations), write=True)

    async def migrate_application(self, *, component: str, migrations: Sequence[Migration]) -> list[int]:
        """Apply an application's own migrations after bastion's, recorded under `component`, in one
        transaction, as `apply_application_migrations` does for Postgres."""
        check_component(component)
        return await self._run(
            lambda conn: _apply_migrations(conn, migrations, component=component), write=True
        )

    async def _renew_leases(self, run_ids: list[str], lease_seconds: float) -> None:
        params = {
            "runs": json.dumps(run_ids),
            "worker": self.worker_key,
            "lease": _now() + round(lease_seconds * 1_000_000),
        }
        await self._run(lambda conn: conn.execute(_RENEW_WORKER_LEASES, params), write=True)

    def persistence(
        self,
        *,
        history_window: int = 100,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        can_respond_to_approval: CanRespondToApproval[TurnContext] | None = None,
    ) -> SqliteAgentPersistence:
        """The `AgentPersistence` of this store; see `SqliteAgentPersistence`."""
        return SqliteAgentPersistence(
            self,
            history_window=history_window,
            lease_seconds=lease_seconds,
            can_respond_to_approval=can_respond_to_approval,
        )

    async def _run(self, work: Work[T], *, write: bool) -> T:
        """Run `work` as one transaction on the store's thread; any exception rolls it back."""
        if self._closed:
            raise RuntimeError("This SqliteStore is closed.")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _transaction, self._connection, work, write)

    # Entity API: user-scoped, tenant-scoped under a tenant; the owner comes from the identity only.

    async def create_conversation(
        self,
        identity: StoreIdentity,
        *,
        title: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        state: object = None,
        columns: Mapping[str, object] | None = None,
    ) -> Conversation[Any]:
        """A new conversation owned by `identity` (and its tenant); the owner is never an input.

        `agent_name`, `state` (validated by the schema) and registered `columns` are the application's.
        """
        values = new_conversation_values(
            self.schema, title=title, agent_name=agent_name, state=state, columns=columns
        )
        chosen = parse_uuid(conversation_id) if conversation_id is not None else str(uuid.uuid4())
        params = _scope(identity, chosen) | values | {"now": _now()}
        statement = sqlite_insert(self.schema, values)
        try:
            row = await self._run(lambda conn: conn.execute(statement, params).fetchone(), write=True)
        except sqlite3.IntegrityError:
            raise InvalidInputError() from None
        return self._conversation(row)

    async def list_conversations(
        self, identity: StoreIdentity, *, limit: int = 50, filter: ConversationFilter | None = None
    ) -> list[Conversation[Any]]:
        """The caller's conversations, most recently active first, narrowed by `filter`."""
        check_limit(limit)
        where = (filter or ConversationFilter()).checked(self.schema.columns)
        statement, values = sqlite_list(self.schema, where)
        params = _scope(identity) | values | {"limit": limit}
        rows = await self._run(lambda conn: conn.execute(statement, params).fetchall(), write=False)
        return [self._conversation(row) for row in rows]

    async def get_conversation(self, identity: StoreIdentity, conversation_id: str) -> Conversation[Any]:
        params = _scope(identity, parse_uuid(conversation_id))
        statement = (
            f"select {sqlite_select(self.schema)} from bastion_conversations where id = :id and {_OWNED}"
        )
        row = await self._run(lambda conn: conn.execute(statement, params).fetchone(), write=False)
        return self._conversation(row)

    async def update_conversation(
        self, identity: StoreIdentity, conversation_id: str, *, title: str | None
    ) -> Conversation[Any]:
        """Rename a conversation: the only field a user may change."""
        conversation = parse_uuid(conversation_id)
        check_title(title)
        params = _scope(identity, conversation) | {"title": title, "now": _now()}
        statement = (
            "update bastion_conversations set title = :title, updated_at = :now "
            f"where id = :id and {_OWNED} returning {sqlite_select(self.schema)}"
        )
        row = await self._run(lambda conn: conn.execute(statement, params).fetchone(), write=True)
        return self._conversation(row)

    async def set_conversation_state(
        self, identity: StoreIdentity, conversation_id: str, state: object
    ) -> Conversation[Any]:
        """Replace the conversation's application state (validated by the schema; None clears it)."""
        conversation = parse_uuid(conversation_id)
        text = self.schema.dump_state(state) if state is not None else None
        params = _scope(identity, conversation) | {"state": text, "now": _now()}
        statement = (
            "update bastion_conversations set state = :state, updated_at = :now "
            f"where id = :id and {_OWNED} returning {sqlite_select(self.schema)}"
        )
        row = await self._run(lambda conn: conn.execute(statement, params).fetchone(), write=True)
        return self._conversation(row)

    def _conversation(self, row: tuple[Any, ...] | None) -> Conversation[Any]:
        if row is None:
            raise NotFoundError()
        return conversation_from_row(self.schema, row, time=_time, stored_json=json.loads)

    async def delete_conversation(self, identity: StoreIdentity, conversation_id: str) -> None:
        """Delete a conversation with its messages, runs, events, tool executions and feedback."""
        params = _scope(identity, parse_uuid(conversation_id))
        row = await self._run(lambda conn: conn.execute(_DELETE_CONVERSATION, params).fetchone(), write=True)
        if row is None:
            raise NotFoundError()

    async def list_messages(
        self, identity: StoreIdentity, conversation_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[StoredMessage]:
        """A conversation's messages in order, from after position `after_seq`. Read-only."""
        conversation = parse_uuid(conversation_id)
        check_cursor(after_seq)
        check_limit(limit, maximum=10_000)
        params = _scope(identity, conversation) | {"after": after_seq, "limit": limit}
        rows = await self._run(lambda conn: _owned_rows(conn, _LIST_MESSAGES, params), write=False)
        return [
            StoredMessage(
                seq=seq, id=message_id, role=role, message=json.loads(message), created_at=_time(at)
            )
            for seq, message_id, role, message, at in rows
        ]

    async def add_feedback(
        self,
        identity: StoreIdentity,
        conversation_id: str,
        message_id: str,
        *,
        rating: Rating,
        comment: str | None = None,
    ) -> Feedback:
        """Rate a message of one of the caller's conversations; rating it again replaces the rating."""
        conversation = parse_uuid(conversation_id)
        check_text(message_id)
        if rating not in _RATINGS:
            raise InvalidInputError()
        if comment is not None:
            check_text(comment, max_length=MAX_COMMENT)
        params = _scope(identity, conversation) | {
            "message": message_id,
            "rating": rating,
            "comment": comment,
            "now": _now(),
        }
        row = await self._run(lambda conn: conn.execute(_UPSERT_FEEDBACK, params).fetchone(), write=True)
        if row is None:
            raise NotFoundError()
        return Feedback(
            conversation_id=row[0], message_id=row[1], rating=row[2], comment=row[3], updated_at=_time(row[4])
        )

    async def list_events(
        self, identity: StoreIdentity, conversation_id: str, *, after: int = 0, limit: int = 100
    ) -> list[RunEvent]:
        """The conversation's run events with a cursor greater than `after`, in order (for replay)."""
        conversation = parse_uuid(conversation_id)
        check_cursor(after)
        check_limit(limit)
        params = _scope(identity, conversation) | {"after": after, "limit": limit}
        rows = await self._run(lambda conn: _owned_rows(conn, _LIST_EVENTS, params), write=False)
        return [
            RunEvent(id=event_id, run_id=run_id, type=kind, data=json.loads(data), created_at=_time(at))
            for event_id, run_id, kind, data, at in rows
        ]


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
        store: SqliteStore,
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
        params = _scope(context.identity, context.conversation_id) | {"request": context.request_id}
        ids = json.dumps(browser_message_ids(input.messages))
        revision, last_seq, tail = await self._store._run(
            lambda conn: self._load_turn(conn, context, params, ids), write=False
        )
        history = await self._reconcile([message for _, message in tail], input, context)
        plan = plan_history_writes(tail, history, last_seq=last_seq)
        run_id = str(uuid.uuid4())
        events = [run_event(run_id, "started"), *approval_response_events(tail, history)]

        def claim(conn: sqlite3.Connection) -> None:
            now = _now()
            at = params | {"run": run_id, "now": now}
            _require_claimable(conn, at, revision=revision, now=now)
            conn.execute(_INSERT_RUN, at | {"lease": now + self._lease_us, "worker": self._store.worker_key})
            if plan.truncate_after is not None:
                conn.execute(_TRUNCATE, at | {"after": plan.truncate_after})
            for write in plan.writes:
                _write_history(conn, at, write)
            _insert_events(conn, at, events)
            conn.execute(_CLAIM_CONVERSATION, at)

        await self._store._run(lambda conn: _conflicts(conn, claim), write=True)
        self._store._leases.hold(run_id, self._lease_seconds)
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
        row = conn.execute(_TURN_CONVERSATION, params).fetchone()
        if row is None:
            raise NotFoundError()
        revision, active_run = row
        stale = context.expected_revision is not None and context.expected_revision != revision
        now = _now()
        lease = _running(conn, params, active_run)
        if lease is not None and lease > now:
            raise ConversationBusyError((lease - now) / 1_000_000)
        if stale or _request_seen(conn, params):
            raise TurnConflictError()
        last_seq = conn.execute(_LAST_SEQ, params).fetchone()[0]
        named = conn.execute(_FIRST_NAMED_SEQ, params | {"ids": ids}).fetchone()[0]
        start = min(last_seq + 1 if named is None else named, last_seq - self._window + 1)
        tail = conn.execute(_TAIL, params | {"from": start}).fetchall()
        return revision, last_seq, [(seq, json.loads(message)) for seq, message in tail]

    async def execute_tool(self, context: TurnContext, state: TurnState, operation: ToolOperation) -> Any:
        checked = self._checked_operation(state, operation)
        replayed, output = self._replayed(state, checked)
        if replayed:
            return output
        results = list(state.unrecorded_results)
        params = _scope(context.identity, state.conversation_id) | {
            "run": state.run_id,
            "key": checked.key,
            "call": checked.call_id,
            "name": checked.name,
            "input": canonical_json(checked.input),
        }
        state.running_tool_calls.add(checked.key)
        claimed = False
        try:
            outcome, output = await self._store._run(
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
        now = _now()
        at = params | {"now": now}
        if conn.execute(_CONVERSATION_EXISTS, at).fetchone() is None:
            raise NotFoundError()
        if not _is_active(conn, at):
            raise AgentRunInactiveError()
        _record_tool_results(conn, at, results)
        conn.execute(_RENEW_LEASE, at | {"lease": now + self._lease_us})
        started = [_tool_event("tool.started", checked.call_id, checked.name)]
        if conn.execute(_CLAIM_TOOL, at).rowcount == 1:
            _insert_events(conn, at, started)
            return "claimed", None
        name, stored_input, status, output, run_status, lease, worker = conn.execute(
            _EXISTING_TOOL, at
        ).fetchone()
        if name != checked.name or stored_input != params["input"]:
            return "mismatch", None
        if status == "completed":
            return "completed", json.loads(output)
        if status == "in_flight" and run_status == "running" and _holds(lease, worker, now):
            return "in_flight", None
        if checked.idempotent:
            conn.execute(_RECLAIM_TOOL, at)
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
        params = _scope(context.identity, state.conversation_id) | {"run": state.run_id, "status": status}
        self._store._leases.release(state.run_id)

        def finish(conn: sqlite3.Connection) -> None:
            at = params | {"now": _now()}
            if conn.execute(_CONVERSATION_EXISTS, at).fetchone() is None:
                return
            _record_tool_results(conn, at, results)
            if not _is_active(conn, at):
                return
            if message is not None:
                _save_response(conn, at, message)
            conn.execute(_SETTLE_RUN, at)
            _insert_events(conn, at, events)
            conn.execute(_RELEASE_CONVERSATION, at)

        await self._store._run(lambda conn: _conflicts(conn, finish), write=True)
        del state.unrecorded_results[: len(results)]


def available_sqlite_migrations() -> list[Migration]:
    """The SQLite migrations shipped with bastion (`sqlite_migrations/NNNN_name.sql`), in order."""
    found: list[Migration] = []
    for entry in resources.files("bastion.stores").joinpath(_MIGRATION_FILE).iterdir():
        stem, _, suffix = entry.name.partition(".")
        version, _, name = stem.partition("_")
        if suffix == "sql" and version.isdigit() and len(version) == 4 and name:
            found.append(Migration(int(version), name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda migration: migration.version)
    return found


# The worker thread's side: everything below runs on the store's thread, inside `_transaction`.


def _connect(path: str) -> sqlite3.Connection:
    """The store's one connection: autocommit mode (transactions are explicit), foreign keys on."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("pragma foreign_keys = on")
    connection.execute("pragma busy_timeout = 5000")
    if path != ":memory:":
        connection.execute("pragma journal_mode = wal")
    return connection


def _transaction(connection: sqlite3.Connection, work: Work[T], write: bool) -> T:
    connection.execute("begin immediate" if write else "begin")
    try:
        result = work(connection)
        connection.execute("commit")
    except BaseException:
        if connection.in_transaction:
            connection.execute("rollback")
        raise
    return result


def _apply_migrations(
    conn: sqlite3.Connection, migrations: Sequence[Migration], *, component: str = "bastion"
) -> list[int]:
    conn.execute(
        "create table if not exists bastion_migrations (version integer primary key, name text not null, "
        "checksum text not null, applied_at integer not null) strict"
    )
    conn.execute(
        "create table if not exists bastion_component_migrations (component text not null, "
        "version integer not null, name text not null, checksum text not null, applied_at integer not null, "
        "primary key (component, version)) strict"
    )
    if component == "bastion":
        applied = dict(conn.execute("select version, checksum from bastion_migrations").fetchall())
    else:
        applied = dict(
            conn.execute(
                "select version, checksum from bastion_component_migrations where component = ?", (component,)
            ).fetchall()
        )
    done: list[int] = []
    for migration in migrations:
        if migration.version in applied:
            if applied[migration.version] != migration.checksum:
                raise MigrationChangedError(migration.version)
            continue
        for statement in _statements(migration.sql):
            conn.execute(statement)
        if component == "bastion":
            conn.execute(
                "insert into bastion_migrations (version, name, checksum, applied_at) values (?, ?, ?, ?)",
                (migration.version, migration.name, migration.checksum, _now()),
            )
        else:
            conn.execute(
                "insert into bastion_component_migrations (component, version, name, checksum, applied_at) "
                "values (?, ?, ?, ?, ?)",
                (component, migration.version, migration.name, migration.checksum, _now()),
            )
        done.append(migration.version)
    return done


def _statements(script: str) -> list[str]:
    """Split a migration into statements, so that it runs inside the caller's transaction
    (`executescript` would commit first)."""
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        if not pending and (not line.strip() or line.lstrip().startswith("--")):
            continue
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending)
            pending = ""
    if pending.strip():
        raise ValueError("A migration ends with an incomplete statement.")
    return statements


def _conflicts(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], None]) -> None:
    """A unique key hit by a race (a message id written twice) is a conflict, as in Postgres."""
    try:
        work(conn)
    except sqlite3.IntegrityError as error:
        raise TurnConflictError() from error


def _owned_rows(conn: sqlite3.Connection, statement: str, params: dict[str, Any]) -> list[Any]:
    """Rows of a caller's conversation; an empty list only if it has none, `NotFoundError` if it is
    not theirs."""
    if conn.execute(_CONVERSATION_EXISTS, params).fetchone() is None:
        raise NotFoundError()
    return conn.execute(statement, params).fetchall()


def _running(conn: sqlite3.Connection, params: dict[str, Any], active_run: str | None) -> int | None:
    """When the conversation's active run is still running, the end of its lease (0 when its
    worker is gone: it is not running any more); else `None`."""
    if active_run is None:
        return None
    row = conn.execute(_ACTIVE_RUN, params | {"run": active_run}).fetchone()
    if row is None or row[1] != "running":
        return None
    _, _, lease, worker = row
    return lease if worker is None or worker in _LIVE_WORKERS else 0


def _holds(lease: int, worker: int | None, now: int) -> bool:
    """Whether a running run still holds what it claimed: within its lease and its worker alive."""
    return lease > now and (worker is None or worker in _LIVE_WORKERS)


def _request_seen(conn: sqlite3.Connection, params: dict[str, Any]) -> bool:
    return conn.execute(_REQUEST_SEEN, params).fetchone() is not None


def _require_claimable(conn: sqlite3.Connection, params: dict[str, Any], *, revision: int, now: int) -> None:
    """The conversation is unchanged since it was read and free, else a conflict; a run whose lease
    expired is replaced and recorded as interrupted."""
    row = conn.execute(_TURN_CONVERSATION, params).fetchone()
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
    conn.execute(_INTERRUPT_RUN, params | {"run": active_run})
    _insert_events(conn, params | {"run": active_run}, [run_event(active_run, "interrupted")])


def _is_active(conn: sqlite3.Connection, params: dict[str, Any]) -> bool:
    """The run is still running and still the conversation's active run (not replaced, not finished)."""
    row = conn.execute(_TURN_CONVERSATION, params).fetchone()
    if row is None or row[1] != params["run"]:
        return False
    run = conn.execute(_ACTIVE_RUN, params).fetchone()
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
        if conn.execute(_REPLACE_MESSAGE, values).rowcount != 1:
            raise StoreError()
    elif message.get("role") != "user":
        raise StoreError()
    else:
        conn.execute(_APPEND_MESSAGE, values)


def _save_response(conn: sqlite3.Connection, params: dict[str, Any], message: dict[str, Any]) -> None:
    """Append the response, or replace the latest message when the response continues it."""
    last = conn.execute(_LAST_MESSAGE, params).fetchone()
    values = params | {
        "message_id": message["id"],
        "role": "assistant",
        "message": json.dumps(message, separators=(",", ":")),
    }
    if last is not None and last[1] == message["id"]:
        if last[2] != "assistant":
            raise StoreError()
        conn.execute(_REPLACE_MESSAGE, values | {"seq": last[0]})
    else:
        conn.execute(_APPEND_MESSAGE, values | {"seq": (last[0] if last is not None else 0) + 1})


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
        row = conn.execute(_SETTLE_TOOL, values).fetchone()
        if row is not None:
            kind = "tool.completed" if status == "completed" else "tool.failed"
            _insert_events(conn, values, [_tool_event(kind, row[1], row[0])])


def _insert_events(conn: sqlite3.Connection, params: dict[str, Any], events: list[dict[str, Any]]) -> None:
    conn.executemany(
        _INSERT_EVENT,
        [params | {"type": event["type"], "data": json.dumps(event.get("data", {}))} for event in events],
    )


# Shared helpers (event loop side).


def _scope(identity: StoreIdentity, conversation_id: str | None = None) -> dict[str, Any]:
    """The parameters every statement filters on: the caller's owner id and tenant."""
    return {"owner": identity.user_id, "tenant": identity.tenant_id, "id": conversation_id}


def _now() -> int:
    """Microseconds since the Unix epoch: exact, and ordered as integers."""
    return time.time_ns() // 1000


def _time(microseconds: int) -> datetime:
    return _EPOCH + timedelta(microseconds=microseconds)


def _tool_event(kind: str, call_id: str, name: str) -> dict[str, Any]:
    return {"type": kind, "data": {"toolCallId": call_id, "toolName": name}}
