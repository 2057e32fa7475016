"""The SQLite store: the Postgres store's contract for one process and no server, rules in the queries.

SQLite has no roles and no row-level security, so the rules the database enforces for Postgres are
enforced here by the statements themselves: every statement names the caller's owner id and tenant
(`tenant_id is ?`, so a caller without a tenant sees only rows without one), a missing and a foreign
conversation give the same `NotFoundError`, and messages, runs, events and tool executions change only
through the turn protocol of `SqliteAgentPersistence`.

This module is the store and its entity API (conversations, messages, feedback, events). The turn
protocol is `bastion.stores._sqlite_turn_persistence`, every named statement
`bastion.stores._sqlite_statements`, and the one connection on its own thread, with its transactions
and migrations, `bastion.stores._sqlite_connection`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final, Self, TypeVar

from bastion.approvals import CanRespondToApproval
from bastion.stores._conversation_queries import (
    conversation_from_row,
    new_conversation_values,
    sqlite_insert,
    sqlite_list,
    sqlite_select,
)
from bastion.stores._leases import DEFAULT_LEASE_SECONDS, LeaseKeeper, new_worker_key
from bastion.stores._migrations import Migration, check_component
from bastion.stores._sqlite_connection import (
    Work,
    apply_sqlite_migrations,
    available_sqlite_migrations,
    connect,
    run_transaction,
)
from bastion.stores._sqlite_statements import (
    CONVERSATION_EXISTS,
    DELETE_CONVERSATION,
    LIST_EVENTS,
    LIST_MESSAGES,
    OWNED,
    RENEW_WORKER_LEASES,
    UPSERT_FEEDBACK,
    microseconds_now,
    scope,
    stored_time,
)
from bastion.stores._sqlite_turn_persistence import LIVE_WORKERS, SqliteAgentPersistence
from bastion.stores._turn_persistence import check_title
from bastion.stores.entities import (
    MAX_COMMENT,
    Conversation,
    Feedback,
    Rating,
    RunEvent,
    StoredMessage,
    StoreIdentity,
    TurnContext,
    check_cursor,
    check_limit,
    check_text,
    parse_uuid,
)
from bastion.stores.errors import InvalidInputError, NotFoundError
from bastion.stores.filters import ConversationFilter
from bastion.stores.schema import ConversationSchema

__all__ = ["SqliteAgentPersistence", "SqliteStore", "available_sqlite_migrations"]

T = TypeVar("T")

_RATINGS: Final = frozenset({"up", "down"})


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
        LIVE_WORKERS.add(self.worker_key)
        # What its persistence (`SqliteAgentPersistence`, through `SqliteRunHost`) runs turns with.
        self.leases: Final = LeaseKeeper(self._renew_leases)
        self.schema: Final = schema or ConversationSchema()

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, schema: ConversationSchema[Any] | None = None
    ) -> SqliteStore:
        """A store over the database file at `path`, created if absent; `schema` as for `PostgresStore`."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bastion-sqlite")
        try:
            connection = await asyncio.get_running_loop().run_in_executor(executor, connect, os.fspath(path))
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(executor, connection, schema=schema)

    async def close(self) -> None:
        """Close the connection after the work already queued; later calls raise `RuntimeError`."""
        if self._closed:
            return
        await self.leases.close()
        self._closed = True
        LIVE_WORKERS.discard(self.worker_key)
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
        return await self.run_in_transaction(
            lambda conn: apply_sqlite_migrations(conn, migrations), write=True
        )

    async def migrate_application(self, *, component: str, migrations: Sequence[Migration]) -> list[int]:
        """Apply an application's own migrations after bastion's, recorded under `component`, in one
        transaction, as `apply_application_migrations` does for Postgres."""
        check_component(component)
        return await self.run_in_transaction(
            lambda conn: apply_sqlite_migrations(conn, migrations, component=component), write=True
        )

    async def _renew_leases(self, run_ids: list[str], lease_seconds: float) -> None:
        params = {
            "runs": json.dumps(run_ids),
            "worker": self.worker_key,
            "lease": microseconds_now() + round(lease_seconds * 1_000_000),
        }
        await self.run_in_transaction(lambda conn: conn.execute(RENEW_WORKER_LEASES, params), write=True)

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

    async def run_in_transaction(self, work: Work[T], *, write: bool) -> T:
        """Run `work` as one transaction on the store's thread; any exception rolls it back."""
        if self._closed:
            raise RuntimeError("This SqliteStore is closed.")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, run_transaction, self._connection, work, write)

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
        params = scope(identity, chosen) | values | {"now": microseconds_now()}
        statement = sqlite_insert(self.schema, values)
        try:
            row = await self.run_in_transaction(
                lambda conn: conn.execute(statement, params).fetchone(), write=True
            )
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
        params = scope(identity) | values | {"limit": limit}
        rows = await self.run_in_transaction(
            lambda conn: conn.execute(statement, params).fetchall(), write=False
        )
        return [self._conversation(row) for row in rows]

    async def get_conversation(self, identity: StoreIdentity, conversation_id: str) -> Conversation[Any]:
        params = scope(identity, parse_uuid(conversation_id))
        statement = (
            f"select {sqlite_select(self.schema)} from bastion_conversations where id = :id and {OWNED}"
        )
        row = await self.run_in_transaction(
            lambda conn: conn.execute(statement, params).fetchone(), write=False
        )
        return self._conversation(row)

    async def update_conversation(
        self, identity: StoreIdentity, conversation_id: str, *, title: str | None
    ) -> Conversation[Any]:
        """Rename a conversation: the only field a user may change."""
        conversation = parse_uuid(conversation_id)
        check_title(title)
        params = scope(identity, conversation) | {"title": title, "now": microseconds_now()}
        statement = (
            "update bastion_conversations set title = :title, updated_at = :now "
            f"where id = :id and {OWNED} returning {sqlite_select(self.schema)}"
        )
        row = await self.run_in_transaction(
            lambda conn: conn.execute(statement, params).fetchone(), write=True
        )
        return self._conversation(row)

    async def set_conversation_state(
        self, identity: StoreIdentity, conversation_id: str, state: object
    ) -> Conversation[Any]:
        """Replace the conversation's application state (validated by the schema; None clears it)."""
        conversation = parse_uuid(conversation_id)
        text = self.schema.dump_state(state) if state is not None else None
        params = scope(identity, conversation) | {"state": text, "now": microseconds_now()}
        statement = (
            "update bastion_conversations set state = :state, updated_at = :now "
            f"where id = :id and {OWNED} returning {sqlite_select(self.schema)}"
        )
        row = await self.run_in_transaction(
            lambda conn: conn.execute(statement, params).fetchone(), write=True
        )
        return self._conversation(row)

    def _conversation(self, row: tuple[Any, ...] | None) -> Conversation[Any]:
        if row is None:
            raise NotFoundError()
        return conversation_from_row(self.schema, row, time=stored_time, stored_json=json.loads)

    async def delete_conversation(self, identity: StoreIdentity, conversation_id: str) -> None:
        """Delete a conversation with its messages, runs, events, tool executions and feedback."""
        params = scope(identity, parse_uuid(conversation_id))
        row = await self.run_in_transaction(
            lambda conn: conn.execute(DELETE_CONVERSATION, params).fetchone(), write=True
        )
        if row is None:
            raise NotFoundError()

    async def list_messages(
        self, identity: StoreIdentity, conversation_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[StoredMessage]:
        """A conversation's messages in order, from after position `after_seq`. Read-only."""
        conversation = parse_uuid(conversation_id)
        check_cursor(after_seq)
        check_limit(limit, maximum=10_000)
        params = scope(identity, conversation) | {"after": after_seq, "limit": limit}
        rows = await self.run_in_transaction(
            lambda conn: _owned_rows(conn, LIST_MESSAGES, params), write=False
        )
        return [
            StoredMessage(
                seq=seq, id=message_id, role=role, message=json.loads(message), created_at=stored_time(at)
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
        params = scope(identity, conversation) | {
            "message": message_id,
            "rating": rating,
            "comment": comment,
            "now": microseconds_now(),
        }
        row = await self.run_in_transaction(
            lambda conn: conn.execute(UPSERT_FEEDBACK, params).fetchone(), write=True
        )
        if row is None:
            raise NotFoundError()
        return Feedback(
            conversation_id=row[0],
            message_id=row[1],
            rating=row[2],
            comment=row[3],
            updated_at=stored_time(row[4]),
        )

    async def list_events(
        self, identity: StoreIdentity, conversation_id: str, *, after: int = 0, limit: int = 100
    ) -> list[RunEvent]:
        """The conversation's run events with a cursor greater than `after`, in order (for replay)."""
        conversation = parse_uuid(conversation_id)
        check_cursor(after)
        check_limit(limit)
        params = scope(identity, conversation) | {"after": after, "limit": limit}
        rows = await self.run_in_transaction(lambda conn: _owned_rows(conn, LIST_EVENTS, params), write=False)
        return [
            RunEvent(id=event_id, run_id=run_id, type=kind, data=json.loads(data), created_at=stored_time(at))
            for event_id, run_id, kind, data, at in rows
        ]


def _owned_rows(conn: sqlite3.Connection, statement: str, params: dict[str, Any]) -> list[Any]:
    """Rows of a caller's conversation; an empty list only if it has none, `NotFoundError` if it is
    not theirs."""
    if conn.execute(CONVERSATION_EXISTS, params).fetchone() is None:
        raise NotFoundError()
    return conn.execute(statement, params).fetchall()
