"""The Postgres store: conversations, messages, runs, events and tool claims under row-level security.

The application connects as a login role without BYPASSRLS (member of `authenticated`, and of
`bastion_runtime` to write turns). Every call runs one transaction that first sets the caller's
identity with `set_config(..., true)`, exactly as Supabase does, so the database itself decides what
each user may read and write; nothing outlives the transaction on a pooled connection. Statements
are pipelined: a transaction costs one round trip, or two when Python must look at a result in the
middle (reconciling a turn against a freshly loaded tail; see `PostgresAgentPersistence`).

`PostgresStore` is the entity API (conversations, messages, feedback, events) and hands out
`PostgresAgentPersistence`, the `AgentPersistence` implementation a turn runs through.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, TypeAlias

from bastion._extras import missing_extra

try:
    import psycopg
    from psycopg.pq import TransactionStatus
    from psycopg.rows import TupleRow
    from psycopg.types.json import Jsonb
    from psycopg_pool import AsyncConnectionPool
except ImportError as error:
    raise missing_extra("bastion.stores.PostgresStore", "postgres", error) from error

from bastion.approvals import CanRespondToApproval
from bastion.history import AgentHistoryConflictError, reconcile_agent_messages
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
    postgres_insert,
    postgres_list,
    postgres_select,
)
from bastion.stores._leases import DEFAULT_LEASE_SECONDS, LeaseKeeper, new_worker_key
from bastion.stores._migrations import apply_migrations
from bastion.stores._tail_cache import (
    DEFAULT_MAX_BYTES,
    CachedTail,
    TailCache,
    TailKey,
    claimed_tail,
    finished_tail,
    loaded_tail,
    tail_key,
)
from bastion.stores._turns import (
    CheckedOperation,
    HistoryWrites,
    TurnPersistence,
    approval_request_events,
    approval_response_events,
    browser_message_ids,
    check_response,
    check_title,
    pending_approval_ids,
    plan_history_writes,
    recordable,
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
    ToolOperationConflictError,
    ToolOperationMismatchError,
    ToolOperationUncertainError,
    TurnConflictError,
)
from bastion.stores.filters import ConversationFilter
from bastion.stores.schema import ConversationSchema

if TYPE_CHECKING:
    from bastion.stores.postgres_live import PostgresLiveTurns

__all__ = ["PostgresAgentPersistence", "PostgresStore"]

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]
Pool: TypeAlias = AsyncConnectionPool[Connection]

_SET_IDENTITY: Final = (
    "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)"
)
_RATINGS: Final = frozenset({"up", "down"})

# SQLSTATEs raised on purpose by the migrations' functions, and the ones a race produces.
_CONFLICT_STATES: Final = frozenset({"BS409", "23505"})
_LOCK_NOT_AVAILABLE: Final = "55P03"


class PostgresStore:
    """Conversations and turns in Postgres, each call as the verified caller under row-level security.

    Open with `PostgresStore.open(conninfo_or_pool)`. Pass `prepare_threshold=None` behind a
    transaction-mode pooler (Supabase's), which cannot keep prepared statements. `admin_conninfo`
    is the owner's connection, used only by `migrate()`. `claim_cache_size` bounds how many
    conversations' stored tails this process remembers to claim a later turn in one round trip
    (0 remembers none), and `claim_cache_bytes` the bytes of messages they hold in all. `schema` is
    the application's conversation state type and registered columns (`ConversationSchema`).

    The store names itself on the runs it claims with a random worker key and, while it runs
    turns, holds that key's session advisory lock on a connection of its own (outside the pool;
    use a session connection, not a transaction-mode pooler, for it to prove anything). When the
    process dies the lock goes with its connection, and any other process (or this one restarted)
    that meets one of its runs replaces it at once instead of waiting for the lease.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        admin_conninfo: str | None = None,
        owns_pool: bool = False,
        claim_cache_size: int = 256,
        claim_cache_bytes: int = DEFAULT_MAX_BYTES,
        schema: ConversationSchema[Any] | None = None,
    ) -> None:
        self._pool = pool
        self.schema: Final = schema or ConversationSchema()
        self._admin_conninfo = admin_conninfo
        self._owns_pool = owns_pool
        self._tails = TailCache(claim_cache_size, max_bytes=claim_cache_bytes)
        self.worker_key: Final = new_worker_key()
        self._liveness: Connection | None = None
        self._liveness_lock = asyncio.Lock()
        self._leases = LeaseKeeper(self._renew_leases)
        self._live: PostgresLiveTurns | None = None

    @classmethod
    async def open(
        cls,
        conninfo: str | Pool,
        *,
        admin_conninfo: str | None = None,
        prepare_threshold: int | None = 5,
        min_size: int = 1,
        max_size: int = 10,
        claim_cache_size: int = 256,
        claim_cache_bytes: int = DEFAULT_MAX_BYTES,
        schema: ConversationSchema[Any] | None = None,
    ) -> PostgresStore:
        """A store over a connection string (opening its own pool) or an existing pool."""
        if not isinstance(conninfo, str):
            return cls(
                conninfo,
                admin_conninfo=admin_conninfo,
                claim_cache_size=claim_cache_size,
                claim_cache_bytes=claim_cache_bytes,
                schema=schema,
            )
        pool: Pool = AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True, "prepare_threshold": prepare_threshold},
            open=False,
        )
        store = cls(
            pool,
            admin_conninfo=admin_conninfo,
            owns_pool=True,
            claim_cache_size=claim_cache_size,
            claim_cache_bytes=claim_cache_bytes,
            schema=schema,
        )
        await pool.open(wait=True)
        try:
            await store._hold_worker_lock()
        except BaseException:
            await pool.close()
            raise
        return store

    @property
    def pool(self) -> Pool:
        """The store's connection pool, to share with what else runs as the application's role
        (a `PostgresCredentialProvider`, say) instead of opening more connections."""
        return self._pool

    def live_turns(self) -> PostgresLiveTurns:
        """Stream logs, followers and stop requests of this store's running turns (`bastion.stores.live`)."""
        if self._live is None:
            from bastion.stores.postgres_live import PostgresLiveTurns

            conninfo = self._pool.conninfo
            if not isinstance(conninfo, str):
                raise ValueError("Live turns listen on their own connection: open the store with a string.")
            self._live = PostgresLiveTurns(self, listen_conninfo=conninfo)
        return self._live

    async def close(self) -> None:
        """Stop renewing leases and listening for live turns, release the worker lock, and close the pool
        if this store opened it."""
        if self._live is not None:
            await self._live.close()
        await self._leases.close()
        liveness, self._liveness = self._liveness, None
        if liveness is not None:
            # Released before the connection goes, so the lock is free when `close` returns.
            with suppress(psycopg.Error):
                await liveness.execute("select pg_advisory_unlock_all()")
            await liveness.close()
        if self._owns_pool:
            await self._pool.close()

    async def _hold_worker_lock(self) -> int:
        """Hold this store's worker lock (again, if its connection broke); return the worker key."""
        if self._liveness is not None and not self._liveness.closed:
            return self.worker_key
        async with self._liveness_lock:
            if self._liveness is None or self._liveness.closed:
                conninfo = self._pool.conninfo
                if not isinstance(conninfo, str):
                    conninfo = await _resolved(conninfo())
                conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
                try:
                    cursor = await conn.execute("select pg_try_advisory_lock(%s)", (self.worker_key,))
                    if not _single(await cursor.fetchone()):
                        raise RuntimeError("Another process holds this store's worker lock.")
                except BaseException:
                    await conn.close()
                    raise
                self._liveness = conn
        return self.worker_key

    async def _renew_leases(self, run_ids: list[str], lease_seconds: float) -> None:
        """Extend the leases of runs this store is running; check the worker lock is still held."""
        liveness = self._liveness
        if liveness is not None:
            try:
                await liveness.execute("select 1")
            except psycopg.Error:
                await liveness.close()
        await self._hold_worker_lock()
        async with self._pool.connection() as conn:
            await conn.execute(
                "select bastion.renew_runs(%s, %s::uuid[], %s)", (self.worker_key, run_ids, lease_seconds)
            )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def migrate(self, *, upto: int | None = None) -> list[int]:
        """Apply pending migrations through `admin_conninfo` (else the pool's own connection string)."""
        conninfo = self._admin_conninfo or self._pool.conninfo
        if not isinstance(conninfo, str):
            raise ValueError("Pass admin_conninfo: this pool's connection string is computed.")
        return await apply_migrations(conninfo, upto=upto)

    async def prune_run_chunks(self, *, older_than: timedelta) -> int:
        """Delete the stream logs of runs that ended more than `older_than` ago (they are replayed only
        while a run is in flight); the rows deleted. Run it now and then, for retention."""
        if older_than < timedelta(0):
            raise ValueError("older_than must not be negative")
        async with self._pool.connection() as conn:
            cursor = await conn.execute("select bastion.prune_run_chunks(%s)", (older_than,))
            return int(_single(await cursor.fetchone()))

    def persistence(
        self,
        *,
        history_window: int = 100,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        can_respond_to_approval: CanRespondToApproval[TurnContext] | None = None,
    ) -> PostgresAgentPersistence:
        """The `AgentPersistence` of this store; see `PostgresAgentPersistence`."""
        return PostgresAgentPersistence(
            self,
            history_window=history_window,
            lease_seconds=lease_seconds,
            can_respond_to_approval=can_respond_to_approval,
        )

    @asynccontextmanager
    async def transaction(self, identity: StoreIdentity) -> AsyncIterator[Connection]:
        """One pipelined transaction as `identity`: role and claims are local to it, never the session.

        Statements queue until a result is fetched or the block ends; results of statements left
        unfetched can be read after the block, which then cost no extra round trip.
        """
        async with caller_transaction(self._pool, _SET_IDENTITY, (identity.database_claims(),)) as conn:
            yield conn

    # Entity API: user-scoped, tenant-scoped under a tenant claim; the database injects the owner.

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
        chosen = parse_uuid(conversation_id) if conversation_id is not None else None
        try:
            with _database_errors():
                async with self.transaction(identity) as conn:
                    cursor = await conn.execute(postgres_insert(self.schema, values), values | {"id": chosen})
        except TurnConflictError:
            raise InvalidInputError() from None
        return self._conversation(await cursor.fetchone())

    async def list_conversations(
        self, identity: StoreIdentity, *, limit: int = 50, filter: ConversationFilter | None = None
    ) -> list[Conversation[Any]]:
        """The caller's conversations, most recently active first, narrowed by `filter`."""
        check_limit(limit)
        where = (filter or ConversationFilter()).checked(self.schema.columns)
        statement, params = postgres_list(self.schema, where)
        with _database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(statement, params | {"limit": limit})
        return [self._conversation(row) for row in await cursor.fetchall()]

    async def get_conversation(self, identity: StoreIdentity, conversation_id: str) -> Conversation[Any]:
        conversation = parse_uuid(conversation_id)
        with _database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(
                    f"select {postgres_select(self.schema)} from bastion.conversations where id = %s",
                    (conversation,),
                )
        return self._conversation(await cursor.fetchone())

    async def update_conversation(
        self, identity: StoreIdentity, conversation_id: str, *, title: str | None
    ) -> Conversation[Any]:
        """Rename a conversation: the only column a user may change."""
        conversation = parse_uuid(conversation_id)
        check_title(title)
        with _database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(
                    "update bastion.conversations set title = %s, updated_at = now() "
                    f"where id = %s returning {postgres_select(self.schema)}",
                    (title, conversation),
                )
        return self._conversation(await cursor.fetchone())

    async def set_conversation_state(
        self, identity: StoreIdentity, conversation_id: str, state: object
    ) -> Conversation[Any]:
        """Replace the conversation's application state (validated by the schema; None clears it)."""
        conversation = parse_uuid(conversation_id)
        text = self.schema.dump_state(state) if state is not None else None
        with _database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(
                    "update bastion.conversations set state = %s::jsonb, updated_at = now() "
                    f"where id = %s returning {postgres_select(self.schema)}",
                    (text, conversation),
                )
        return self._conversation(await cursor.fetchone())

    def _conversation(self, row: tuple[Any, ...] | None) -> Conversation[Any]:
        if row is None:
            raise NotFoundError()
        return conversation_from_row(self.schema, row)

    async def delete_conversation(self, identity: StoreIdentity, conversation_id: str) -> None:
        """Delete a conversation with its messages, runs, events, tool executions and feedback."""
        conversation = parse_uuid(conversation_id)
        self._tails.evict(tail_key(identity, conversation))
        with _database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(
                    "delete from bastion.conversations where id = %s returning id", (conversation,)
                )
        if await cursor.fetchone() is None:
            raise NotFoundError()

    async def list_messages(
        self, identity: StoreIdentity, conversation_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[StoredMessage]:
        """A conversation's messages in order, from after position `after_seq`. Read-only."""
        conversation = parse_uuid(conversation_id)
        check_cursor(after_seq)
        check_limit(limit, maximum=10_000)
        with _database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(
                    "select m.seq, m.id, m.role, m.message, m.created_at from bastion.conversations c "
                    "left join lateral (select * from bastion.messages m where m.conversation_id = c.id "
                    "and m.seq > %s order by m.seq limit %s) m on true where c.id = %s",
                    (after_seq, limit, conversation),
                )
        rows = await cursor.fetchall()
        if not rows:
            raise NotFoundError()
        return [
            StoredMessage(seq=seq, id=message_id, role=role, message=message, created_at=created)
            for seq, message_id, role, message, created in rows
            if seq is not None
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
        with _database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(
                    "insert into bastion.feedback (conversation_id, message_id, rating, comment) "
                    "select m.conversation_id, m.id, %s, %s from bastion.messages m "
                    "where m.conversation_id = %s and m.id = %s "
                    "on conflict (conversation_id, message_id, owner_id) do update "
                    "set rating = excluded.rating, comment = excluded.comment, updated_at = now() "
                    "returning conversation_id::text, message_id, rating, comment, updated_at",
                    (rating, comment, conversation, message_id),
                )
        row = await cursor.fetchone()
        if row is None:
            raise NotFoundError()
        return Feedback(
            conversation_id=row[0], message_id=row[1], rating=row[2], comment=row[3], updated_at=row[4]
        )

    async def list_events(
        self, identity: StoreIdentity, conversation_id: str, *, after: int = 0, limit: int = 100
    ) -> list[RunEvent]:
        """The conversation's run events with a cursor greater than `after`, in order (for replay)."""
        conversation = parse_uuid(conversation_id)
        check_cursor(after)
        check_limit(limit)
        with _database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(
                    "select e.id, e.run_id::text, e.type, e.data, e.created_at from bastion.conversations c "
                    "left join lateral (select * from bastion.run_events e where e.conversation_id = c.id "
                    "and e.id > %s order by e.id limit %s) e on true where c.id = %s",
                    (after, limit, conversation),
                )
        rows = await cursor.fetchall()
        if not rows:
            raise NotFoundError()
        return [
            RunEvent(id=event_id, run_id=run_id, type=kind, data=data, created_at=created)
            for event_id, run_id, kind, data, created in rows
            if event_id is not None
        ]


class PostgresAgentPersistence(TurnPersistence):
    """Turns stored in Postgres: claims with revisions and leases, exactly-once tool operations, events.

    - `start_run` (two round trips, one transaction): lock the conversation without waiting, load
      its stored tail, reconcile the browser's messages, claim the turn and write what changed.
      The model gets the last `history_window` messages of the canonical history. A later turn
      takes one round trip when this process remembers the tail its previous claim or finish left
      (per identity and conversation): it reconciles against that tail, and the database claims
      only if the revision is unchanged, the browser names no stored message the tail lacks, no
      live run holds the conversation and the request id is new. A stale tail changes nothing and
      costs a fresh load; any error forgets the tail.
    - `execute_tool` (one round trip): claim the call before its side effect; the results of this
      run's earlier calls are recorded in the same trip (or by `finish_run`).
    - `finish_run` (one round trip): fenced by run id and idempotent; appends (or replaces, when
      continuing it) only the response message and releases the claim.

    A run holds its claim for `lease_seconds` (30 s by default), renewed while this process runs
    it; a newer turn replaces a run whose lease expired, or whose process provably died (its
    worker lock is free), and records it as interrupted. A conversation a live turn holds is
    refused with `ConversationBusyError`, which carries `Retry-After`.

    A run a durable workflow runs (`bastion.durable`) is marked durable once its workflow exists
    (`mark_durable`): it is not replaced when its process dies, since a live process adopts it
    (`adopt_run`) and finishes it; only its lease running out frees its conversation then.
    """

    def __init__(
        self,
        store: PostgresStore,
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
        self._tails = store._tails

    async def mark_durable(self, context: TurnContext, state: TurnState) -> bool:
        """Mark the run durable, once a durable workflow runs it (one round trip): from now on it waits
        for its take-over when its process dies instead of being replaced. False when it no longer runs."""
        with _database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute("select bastion.mark_run_durable(%s)", (state.run_id,))
            return bool(_single(await cursor.fetchone()))

    async def adopt_run(self, context: TurnContext, state: TurnState) -> bool:
        """Take over the run of a durable workflow whose process died: this process runs it from now on
        (and the run is durable, if its process died before marking it).

        One round trip. False, and nothing changes, when the run is no longer the conversation's
        running turn (it was settled or replaced meanwhile) or its process is still alive. Operations
        the dead process left in flight are settled as failed: their outcome is unknown, so running
        them again is refused unless the tool is idempotent.
        """
        await self._store._hold_worker_lock()
        with _database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute(
                    "select bastion.adopt_run(%s, %s, %s)",
                    (state.run_id, self._store.worker_key, self._lease_seconds),
                )
            adopted = bool(_single(await cursor.fetchone()))
        self._tails.evict(tail_key(context.identity, state.conversation_id))
        if adopted:
            self._store._leases.hold(state.run_id, self._lease_seconds)
        return adopted

    async def record_tool_results(self, context: TurnContext, state: TurnState) -> None:
        """Write the results of this run's finished operations now, not with its next write (a
        durable turn does so before each model request, so a replayed request never saw a result
        the store lacks)."""
        results = list(state.unrecorded_results)
        if not results:
            return
        with _database_errors():
            async with self._store.transaction(context.identity) as conn:
                await conn.execute(
                    "select bastion.record_run_results(%s, %s, %s)",
                    (state.conversation_id, state.run_id, Jsonb(recordable(results))),
                )
        del state.unrecorded_results[: len(results)]

    async def start_run(self, context: TurnContext, input: RunInput) -> RunStart[TurnState]:
        key = tail_key(context.identity, context.conversation_id)
        cached = self._tails.get(key)
        await self._store._hold_worker_lock()
        try:
            if cached is not None:
                start = await self._claim_from_cache(context, input, key, cached)
                if start is not None:
                    return start
            return await self._claim_after_load(context, input, key)
        except BaseException:
            self._tails.evict(key)
            raise

    async def _claim_from_cache(
        self, context: TurnContext, input: RunInput, key: TailKey, cached: CachedTail
    ) -> RunStart[TurnState] | None:
        """One round trip: reconcile against the remembered tail, then claim only if it is still current.

        Returns None when the remembered tail cannot serve this turn or turns out stale; the caller
        then loads afresh, so a refusal here is never final (a forged window is refused there). No
        callback runs here: a turn that answers approvals under a policy takes the locked path, so
        the policy is asked once, while the stored history cannot change.
        """
        if cached.incarnation is None or not cached.covers_window(self._window):
            return None
        if context.expected_revision is not None and context.expected_revision != cached.revision:
            return None
        tail = list(cached.rows)
        try:
            history = await reconcile_agent_messages(
                [message for _, message in tail], input.messages, trigger=input.trigger
            )
        except AgentHistoryConflictError:
            return None
        plan = plan_history_writes(tail, history, last_seq=cached.last_seq)
        if self._can_respond is not None and _answers_approvals(plan):
            return None
        known = cached.ids()
        uncached = [
            message_id for message_id in browser_message_ids(input.messages) if message_id not in known
        ]
        run_id = str(uuid.uuid4())
        with _database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await self._execute_claim(
                    conn, context, run_id, cached, plan, tail, history, uncached_ids=uncached
                )
            claimed = _single(await cursor.fetchone())
        if claimed["outcome"] == "stale":
            return None
        return self._claimed(key, run_id, cached, plan, history, claimed)

    async def _claim_after_load(
        self, context: TurnContext, input: RunInput, key: TailKey
    ) -> RunStart[TurnState]:
        """Two round trips: load the stored tail under the conversation's lock, then claim."""
        run_id = str(uuid.uuid4())
        with _database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute(
                    "select bastion.load_turn(%s, %s, %s, %s)",
                    (
                        context.conversation_id,
                        context.request_id,
                        browser_message_ids(input.messages),
                        self._window,
                    ),
                )
                loaded = _single(await cursor.fetchone())
                if loaded is None:
                    raise NotFoundError()
                revision = loaded["revision"]
                stale = context.expected_revision is not None and context.expected_revision != revision
                if loaded["busy"]:
                    raise ConversationBusyError(loaded["retry_after"])
                if loaded["repeated_request"] or stale:
                    raise TurnConflictError()
                tail = [(seq, message) for seq, message in loaded["messages"]]
                base = loaded_tail(revision, loaded["last_seq"], tail)
                history = await self._reconcile([message for _, message in tail], input, context)
                plan = plan_history_writes(tail, history, last_seq=base.last_seq)
                cursor = await self._execute_claim(conn, context, run_id, base, plan, tail, history)
            claimed = _single(await cursor.fetchone())
        return self._claimed(key, run_id, base, plan, history, claimed)

    async def _execute_claim(
        self,
        conn: Connection,
        context: TurnContext,
        run_id: str,
        base: CachedTail,
        plan: HistoryWrites,
        tail: list[tuple[int, dict[str, Any]]],
        history: list[dict[str, Any]],
        *,
        uncached_ids: list[str] | None = None,
    ) -> psycopg.AsyncCursor[TupleRow]:
        """Queue `bastion.claim_turn`: the writes of `plan`, if the conversation is still at `base`."""
        events = [run_event(run_id, "started"), *approval_response_events(tail, history)]
        return await conn.execute(
            "select bastion.claim_turn(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                context.conversation_id,
                run_id,
                context.request_id,
                base.revision,
                base.incarnation,
                uncached_ids or [],
                self._store.worker_key,
                self._lease_seconds,
                plan.truncate_after,
                Jsonb(plan.writes),
                Jsonb(events),
            ),
        )

    def _claimed(
        self,
        key: TailKey,
        run_id: str,
        base: CachedTail,
        plan: HistoryWrites,
        history: list[dict[str, Any]],
        claimed: dict[str, Any],
    ) -> RunStart[TurnState]:
        """The started run, remembering the tail the claim left for the conversation's next turn."""
        if claimed["outcome"] == "busy":
            raise ConversationBusyError(claimed["retry_after"])
        if claimed["outcome"] != "claimed":
            raise TurnConflictError()
        revision = claimed["revision"]
        written_from = min((write["seq"] for write in plan.writes), default=None)
        written = [(seq, message) for seq, message in claimed["rows"]]
        after = claimed_tail(
            base,
            truncate_after=plan.truncate_after,
            written_from=written_from,
            revision=revision,
            last_seq=claimed["last_seq"],
            written=written,
            incarnation=claimed["incarnation"],
        )
        self._tails.put(key, after)
        self._store._leases.hold(run_id, self._lease_seconds)
        state = TurnState(
            conversation_id=key[2],
            run_id=run_id,
            revision=revision,
            pending_approval_ids=pending_approval_ids(history),
        )
        return RunStart(messages=history[-self._window :], state=state, operation_scope=run_id)

    async def execute_tool(self, context: TurnContext, state: TurnState, operation: ToolOperation) -> Any:
        checked = self._checked_operation(state, operation)
        replayed, output = self._replayed(state, checked)
        if replayed:
            return output
        results = list(state.unrecorded_results)
        state.running_tool_calls.add(checked.key)
        claimed = False
        try:
            claim = await self._claim_tool(context, state, checked, results)
            del state.unrecorded_results[: len(results)]
            outcome = claim["outcome"]
            if outcome == "completed":
                return claim["output"]
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

    async def _claim_tool(
        self, context: TurnContext, state: TurnState, checked: CheckedOperation, results: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """One round trip: record this run's earlier results and claim the operation."""
        try:
            with _database_errors():
                async with self._store.transaction(context.identity) as conn:
                    cursor = await conn.execute(
                        "select bastion.claim_tool(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (
                            state.conversation_id,
                            state.run_id,
                            checked.key,
                            checked.call_id,
                            checked.name,
                            Jsonb(checked.input),
                            checked.idempotent,
                            self._lease_seconds,
                            Jsonb(recordable(results)),
                        ),
                    )
                claim: dict[str, Any] = _single(await cursor.fetchone())
        except BaseException:
            self._tails.evict(tail_key(context.identity, state.conversation_id))
            raise
        return claim

    async def finish_run(self, context: TurnContext, state: TurnState, outcome: RunOutcome) -> None:
        message = outcome.response_message
        if message is not None:
            check_response(message)
        status = run_status(outcome.status, message)
        events = [
            *approval_request_events(message, known=state.pending_approval_ids),
            run_event(state.run_id, status, message),
        ]
        results = list(state.unrecorded_results)
        key = tail_key(context.identity, state.conversation_id)
        self._store._leases.release(state.run_id)
        try:
            with _database_errors():
                async with self._store.transaction(context.identity) as conn:
                    cursor = await conn.execute(
                        "select bastion.close_turn(%s, %s, %s, %s, %s, %s)",
                        (
                            state.conversation_id,
                            state.run_id,
                            status,
                            Jsonb(message) if message is not None else None,
                            Jsonb(recordable(results)),
                            Jsonb(events),
                        ),
                    )
                closed = _single(await cursor.fetchone())
        except BaseException:
            self._tails.evict(key)
            raise
        del state.unrecorded_results[: len(results)]
        self._remember_finish(key, state, closed)

    def _remember_finish(self, key: TailKey, state: TurnState, closed: dict[str, Any]) -> None:
        """Advance the remembered tail past this run's own finish; anything else forgets it."""
        before = self._tails.get(key)
        if before is None:
            return
        if (
            not closed["saved"]
            or before.revision != state.revision
            or closed["revision"] != state.revision + 1
        ):
            self._tails.evict(key)
            return
        row = closed["row"]
        saved = (row[0], row[1]) if row is not None else None
        self._tails.put(
            key, finished_tail(before, revision=closed["revision"], last_seq=closed["last_seq"], saved=saved)
        )


@asynccontextmanager
async def caller_transaction(
    pool: Pool, set_caller: str, params: tuple[Any, ...]
) -> AsyncIterator[Connection]:
    """One pipelined transaction that first runs `set_caller` (a `set_config(..., true)` statement), so the
    caller's role and claims last exactly as long as the transaction on a pooled connection."""
    async with pool.connection() as conn:
        if not conn.autocommit:
            await conn.set_autocommit(True)
        try:
            async with conn.pipeline():
                await conn.execute("begin")
                await conn.execute(set_caller, params)
                yield conn
                await conn.execute("commit")
        except BaseException:
            await _rollback(conn)
            raise


async def _rollback(conn: Connection) -> None:
    """Leave the connection idle for the pool; a broken one is discarded by the pool instead."""
    try:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.rollback()
    except psycopg.Error:
        pass


@contextmanager
def _database_errors() -> Iterator[None]:
    """Translate the SQLSTATEs the store raises on purpose; anything else is a server fault."""
    try:
        yield
    except psycopg.Error as error:
        state = error.sqlstate
        if state == _LOCK_NOT_AVAILABLE:
            raise ConversationBusyError() from error
        if state in _CONFLICT_STATES:
            raise TurnConflictError() from error
        if state == "BS404":
            raise NotFoundError() from error
        if state == "BS410":
            raise AgentRunInactiveError() from error
        raise


async def _resolved(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _single(row: tuple[Any, ...] | None) -> Any:
    assert row is not None
    return row[0]


def _answers_approvals(plan: HistoryWrites) -> bool:
    """Whether the claim changes a stored assistant message: only approval answers do."""
    return any(write["replace"] and write["message"].get("role") == "assistant" for write in plan.writes)
