"""Turn throughput with event hooks on against off, and the hooks' delivery lag, in one run.

One embedded Postgres (with `pg_stat_statements`) with two databases: `off` has bastion's migrations
only; `on` adds the outbox, the chat tables and DBOS. `--users` simulated users (16 by default) each
run `--turns` persisted turns back to back (`run_agent`, a scripted model streaming 20 words) in their
own conversation; rounds alternate off and on, in three phases: the outbox written and nothing
delivering; this process delivering the assistant's hooks (`persist_sessions` and the usage counter)
on a launched `DurableEngine` while the turns run; another process (`bench/hooks_worker.py`)
delivering them, as beside the processes serving turns. Reported:
turns/s per configuration (median of the rounds) and their ratio (goal: on >= 0.9x off); the CPU
seconds of this process, of Postgres and of the delivering process per turn, and statements per
turn, from a round's start until its backlog drained (less noisy than wall time on a shared
machine); statements per delivered event; then the delivery lag of `persist_sessions` (in this
process) — from the start of the transaction that wrote the event (`created_at`) to the end of the
hook's write — p50 and p99 over the events of the measured rounds, and how long the backlog took to
drain after a round.

    python -m bench.hooks [--users 16] [--turns 20] [--rounds 3] [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import define_agent
from bastion.chat.headless_turn import run_agent
from bastion.durable import DurableEngine, migrate_durable
from bastion.hooks import (
    HookDelivery,
    HookEvent,
    HookRegistry,
    apply_chat_table_migrations,
    apply_hooks_migrations,
    define_hook,
    delivery_workflow_prefix,
    persist_sessions,
)
from bastion.stores import PostgresStore, apply_application_migrations, apply_migrations, available_migrations
from bench.postgres import BenchPostgres, DatabaseCounters
from bench.servers import children_cpu_seconds, pin_process_tree

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


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Costs:
    """CPU seconds (this process, Postgres) and statements of one configuration's rounds, per turn.
    (A plain class: the benchmark tests load this file without registering it as a module.)"""

    def __init__(self) -> None:
        self.turns, self.statements, self.events = 0, 0, 0
        self.own_cpu, self.postgres_cpu, self.worker_cpu = 0.0, 0.0, 0.0

    def add(
        self, turns: int, own_cpu: float, counters: DatabaseCounters, events: int = 0, worker_cpu: float = 0.0
    ) -> None:
        self.turns += turns
        self.own_cpu += own_cpu
        self.worker_cpu += worker_cpu
        self.postgres_cpu += counters.cpu_seconds
        self.statements += counters.statements
        self.events += events

    def cpu_per_turn(self) -> float:
        """Every process's CPU seconds per turn: this one's, Postgres's and a delivering process's."""
        return (self.own_cpu + self.postgres_cpu + self.worker_cpu) / max(1, self.turns)

    def row(self, label: str) -> str:
        own, server = self.own_cpu / self.turns * 1000, self.postgres_cpu / self.turns * 1000
        return f"| {label} | {own:.1f} | {server:.1f} | {self.statements / self.turns:.1f} |"


async def run(
    *,
    users: int,
    turns: int,
    rounds: int,
    top: int = 0,
    queue_poll: float = 1.0,
    batch_interval: float = 0.5,
    idle: float = 5.0,
    pin: bool = False,
) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bastion-hooks-bench-") as directory:
        postgres = BenchPostgres(Path(directory))
        try:
            database_cores = pin_apart(postgres) if pin else None
            off_uri, on_uri = postgres.create_database("hooks_off"), postgres.create_database("hooks_on")
            await prepare(off_uri, hooks=False)
            await prepare(on_uri, hooks=True)
            return await measure(
                postgres,
                app_dsn(off_uri),
                app_dsn(on_uri),
                users=users,
                turns=turns,
                rounds=rounds,
                top=top,
                queue_poll=queue_poll,
                batch_interval=batch_interval,
                idle=idle,
                worker_cores=database_cores,
            )
        finally:
            postgres.close()


def paired(off: list[float], on: list[float]) -> str:
    """The median and range of each round's rate over the off round run just before it: on a shared
    machine whose speed drifts over minutes, neighbours compare better than medians of whole phases."""
    ratios = sorted(b / a for a, b in zip(off, on, strict=True))
    return f"{statistics.median(ratios):.2f} [{ratios[0]:.2f} to {ratios[-1]:.2f}]"


def pin_apart(postgres: BenchPostgres) -> set[int]:
    """Postgres on the last core, this process on the others, as with the database on a machine of
    its own; returns the database's core (where the delivering process of phase three runs too)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least two cores")
    pin_process_tree(postgres.pid, {cores[-1]})
    os.sched_setaffinity(0, set(cores[:-1]))
    return {cores[-1]}


