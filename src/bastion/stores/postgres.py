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
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from bastion._extras import missing_extra

try:
    import psycopg
    from psycopg_pool import AsyncConnectionPool
except ImportError as error:
    raise missing_extra("bastion.stores.PostgresStore", "postgres", error) from error

from bastion.approvals import CanRespondToApproval
from bastion.stores._conversation_queries import (
    conversation_from_row,
    new_conversation_values,
    postgres_insert,
    postgres_list,
    postgres_select,
)
from bastion.stores._leases import DEFAULT_LEASE_SECONDS, LeaseKeeper, new_worker_key
from bastion.stores._migrations import apply_migrations
from bastion.stores._postgres_connection import (
    Connection,
    Pool,
    PoolCheck,
    caller_transaction,
    database_errors,
    single_value,
)
from bastion.stores._postgres_turn_persistence import PostgresAgentPersistence
from bastion.stores._tail_cache import (
    DEFAULT_MAX_BYTES,
    TailCache,
    tail_key,
)
from bastion.stores._turn_persistence import (
    check_title,
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
    check_cursor,
    check_limit,
    check_text,
    parse_uuid,
)
from bastion.stores.errors import (
    InvalidInputError,
    NotFoundError,
    TurnConflictError,
)
from bastion.stores.filters import ConversationFilter
from bastion.stores.followers import DEFAULT_FOLLOWER_LIMITS, FollowerLimits
from bastion.stores.schema import ConversationSchema

if TYPE_CHECKING:
    from bastion.stores.postgres_live import PostgresLiveTurns

__all__ = ["Connection", "PostgresAgentPersistence", "PostgresStore", "caller_transaction"]

_SET_IDENTITY: Final = (
    "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)"
)
_RATINGS: Final = frozenset({"up", "down"})


