"""The outbox in Postgres, as the application's role sees it: hooks' subscriptions and positions, the
next events each hook has not yet handed to delivery, failures, and what an operator asks.

Positions are (transaction id, event id) pairs: a window takes only events of transactions older
than every transaction still running, in that order, so no event can commit behind a position (see
the hooks migration). Operators name events by id; `replay` turns an id into a position.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Final, TypeAlias

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from bastion.hooks.events import HookEvent
from bastion.hooks.registry import Hook
from bastion.stores import Migration, apply_application_migrations, available_migrations

__all__ = [
    "EventWindow",
    "ForgottenHook",
    "HookEventPruned",
    "HookFailure",
    "HookStatus",
    "PostgresHookOutbox",
    "apply_chat_table_migrations",
    "apply_hooks_migrations",
    "autocommit_connection",
    "hook_migrations",
]

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]
Pool: TypeAlias = AsyncConnectionPool[Connection]

_EVENT_COLUMNS: Final = (
    "e.id, e.type, e.conversation_id::text, e.run_id::text, e.owner_id::text, e.tenant_id, e.signed_in, "
    "e.data, e.run_event_id, e.created_at"
)

_REGISTER: Final = """
insert into bastion.hook_subscriptions (hook, events, position_tx, position_id)
select %(hook)s, %(events)s,
       case when %(latest)s then pg_snapshot_xmin(pg_current_snapshot()) else '0'::xid8 end, 0
on conflict (hook) do update set events = excluded.events, updated_at = now()
 where bastion.hook_subscriptions.events is distinct from excluded.events
"""

# The subscription goes with its failures and holds (their foreign keys cascade); the counts read the
# statement's snapshot, from before the delete.
_FORGET: Final = """
with gone as (delete from bastion.hook_subscriptions where hook = %(hook)s returning hook)
select (select count(*) from gone),
       (select count(*) from bastion.hook_failures where hook = %(hook)s),
       (select count(*) from bastion.hook_holds where hook = %(hook)s)
"""

_LOCK: Final = """
select events, position_tx::text, position_id, generation from bastion.hook_subscriptions
 where hook = %s
   for update skip locked
"""

# The next events after the position whose transactions are over, in (tx, id) order, in one row: the
# last one scanned (the position moves there, whether the hook takes it or not), how many were
# scanned, the ids and conversations of those of the hook's types, and whether an event after the
# position waits behind a transaction still running (it sorts after every event scanned).
_SCAN: Final = """
with scanned as (
  select e.tx, e.id, e.type, e.conversation_id from bastion.hook_events e
   where (e.tx, e.id) > (%(tx)s::xid8, %(id)s::bigint)
     and e.tx < pg_snapshot_xmin(pg_current_snapshot())
   order by e.tx, e.id
   limit %(limit)s
),
last as (select s.tx, s.id from scanned s order by s.tx desc, s.id desc limit 1),
taken as (select s.tx, s.id, s.conversation_id from scanned s where s.type = any(%(events)s))
select (select l.tx::text from last l), (select l.id from last l), (select count(*) from scanned),
       coalesce((select array_agg(t.id order by t.tx, t.id) from taken t), '{}'),
       coalesce((select array_agg(t.conversation_id::text order by t.tx, t.id) from taken t), '{}'),
       exists (
         select 1 from bastion.hook_events e
          where (e.tx, e.id) > (%(tx)s::xid8, %(id)s::bigint)
            and e.tx >= pg_snapshot_xmin(pg_current_snapshot())
       )
