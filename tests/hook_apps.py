"""Hooks the delivery tests run, in the test process and in worker processes the tests kill.

Each records every call in `public.hook_calls` (so a redelivery shows) and its effect once per event
in `public.hook_effects` (keyed by the event id, as a real hook keys its writes):
- `recorder` takes every event type; while `public.hook_hold` names an event type, it stops after
  recording the effect of such an event and before returning, as a worker about to die would.
- `flaky` fails its first three calls of every event.
- `broken` always fails, and waits long between attempts.
- `garbled` fails its first call of every event with a message Postgres cannot store as it is.
- `picky` fails every event of a conversation named in `public.hook_refused`, retrying often.
- `batcher` takes whole batches (`handle_batch`, each recorded in `public.hook_batches`), failing
  one with an event of a refused conversation; event by event it is `picky`.
- `id_batcher` is `batcher` taking its batches as event ids (`handle_event_ids`), reading the events
  from the outbox in SQL.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

from bastion.hooks import EVENT_TYPES, Hook, HookEvent, HookRegistry, RetryPolicy, define_hook

TABLES = """
create table if not exists public.hook_calls (
  hook text not null, event_id bigint not null, type text not null, conversation_id uuid not null,
  executor text not null, at timestamptz not null default clock_timestamp()
);
create table if not exists public.hook_effects (
  hook text not null, event_id bigint not null, type text not null, conversation_id uuid not null,
  seq bigint generated always as identity, primary key (hook, event_id)
);
create table if not exists public.hook_hold (type text primary key);
create table if not exists public.hook_refused (conversation_id uuid primary key);
create table if not exists public.hook_batches (
  hook text not null, event_ids bigint[] not null, seq bigint generated always as identity
);
grant select, insert on public.hook_calls, public.hook_effects, public.hook_batches to bastion_app;
grant select on public.hook_hold, public.hook_refused to bastion_app;
"""

FAST: RetryPolicy = RetryPolicy(max_attempts=5, first_delay=0.01, backoff_rate=2.0, max_delay=0.05)


def _dsn() -> str:
    return os.environ["BASTION_TEST_HOOKS_DSN"]


async def _call(conn: psycopg.AsyncConnection[Any], hook: str, event: HookEvent) -> int:
    await conn.execute(
        "insert into public.hook_calls (hook, event_id, type, conversation_id, executor)"
        " values (%s, %s, %s, %s, %s)",
        (hook, event.id, event.type, event.conversation_id, os.environ.get("BASTION_EXECUTOR_ID", "test")),
    )
    cursor = await conn.execute(
        "select count(*) from public.hook_calls where hook = %s and event_id = %s", (hook, event.id)
    )
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _effect(conn: psycopg.AsyncConnection[Any], hook: str, event: HookEvent) -> None:
    await conn.execute(
        "insert into public.hook_effects (hook, event_id, type, conversation_id) values (%s, %s, %s, %s)"
        " on conflict do nothing",
        (hook, event.id, event.type, event.conversation_id),
    )


async def recorder(event: HookEvent) -> None:
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        await _call(conn, "recorder", event)
        await _effect(conn, "recorder", event)
        while True:
            cursor = await conn.execute("select 1 from public.hook_hold where type = %s", (event.type,))
            if await cursor.fetchone() is None:
                return
            await asyncio.sleep(0.05)


async def flaky(event: HookEvent) -> None:
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        if await _call(conn, "flaky", event) <= 3:
            raise RuntimeError("flaky fails its first three calls")
        await _effect(conn, "flaky", event)


async def garbled(event: HookEvent) -> None:
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        if await _call(conn, "garbled", event) == 1:
            raise ValueError("a NUL \x00 and a lone surrogate \ud800 " + "x" * 2000)
        await _effect(conn, "garbled", event)


async def broken(event: HookEvent) -> None:
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        await _call(conn, "broken", event)
    raise RuntimeError("broken always fails")


async def _refused(conn: psycopg.AsyncConnection[Any], conversations: list[str]) -> bool:
    cursor = await conn.execute(
        "select 1 from public.hook_refused where conversation_id = any(%s::uuid[])", (conversations,)
    )
    return await cursor.fetchone() is not None


def _picky(name: str) -> Callable[[HookEvent], Awaitable[None]]:
    async def picky(event: HookEvent) -> None:
        async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
            await _call(conn, name, event)
            if await _refused(conn, [event.conversation_id]):
                raise RuntimeError(f"{name} refuses conversation {event.conversation_id}")
            await _effect(conn, name, event)

    return picky


async def batcher_batch(events: Sequence[HookEvent]) -> None:
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        await conn.execute(
            "insert into public.hook_batches (hook, event_ids) values ('batcher', %s)",
            ([e.id for e in events],),
        )
        if await _refused(conn, [event.conversation_id for event in events]):
            raise RuntimeError("batcher refuses a batch with a refused conversation")
        async with conn.transaction():
            for event in events:
                await _effect(conn, "batcher", event)


async def id_batcher_batch(event_ids: Sequence[int]) -> None:
    async with await psycopg.AsyncConnection.connect(_dsn(), autocommit=True) as conn:
        await conn.execute(
            "insert into public.hook_batches (hook, event_ids) values ('id_batcher', %s)", (list(event_ids),)
        )
        cursor = await conn.execute(
            "select 1 from bastion.hook_events e join public.hook_refused r using (conversation_id)"
            " where e.id = any(%s)",
            (list(event_ids),),
        )
        if await cursor.fetchone() is not None:
            raise RuntimeError("id_batcher refuses a batch with a refused conversation")
        await conn.execute(
            "insert into public.hook_effects (hook, event_id, type, conversation_id)"
            " select 'id_batcher', e.id, e.type, e.conversation_id"
            "   from unnest(%s::bigint[]) with ordinality as given (id, ord)"
            "   join bastion.hook_events e on e.id = given.id"
            "  order by given.ord"
            " on conflict do nothing",
            (list(event_ids),),
        )


PATIENT: RetryPolicy = RetryPolicy(max_attempts=100, first_delay=0.05, backoff_rate=1.5, max_delay=0.2)

HOOKS: dict[str, Hook] = {
    "recorder": define_hook("recorder", events=EVENT_TYPES, handle=recorder, retry=FAST, start="earliest"),
    "flaky": define_hook("flaky", events=EVENT_TYPES, handle=flaky, retry=FAST, start="earliest"),
    "garbled": define_hook("garbled", events=EVENT_TYPES, handle=garbled, retry=FAST, start="earliest"),
    "broken": define_hook(
        "broken",
        events=EVENT_TYPES,
        handle=broken,
        retry=RetryPolicy(max_attempts=3, first_delay=30, max_delay=30),
        start="earliest",
    ),
    "picky": define_hook(
        "picky", events=EVENT_TYPES, handle=_picky("picky"), retry=PATIENT, start="earliest"
    ),
    "batcher": define_hook(
        "batcher",
        events=EVENT_TYPES,
        handle=_picky("batcher"),
        handle_batch=batcher_batch,
        retry=PATIENT,
        start="earliest",
    ),
    "id_batcher": define_hook(
        "id_batcher",
        events=EVENT_TYPES,
        handle=_picky("id_batcher"),
        handle_event_ids=id_batcher_batch,
        retry=PATIENT,
        start="earliest",
    ),
}


def registry(*names: str) -> HookRegistry:
    return HookRegistry(HOOKS[name] for name in names)