class PostgresStore:
    """Conversations and turns in Postgres, each call as the verified caller under row-level security.

    Open with `PostgresStore.open(conninfo_or_pool)`. Pass `prepare_threshold=None` behind a
    transaction-mode pooler (Supabase's), which cannot keep prepared statements. `admin_conninfo`
    is the owner's connection, used only by `migrate()`. `claim_cache_size` bounds how many
    conversations' stored tails this process remembers to claim a later turn in one round trip
    (0 remembers none), and `claim_cache_bytes` the bytes of messages they hold in all. `schema` is
    the application's conversation state type and registered columns (`ConversationSchema`).
    `follower_limits` caps the streams that follow running turns in this process (resumes, 429 past
    the cap); every follower of one turn shares one reader of its log.

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
        follower_limits: FollowerLimits = DEFAULT_FOLLOWER_LIMITS,
    ) -> None:
        self._pool = pool
        self.schema: Final = schema or ConversationSchema()
        self._admin_conninfo = admin_conninfo
        self._owns_pool = owns_pool
        # What its persistence (`PostgresAgentPersistence`, through `PostgresRunHost`) runs turns with.
        self.claim_cache: Final = TailCache(claim_cache_size, max_bytes=claim_cache_bytes)
        self.worker_key: Final = new_worker_key()
        self._liveness: Connection | None = None
        self._liveness_lock = asyncio.Lock()
        self.leases: Final = LeaseKeeper(self._renew_leases)
        self._live: PostgresLiveTurns | None = None
        self.follower_limits: Final = follower_limits

    @classmethod
    async def open(
        cls,
        conninfo: str | Pool,
        *,
        admin_conninfo: str | None = None,
        prepare_threshold: int | None = 5,
        min_size: int = 1,
        max_size: int = 10,
        pool_timeout: float = 30.0,
        claim_cache_size: int = 256,
        claim_cache_bytes: int = DEFAULT_MAX_BYTES,
        schema: ConversationSchema[Any] | None = None,
        follower_limits: FollowerLimits = DEFAULT_FOLLOWER_LIMITS,
    ) -> PostgresStore:
        """A store over a connection string (opening its own pool) or an existing pool.

        Its own pool checks each connection before handing it out, so one the server closed is replaced,
        and a call waits up to `pool_timeout` seconds for one: while the database cannot be reached,
        requests then answer 503 with `Retry-After` (`DatabaseUnavailableError`)."""
        if not isinstance(conninfo, str):
            return cls(
                conninfo,
                admin_conninfo=admin_conninfo,
                claim_cache_size=claim_cache_size,
                claim_cache_bytes=claim_cache_bytes,
                schema=schema,
                follower_limits=follower_limits,
            )
        # A connection the server closed (a restart, a failover) is replaced before a call gets it.
        check = PoolCheck()
        pool: Pool = AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True, "prepare_threshold": prepare_threshold},
            check=check,
            timeout=pool_timeout,
            open=False,
        )
        check.pool = pool
        store = cls(
            pool,
            admin_conninfo=admin_conninfo,
            owns_pool=True,
            claim_cache_size=claim_cache_size,
            claim_cache_bytes=claim_cache_bytes,
            schema=schema,
            follower_limits=follower_limits,
        )
        await pool.open(wait=True)
        try:
            await store.hold_worker_lock()
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
            self._live = PostgresLiveTurns(
                self, listen_conninfo=conninfo, follower_limits=self.follower_limits
            )
        return self._live

    async def close(self) -> None:
        """Stop renewing leases and listening for live turns, release the worker lock, and close the pool
        if this store opened it."""
        if self._live is not None:
            await self._live.close()
        await self.leases.close()
        liveness, self._liveness = self._liveness, None
        if liveness is not None:
            # Released before the connection goes, so the lock is free when `close` returns.
            with suppress(psycopg.Error):
                await liveness.execute("select pg_advisory_unlock_all()")
            await liveness.close()
        if self._owns_pool:
            await self._pool.close()

    async def hold_worker_lock(self) -> int:
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
                    if not single_value(await cursor.fetchone()):
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
        await self.hold_worker_lock()
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
            return int(single_value(await cursor.fetchone()))

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
            with database_errors():
                async with self.transaction(identity) as conn:
                    cursor = await conn.execute(postgres_insert(self.schema, values), values | {"id": chosen})
        except TurnConflictError:
            raise InvalidInputError() from None
        return self._conversation(await cursor.fetchone())

    def conversation_insert(
        self, conversation_id: str, *, title: str | None, agent_name: str | None
    ) -> tuple[str, dict[str, Any]]:
        """The statement and parameters that create the conversation `conversation_id` for the caller,
        as `create_conversation` does, unless its id is taken (then it inserts nothing)."""
        values = new_conversation_values(
            self.schema, title=title, agent_name=agent_name, state=None, columns=None
        )
        return postgres_insert(self.schema, values, if_absent=True), values | {
            "id": parse_uuid(conversation_id)
        }

    async def list_conversations(
        self, identity: StoreIdentity, *, limit: int = 50, filter: ConversationFilter | None = None
    ) -> list[Conversation[Any]]:
        """The caller's conversations, most recently active first, narrowed by `filter`."""
        check_limit(limit)
        where = (filter or ConversationFilter()).checked(self.schema.columns)
        statement, params = postgres_list(self.schema, where)
        with database_errors():
            async with self.transaction(identity) as conn:
                cursor = await conn.execute(statement, params | {"limit": limit})
        return [self._conversation(row) for row in await cursor.fetchall()]

    async def get_conversation(self, identity: StoreIdentity, conversation_id: str) -> Conversation[Any]:
        conversation = parse_uuid(conversation_id)
        with database_errors():
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
        with database_errors():
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
        with database_errors():
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
        self.claim_cache.evict(tail_key(identity, conversation))
        with database_errors():
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
        with database_errors():
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
        with database_errors():
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
        with database_errors():
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


async def _resolved(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