"""


@dataclass(frozen=True, slots=True)
class EventWindow:
    """Events a hook takes next (`taken`: their ids and conversations, in order; `events`: the events
    themselves, when asked for), and the position after everything scanned (`None`: nothing new);
    `full` when the scan hit its limit, so more may be waiting; `behind` when events past the position
    wait for an older transaction still running (they become readable when it ends)."""

    hook: str
    generation: int
    events: list[HookEvent]
    position: tuple[str, int] | None
    full: bool
    behind: bool = False
    taken: list[tuple[int, str]] = field(default_factory=list)


class HookEventPruned(LookupError):
    """A replay asked for an event the outbox no longer holds: retention pruned it."""

    code: ClassVar[str] = "hook_event_pruned"

    def __init__(self, event_id: int, pruned_through_id: int) -> None:
        super().__init__(
            f"Event {event_id} was pruned from the outbox (retention deleted the events through"
            f" {pruned_through_id}); replay from a later event."
        )
        self.event_id = event_id
        self.pruned_through_id = pruned_through_id


@dataclass(frozen=True, slots=True, kw_only=True)
class HookFailure:
    hook: str
    event_id: int
    generation: int
    conversation_id: str
    attempts: int
    error: str
    last_failed_at: datetime
    gave_up: bool
    delivered: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class HookStatus:
    """One hook as an operator sees it: events not yet handed to delivery (`undispatched`, and when
    the oldest was written), deliveries retrying, and deliveries given up."""

    hook: str
    events: tuple[str, ...]
    position_event_id: int
    generation: int
    undispatched: int
    oldest_undispatched_at: datetime | None
    retrying: int
    given_up: int


@dataclass(frozen=True, slots=True)
class ForgottenHook:
    """What `forget` deleted with a hook's subscription: its failure records and conversations held."""

    failures: int
    holds: int


@asynccontextmanager
async def autocommit_connection(pool: Pool) -> AsyncIterator[Connection]:
    """A connection of `pool` in autocommit mode, as a store's pool makes them: each statement outside
    `conn.transaction()` commits by itself, with no round trips to open and close an implicit
    transaction. A connection of another pool gets its mode back when the block ends."""
    async with pool.connection() as conn:
        switched = not conn.autocommit
        if switched:
            await conn.set_autocommit(True)
        try:
            yield conn
        finally:
            if switched and not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE:
                await conn.set_autocommit(False)


def hook_migrations() -> list[Migration]:
    return _migrations("migrations")


async def apply_hooks_migrations(conninfo: str) -> list[int]:
    """Apply the outbox's migrations (component `hooks`), after bastion's own (`apply_migrations`)."""
    return await apply_application_migrations(conninfo, component="hooks", migrations=hook_migrations())


async def apply_chat_table_migrations(conninfo: str) -> list[int]:
    """Apply the chat tables `persist_sessions` writes (component `chat_tables`)."""
    return await apply_application_migrations(
        conninfo, component="chat_tables", migrations=_migrations("chat_migrations")
    )


def _migrations(directory: str) -> list[Migration]:
    return available_migrations("bastion.hooks", directory)