def app_dsn(admin_uri: str) -> str:
    params = conninfo_to_dict(admin_uri)
    return make_conninfo("", **{**params, "user": "bastion_app", "password": ""})


async def measure(
    postgres: BenchPostgres,
    off_dsn: str,
    on_dsn: str,
    *,
    users: int,
    turns: int,
    rounds: int,
    top: int,
    queue_poll: float,
    batch_interval: float,
    idle: float,
    worker_cores: set[int] | None,
) -> list[str]:
    from bastion.assistant.hooks import usage_counter

    after = [2**62]  # events after the warm-up, once it is known
    costs = {name: Costs() for name in ("off", "outbox", "off2", "on", "off3", "worker")}
    async with (
        await PostgresStore.open(off_dsn, max_size=16) as off,
        await PostgresStore.open(on_dsn, max_size=16) as on,
        await DurableEngine.launch(on_dsn) as engine,
    ):
        sessions = persist_sessions(on.pool)
        called: list[tuple[datetime, Sequence[int]]] = []  # when persist_sessions wrote which events

        async def timed(event: HookEvent) -> None:
            await timed_ids([event.id])

        async def timed_ids(event_ids: Sequence[int]) -> None:
            assert sessions.handle_event_ids is not None
            await sessions.handle_event_ids(event_ids)
            called.append((datetime.now(UTC), event_ids))

        hooks = HookRegistry(
            [
                define_hook(
                    sessions.name,
                    events=sessions.events,
                    handle=timed,
                    handle_event_ids=timed_ids,
                    start="earliest",
                ),
                usage_counter(on),
            ]
        )
        rates: dict[str, list[float]] = {"off": [], "outbox": [], "on": [], "off3": [], "worker": []}
        polls = [0]  # statements the waits for a drained backlog ran, not counted

        async def measured(
            name: str, store: PostgresStore, database: str, drained: Any = None, worker: int | None = None
        ) -> float:
            before, cpu, events = postgres.counters(database), own_cpu_seconds(), outbox_size(on_dsn)
            worker_before = children_cpu_seconds(worker) if worker else 0.0
            rate = await round_of_turns(store, users, turns)
            if drained is not None:
                await drained()
            delivered = outbox_size(on_dsn) - events if drained is not None else 0
            waited, polls[0] = polls[0], 0
            spent = postgres.counters(database) - before
            spent = replace(spent, statements=spent.statements - waited)
            worker_cpu = children_cpu_seconds(worker) - worker_before if worker else 0.0
            costs[name].add(users * turns, own_cpu_seconds() - cpu, spent, delivered, worker_cpu)
            return rate

        await round_of_turns(off, users, 2)  # warm both paths up
        await round_of_turns(on, users, 2)
        # The outbox alone: the triggers write it, nothing delivers yet.
        for _ in range(rounds):
            rates["off"].append(await measured("off", off, "hooks_off"))
            rates["outbox"].append(await measured("outbox", on, "hooks_on"))
        delivery = await HookDelivery.start(
            engine,
            on.pool,
            hooks,
            listen_conninfo=on_dsn,
            queue_polling_interval=queue_poll,
            batch_interval=batch_interval,
        )
        drains: list[float] = []

        async def drained() -> None:
            drained_at = time.perf_counter()
            polls[0] += await wait_drained(on_dsn, sessions.name)
            drains.append(time.perf_counter() - drained_at)

        try:
            await wait_drained(on_dsn, sessions.name)
            after[0] = outbox_size(on_dsn)
            postgres.reset_statements()
            for _ in range(rounds):
                rates["off"].append(await measured("off2", off, "hooks_off"))
                rates["on"].append(await measured("on", on, "hooks_on", drained))
            busiest = postgres.top_statements("hooks_on", top) if top else []
            # Delivery's cost with nothing to deliver: mostly DBOS polling the hooks' queues.
            idle_from, idle_cpu = postgres.counters("hooks_on"), own_cpu_seconds()
            await asyncio.sleep(idle)
            quiet = postgres.counters("hooks_on") - idle_from
            idle_own = (own_cpu_seconds() - idle_cpu) / idle
        finally:
            await delivery.close()
        # Phase three: another process delivers, as beside the processes serving turns.
        async with delivering_process(on_dsn, batch_interval, queue_poll, worker_cores) as worker:
            await wait_drained(on_dsn, sessions.name)
            for _ in range(rounds):
                rates["off3"].append(await measured("off3", off, "hooks_off"))
                rates["worker"].append(await measured("worker", on, "hooks_on", drained, worker))
    worker_rate, off_third = statistics.median(rates["worker"]), statistics.median(rates["off3"])
    lags = delivery_lags(on_dsn, called, after[0])
    worker_cost = costs["worker"]
    off_rate, on_rate = statistics.median(rates["off"][:rounds]), statistics.median(rates["on"])
    outbox_rate = statistics.median(rates["outbox"])
    off_again = statistics.median(rates["off"][rounds:])
    drain = statistics.median(drains)
    ordered = sorted(lags)
    p50 = ordered[len(ordered) // 2] if ordered else float("nan")
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else float("nan")
    on_cost, outbox_cost = costs["on"], costs["outbox"]
    per_event = (on_cost.statements - outbox_cost.statements * on_cost.turns / outbox_cost.turns) / max(
        1, on_cost.events
    )
    return [
        f"| hooks | turns/s (c={users}, median of {rounds}) |",
        "|---|---|",
        f"| off (no outbox) | {off_rate:.1f} |",
        f"| outbox written, nothing delivering | {outbox_rate:.1f} |",
        f"| off, second phase | {off_again:.1f} |",
        f"| on: persist_sessions + usage delivered by this same process | {on_rate:.1f} |",
        f"| off, third phase | {off_third:.1f} |",
        f"| on: delivered by another process | {worker_rate:.1f} |",
        "",
        f"ratio outbox/off: {outbox_rate / off_rate:.2f} (goal >= 0.90 for the turn's own cost);"
        f" in-process delivery/off: {on_rate / off_again:.2f}; delivery by another process/off:"
        f" {worker_rate / off_third:.2f}",
        "",
        "paired ratios (each round against the off round just before it), median [min to max]: outbox/off"
        f" {paired(rates['off'][:rounds], rates['outbox'])}; in-process delivery/off"
        f" {paired(rates['off'][rounds:], rates['on'])}; delivery by another process/off"
        f" {paired(rates['off3'], rates['worker'])}",
        "CPU ratios (all processes' CPU per turn, off over on: the throughput ratio of a saturated machine):"
        f" outbox {costs['off'].cpu_per_turn() / outbox_cost.cpu_per_turn():.2f}; in-process delivery"
        f" {costs['off2'].cpu_per_turn() / on_cost.cpu_per_turn():.2f}; delivery by another process"
        f" {costs['off3'].cpu_per_turn() / worker_cost.cpu_per_turn():.2f}",
        "",
        "| per turn, until drained | this process CPU ms | Postgres CPU ms | statements |",
        "|---|---|---|---|",
        costs["off"].row("off, phase one"),
        outbox_cost.row("outbox written"),
        costs["off2"].row("off, phase two"),
        on_cost.row("delivered in this process"),
        costs["off3"].row("off, phase three"),
        worker_cost.row("delivered by another process"),
        "",
        f"the delivering process: {worker_cost.worker_cpu / worker_cost.turns * 1000:.1f} ms CPU per turn,"
        f" {worker_cost.events} events delivered",
        f"outbox events per turn: {on_cost.events / on_cost.turns:.1f}; statements per outbox event for"
        f" delivery (on minus outbox): {per_event:.2f}",
        "persist_sessions delivery lag (event's transaction start to the end of the hook's write):"
        f" p50 {p50:.0f} ms, p99 {p99:.0f} ms over {len(lags)} events; backlog drained {drain * 1000:.0f} ms"
        " after a round (median)",
        f"delivery with nothing to deliver, per second: this process CPU {idle_own * 1000:.0f} ms,"
        f" Postgres CPU {quiet.cpu_seconds / idle * 1000:.0f} ms,"
        f" {quiet.statements / idle:.0f} statements",
        *(f"{calls:>8} {query}" for calls, query in busiest),
    ]


@asynccontextmanager
async def delivering_process(
    dsn: str, batch_interval: float, queue_poll: float, cores: set[int] | None
) -> AsyncIterator[int]:
    """`bench/hooks_worker.py` delivering the hooks on `dsn` (on `cores`, if given) until the block
    ends; yields its pid."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).with_name("hooks_worker.py")),
        dsn,
        str(batch_interval),
        str(queue_poll),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    if cores is not None:
        os.sched_setaffinity(child.pid, cores)
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        assert line.startswith(b"ready"), line
        yield child.pid
    finally:
        child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 30)
        except TimeoutError:
            child.kill()
            await child.wait()


def delivery_lags(dsn: str, called: list[tuple[datetime, Sequence[int]]], after: int) -> list[float]:
    """Milliseconds from each event's transaction start to the end of the hook's call that wrote it,
    for the events after `after` (read once the rounds are over, so the measured calls read nothing)."""
    written = {event_id: at for at, event_ids in called for event_id in event_ids if event_id > after}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "select id, created_at from bastion.hook_events where id = any(%s)", (list(written),)
        ).fetchall()
    return [(written[event_id] - created).total_seconds() * 1000 for event_id, created in rows]


def outbox_size(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("select coalesce(max(id), 0) from bastion.hook_events").fetchone()
    return int(row[0]) if row else 0


_DRAINED = """
select not exists (
         select 1 from bastion.hook_subscriptions s join bastion.hook_events e
             on (e.tx, e.id) > (s.position_tx, s.position_id) and e.type = any(s.events)
          where s.hook = %s)
   and not exists (
         select 1 from dbos.workflow_status
          where starts_with(workflow_uuid, %s) and status in ('ENQUEUED', 'PENDING'))
"""


async def wait_drained(dsn: str, hook: str) -> int:
    """Wait until `hook` has every event delivered; returns how many statements the waiting ran."""
    polls = 0
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            polls += 1
            row = await (await conn.execute(_DRAINED, (hook, delivery_workflow_prefix(hook)))).fetchone()
            if row and row[0]:
                return polls
            await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queue-poll", type=float, default=1.0, help="seconds between queue polls")
    parser.add_argument(
        "--batch-interval", type=float, default=0.5, help="least seconds between two batches of a hook"
    )
    parser.add_argument("--top", type=int, default=0, help="list the N statements run most with delivery on")
    parser.add_argument(
        "--pin", action="store_true", help="Postgres and the delivering process on a core of their own"
    )
    options = parser.parse_args()
    print("\n".join(asyncio.run(run(**vars(options)))))


if __name__ == "__main__":
    main()