class PostgresHookOutbox:
    """The outbox over a pool connected as the application's role (a member of `bastion_runtime`)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Connection]:
        async with autocommit_connection(self._pool) as conn, conn.transaction():
            yield conn

    async def register(self, hooks: Iterable[Hook]) -> None:
        """Record each hook and its event types; a new hook starts where its `start` says."""
        async with self._transaction() as conn:
            for hook in hooks:
                await conn.execute(
                    _REGISTER,
                    {"hook": hook.name, "events": sorted(hook.events), "latest": hook.start == "latest"},
                )

    @asynccontextmanager
    async def window(
        self, hook: str, *, limit: int = 200, load: bool = True
    ) -> AsyncIterator[tuple[Connection, EventWindow] | None]:
        """Lock `hook`'s position and yield its next events (None when another process holds it or
        the hook is unknown; without `load`, only their ids and conversations); the caller hands them
        to delivery, then `advance`s on the same connection before the block ends, so the position
        moves only past what was handed over."""
        async with self._transaction() as conn:
            row = await (await conn.execute(_LOCK, (hook,))).fetchone()
            if row is None:
                yield None
                return
            events, tx, event_id, generation = row
            params = {"tx": tx, "id": event_id, "limit": limit, "events": events}
            scan = await (await conn.execute(_SCAN, params)).fetchone()
            assert scan is not None
            last_tx, last_id, scanned, taken_ids, conversations, waiting = scan
            taken = list(zip(taken_ids, conversations, strict=True))
            found: list[HookEvent] = []
            if taken and load:
                cursor = await conn.execute(
                    f"select {_EVENT_COLUMNS} from bastion.hook_events e where e.id = any(%s)"
                    " order by e.tx, e.id",
                    (taken_ids,),
                )
                found = [_event(r) for r in await cursor.fetchall()]
            position = (last_tx, last_id) if scanned else None
            full = scanned >= limit
            behind = not full and bool(waiting)
            yield conn, EventWindow(hook, generation, found, position, full, behind, taken)

    async def advance(self, conn: Connection, hook: str, position: tuple[str, int]) -> None:
        await conn.execute(
            "update bastion.hook_subscriptions set position_tx = %s::xid8, position_id = %s,"
            " updated_at = now() where hook = %s",
            (position[0], position[1], hook),
        )

    async def events(self, event_ids: list[int]) -> dict[int, HookEvent]:
        """The events of these ids that the outbox still holds."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                f"select {_EVENT_COLUMNS} from bastion.hook_events e where e.id = any(%s)", (event_ids,)
            )
            rows = await cursor.fetchall()
        return {row[0]: _event(row) for row in rows}

    async def held(self, hook: str, conversations: list[str]) -> set[str]:
        """Those of `conversations` whose events `hook` delivers aside, behind one being retried."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                "select distinct conversation_id::text from bastion.hook_holds"
                " where hook = %s and conversation_id = any(%s::uuid[])",
                (hook, conversations),
            )
            rows = await cursor.fetchall()
        return {row[0] for row in rows}

    async def hold(self, hook: str, deliveries: list[tuple[str, str]]) -> None:
        """Set these (conversation, delivery workflow id) pairs aside (idempotent)."""
        async with self._transaction() as conn, conn.cursor() as cursor:
            await cursor.executemany(
                "insert into bastion.hook_holds (hook, conversation_id, workflow_id) values (%s, %s, %s)"
                " on conflict do nothing",
                [(hook, conversation, workflow_id) for conversation, workflow_id in deliveries],
            )

    async def release(self, hook: str, conversation: str, workflow_id: str) -> None:
        """The delivery `workflow_id` set aside for `conversation` is done."""
        async with self._transaction() as conn:
            await conn.execute(
                "delete from bastion.hook_holds"
                " where hook = %s and conversation_id = %s and workflow_id = %s",
                (hook, conversation, workflow_id),
            )

    async def record_failure(
        self, event: HookEvent, hook: str, generation: int, *, attempt: int, error: str, gave_up: bool
    ) -> None:
        """Record failed attempt `attempt` (idempotent: a repeated record keeps the highest attempt)."""
        async with self._transaction() as conn:
            await conn.execute(
                """
                insert into bastion.hook_failures
                  (hook, event_id, generation, conversation_id, attempts, error, gave_up_at)
                values (%s, %s, %s, %s, %s, %s, case when %s then now() end)
                on conflict (hook, event_id, generation) do update
                   set attempts = greatest(bastion.hook_failures.attempts, excluded.attempts),
                       error = excluded.error, last_failed_at = now(),
                       gave_up_at = coalesce(bastion.hook_failures.gave_up_at, excluded.gave_up_at)
                """,
                (hook, event.id, generation, event.conversation_id, attempt, _storable(error), gave_up),
            )

    async def record_delivered(self, hook: str, event_id: int, generation: int) -> None:
        """A delivery that failed before succeeded at last."""
        async with self._transaction() as conn:
            await conn.execute(
                "update bastion.hook_failures set delivered_at = coalesce(delivered_at, now()) "
                "where hook = %s and event_id = %s and generation = %s",
                (hook, event_id, generation),
            )

    async def failures(self, hook: str | None = None, *, limit: int = 100) -> list[HookFailure]:
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                """
                select hook, event_id, generation, conversation_id::text, attempts, error, last_failed_at,
                       gave_up_at is not null, delivered_at is not null
                  from bastion.hook_failures
                 where %(hook)s::text is null or hook = %(hook)s
                 order by last_failed_at desc
                 limit %(limit)s
                """,
                {"hook": hook, "limit": limit},
            )
            rows = await cursor.fetchall()
        return [
            HookFailure(
                hook=r[0],
                event_id=r[1],
                generation=r[2],
                conversation_id=r[3],
                attempts=r[4],
                error=r[5],
                last_failed_at=r[6],
                gave_up=r[7],
                delivered=r[8],
            )
            for r in rows
        ]

    async def hooks(self) -> list[str]:
        """The names of the subscribed hooks."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute("select hook from bastion.hook_subscriptions order by hook")
            return [name for (name,) in await cursor.fetchall()]

    async def status(self) -> list[HookStatus]:
        """Every registered hook's position, lag and failures."""
        async with self._pool.connection() as conn:
            cursor = await conn.execute(
                """
                select s.hook, s.events, s.position_id, s.generation,
                       (select count(*) from bastion.hook_events e
                         where (e.tx, e.id) > (s.position_tx, s.position_id) and e.type = any(s.events)),
                       (select min(e.created_at) from bastion.hook_events e
                         where (e.tx, e.id) > (s.position_tx, s.position_id) and e.type = any(s.events)),
                       (select count(*) from bastion.hook_failures f
                         where f.hook = s.hook and f.gave_up_at is null and f.delivered_at is null),
                       (select count(*) from bastion.hook_failures f
                         where f.hook = s.hook and f.gave_up_at is not null and f.delivered_at is null)
                  from bastion.hook_subscriptions s
                 order by s.hook
                """
            )
            rows = await cursor.fetchall()
        return [
            HookStatus(
                hook=r[0],
                events=tuple(r[1]),
                position_event_id=r[2],
                generation=r[3],
                undispatched=r[4],
                oldest_undispatched_at=r[5],
                retrying=r[6],
                given_up=r[7],
            )
            for r in rows
        ]

    async def forget(self, hook: str) -> ForgottenHook | None:
        """Delete `hook`'s subscription with its failures and holds, so its position no longer holds
        retention back: for a hook the application no longer registers (a process that still does
        subscribes it afresh, from where its `start` says, when it starts). None when it has none."""
        async with self._transaction() as conn:
            row = await (await conn.execute(_FORGET, {"hook": hook})).fetchone()
        assert row is not None
        return ForgottenHook(failures=row[1], holds=row[2]) if row[0] else None

    async def replay(self, hook: str, from_event_id: int) -> int:
        """Deliver `hook` again from event `from_event_id` on (in delivery order), as a new generation so
        every event is delivered afresh (recorded in `hook_replays`); returns that generation. Unknown
        hook or event: LookupError; an event retention pruned: `HookEventPruned`."""
        async with self._transaction() as conn:
            # The position first, so a concurrent `prune` either sees the replay or runs before it.
            cursor = await conn.execute(
                "select 1 from bastion.hook_subscriptions where hook = %s for update", (hook,)
            )
            if await cursor.fetchone() is None:
                raise LookupError(f"There is no hook named {hook!r}.")
            event = await (
                await conn.execute("select tx::text from bastion.hook_events where id = %s", (from_event_id,))
            ).fetchone()
            if event is None:
                cursor = await conn.execute("select pruned_through_id from bastion.hook_retention")
                pruned = await cursor.fetchone()
                if pruned is not None and from_event_id <= pruned[0]:
                    raise HookEventPruned(from_event_id, pruned[0])
                raise LookupError(f"There is no event {from_event_id} in the outbox.")
            cursor = await conn.execute(
                """
                with replayed as (
                  update bastion.hook_subscriptions
                     set position_tx = %s::xid8, position_id = %s, generation = generation + 1,
                         updated_at = now()
                   where hook = %s
                  returning hook, generation, position_tx, position_id
                )
                insert into bastion.hook_replays (hook, generation, position_tx, position_id)
                select hook, generation, position_tx, position_id from replayed
                returning generation
                """,
                (event[0], from_event_id - 1, hook),
            )
            row = await cursor.fetchone()
            assert row is not None
            return int(row[0])


def _storable(error: str) -> str:
    """An error as Postgres text can hold it: no NUL, no lone surrogate, at most 1 000 characters (a
    hook's message that could not be stored would fail its whole batch, not just the attempt)."""
    return error.replace("\x00", "\\0").encode("utf-8", "replace").decode("utf-8")[:1000]


def _event(row: Sequence[Any]) -> HookEvent:
    return HookEvent(
        id=row[0],
        type=row[1],
        conversation_id=row[2],
        run_id=row[3],
        user_id=row[4],
        tenant_id=row[5],
        signed_in=row[6],
        data=row[7],
        run_event_id=row[8],
        created_at=row[9],
    )
