"""Delivery on DBOS: every event reaches a hook once in effect even when the delivering worker is killed
between the call and its acknowledgement, a failing hook is retried in order per conversation, and a
broken hook holds up neither turns nor other hooks."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bastion.durable import DurableEngine
from bastion.hooks import (
    EVENT_TYPES,
    HookDelivery,
    HookEvent,
    HookRegistry,
    PostgresHookOutbox,
    define_hook,
    queued_deliveries,
)
from bastion.stores import PostgresStore
from tests import hook_apps
from tests.hook_scenarios import assistant_message, every_event_type, turn, user_message
from tests.hooks_db import HooksDatabase, someone

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def hook_tables(hooks_database: HooksDatabase) -> HooksDatabase:
    hooks_database.execute(hook_apps.TABLES)
    os.environ["BASTION_TEST_HOOKS_DSN"] = hooks_database.admin_dsn
    return hooks_database


@asynccontextmanager
async def delivering(
    database: HooksDatabase, store: PostgresStore, *names: str
) -> AsyncIterator[HookDelivery]:
    engine = await DurableEngine.launch(database.app_dsn, recovery_interval=0.2)
    async with engine:
        delivery = await HookDelivery.start(
            engine,
            store.pool,
            hook_apps.registry(*names),
            listen_conninfo=database.app_dsn,
            poll_interval=0.2,
        )
        try:
            yield delivery
        finally:
            await delivery.close()


async def until(check: Callable[[], Any], timeout: float = 60.0) -> None:
    """Wait for `check()` to hold; the bound only keeps a broken test from hanging."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check() if asyncio.iscoroutinefunction(check) else not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def dispatched(database: HooksDatabase, hook: str) -> bool:
    """Whether `hook`'s position has passed every event of the outbox."""
    rows = database.rows(
        "select 1 from bastion.hook_subscriptions s join bastion.hook_events e"
        " on (e.tx, e.id) > (s.position_tx, s.position_id) where s.hook = %s",
        hook,
    )
    return rows == []


async def until_broken_retries_alone(
    database: HooksDatabase, store: PostgresStore
) -> list[tuple[int, str, str]]:
    """Wait until `recorder` has taken every event of the outbox and finished its deliveries, and
    `broken`'s position has passed them all while its delivery retries the first; the outbox's events."""
    expected = outbox_ids(database)
    await until(lambda: len(effects(database, "recorder")) == len(expected))
    await until(lambda: database.rows("select 1 from bastion.hook_failures where hook = 'broken'"))
    await until(lambda: dispatched(database, "broken"))

    async def recorder_done() -> bool:
        return "recorder" not in await queued_deliveries(store.pool)

    await until(recorder_done)
    return expected


def outbox_ids(database: HooksDatabase) -> list[tuple[int, str, str]]:
    return database.rows("select id, type, conversation_id::text from bastion.hook_events order by id")  # type: ignore[return-value]


def effects(database: HooksDatabase, hook: str) -> list[tuple[int, str, str]]:
    return database.rows(  # type: ignore[return-value]
        "select event_id, type, conversation_id::text from public.hook_effects where hook = %s order by seq",
        hook,
    )


def calls(database: HooksDatabase, hook: str) -> dict[int, int]:
    rows = database.rows("select event_id, count(*) from public.hook_calls where hook = %s group by 1", hook)
    return {event_id: count for event_id, count in rows}


def per_conversation(rows: list[tuple[int, str, str]]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for event_id, _, conversation in rows:
        grouped.setdefault(conversation, []).append(event_id)
    return grouped


async def simple_turns(store: PostgresStore, count: int) -> str:
    who = someone()
    conversation = (await store.create_conversation(who)).id
    for index in range(count):
        await turn(store, who, conversation, [user_message(f"u{index}")], assistant_message(f"a{index}"))
    return conversation


async def test_a_flaky_hook_sees_each_event_once_in_order_and_a_broken_one_holds_up_nothing(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    async with delivering(database, hooks_store, "recorder", "flaky", "broken") as delivery:
        await asyncio.gather(*(simple_turns(hooks_store, 3) for _ in range(3)))
        expected = outbox_ids(database)
        assert len(expected) == 3 * 3 * 4
        await until(lambda: len(effects(database, "flaky")) == len(expected))
        await until(lambda: len(effects(database, "recorder")) == len(expected))
        # Every event once in effect, after exactly three failed calls each, in order per conversation.
        flaky = effects(database, "flaky")
        assert sorted(flaky) == expected
        assert per_conversation(flaky) == per_conversation(expected)
        assert set(calls(database, "flaky").values()) == {4}
        assert per_conversation(effects(database, "recorder")) == per_conversation(expected)
        # Meanwhile the broken hook has delivered nothing and is still retrying its first events.
        assert effects(database, "broken") == []
        await until(lambda: database.rows("select 1 from bastion.hook_failures where hook = 'broken'"))

        # Its deliveries set aside record their last success and release their conversations.
        async def flaky_done() -> bool:
            return (await queued_deliveries(hooks_store.pool)).get("flaky", 0) == 0

        await until(flaky_done)
        status = {s.hook: s for s in await delivery.outbox.status()}
        assert status["broken"].retrying >= 1 and status["broken"].given_up == 0
        assert status["flaky"].retrying == 0 and status["recorder"].undispatched == 0
        assert database.rows("select 1 from bastion.hook_holds where hook = 'flaky'") == []
        failures = await delivery.outbox.failures("flaky")
        assert {f.attempts for f in failures} == {3} and all(f.delivered for f in failures)
        assert failures[0].error == "RuntimeError: flaky fails its first three calls"


async def _start_worker(database: HooksDatabase, executor: str, *hooks: str) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "BASTION_TEST_HOOKS_DSN": database.admin_dsn,
        "BASTION_TEST_APP_DSN": database.app_dsn,
        "BASTION_EXECUTOR_ID": executor,
    }
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.hook_worker",
        *hooks,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 60)
    assert line.startswith(b"ready"), (line, await child.stderr.read() if child.stderr else b"")
    return child


async def test_every_event_type_reaches_a_hook_once_in_effect_when_its_worker_is_killed_before_the_ack(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    database.execute("insert into public.hook_hold values ('run.completed')")
    dead = f"dead-{uuid.uuid4().hex[:8]}"
    worker = await _start_worker(database, dead, "recorder")
    try:
        conversation = await every_event_type(hooks_store, someone())
        expected = outbox_ids(database)
        assert {kind for _, kind, _ in expected} == EVENT_TYPES
        # The worker called the hook with the first `run.completed` and holds before acknowledging it.
        [held] = [event_id for event_id, kind, _ in expected if kind == "run.completed"][:1]
        await until(lambda: calls(database, "recorder").get(held) == 1)
        worker.send_signal(signal.SIGKILL)
        await worker.wait()
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    database.execute("delete from public.hook_hold")
    async with delivering(database, hooks_store, "recorder") as delivery:
        await until(lambda: len(effects(database, "recorder")) == len(expected))
        assert dead in delivery.engine.recovered
    delivered = effects(database, "recorder")
    assert delivered == expected and {kind for _, kind, _ in delivered} == EVENT_TYPES
    assert per_conversation(delivered) == {conversation: [event_id for event_id, _, _ in expected]}
    # The held event was called again by the live worker; its effect is still single.
    assert calls(database, "recorder")[held] == 2


async def test_a_delivery_recovered_before_its_new_worker_started_delivering_waits_and_completes(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    """A restart on the same database: the new process's DBOS hands it the dead worker's batch before
    it started delivering; the batch waits for the delivery, and every event takes effect once."""
    database = hook_tables
    database.execute("insert into public.hook_hold values ('run.completed')")
    dead = f"dead-{uuid.uuid4().hex[:8]}"
    worker = await _start_worker(database, dead, "recorder")
    try:
        await simple_turns(hooks_store, 3)
        expected = outbox_ids(database)
        [held] = [event_id for event_id, kind, _ in expected if kind == "run.completed"][:1]
        await until(lambda: calls(database, "recorder").get(held) == 1)
        worker.send_signal(signal.SIGKILL)
        await worker.wait()
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    database.execute("delete from public.hook_hold")
    engine = await DurableEngine.launch(database.app_dsn, recovery_interval=0.2)
    async with engine:
        await until(lambda: dead in engine.recovered, 30)
        await asyncio.sleep(1.0)  # the recovered batch runs meanwhile, with no delivery yet
        delivery = await HookDelivery.start(
            engine, hooks_store.pool, hook_apps.registry("recorder"), listen_conninfo=database.app_dsn
        )
        try:
            await until(lambda: len(effects(database, "recorder")) == len(expected), 30)
        finally:
            await delivery.close()
    assert effects(database, "recorder") == expected
    assert calls(database, "recorder")[held] == 2


async def test_a_replay_delivers_a_hook_again_from_an_event_as_a_new_generation(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    async with delivering(database, hooks_store, "recorder") as delivery:
        await simple_turns(hooks_store, 2)
        expected = outbox_ids(database)
        await until(lambda: len(effects(database, "recorder")) == len(expected))
        generation = await delivery.outbox.replay("recorder", expected[4][0])
        assert generation == 1
        delivery.wake()
        await until(lambda: sum(calls(database, "recorder").values()) == len(expected) + len(expected) - 4)
    assert effects(database, "recorder") == expected
    assert [count for _, count in sorted(calls(database, "recorder").items())] == [1] * 4 + [2] * (
        len(expected) - 4
    )
    with pytest.raises(LookupError):
        await PostgresHookOutbox(hooks_store.pool).replay("nobody", expected[0][0])
    with pytest.raises(LookupError):
        await PostgresHookOutbox(hooks_store.pool).replay("recorder", 10**12)


def bastion_hooks(database: HooksDatabase, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "DATABASE_URL": database.admin_dsn,
        "BASTION_APP_DATABASE_URL": database.app_dsn,
    }
    done = subprocess.run(
        [sys.executable, "-m", "bastion.cli", "hooks", *args, "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


async def test_the_bastion_hooks_command_lists_lag_and_failures_and_replays_a_hook(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, tmp_path: Path
) -> None:
    database = hook_tables
    async with delivering(database, hooks_store, "recorder", "broken"):
        await simple_turns(hooks_store, 1)
        expected = await until_broken_retries_alone(database, hooks_store)
        code, listed, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path)
        assert code == 0
        rows = {line.split()[0]: line.split()[1:] for line in listed.splitlines()[1:]}
        # broken: everything dispatched, its first event retrying, the rest waiting behind it.
        assert rows["broken"][:2] == [str(expected[-1][0]), "0"]
        assert int(rows["broken"][3]) >= 1 and rows["broken"][4:] == ["1", "0", "0"]
        assert rows["recorder"][1:] == ["0", "-", "0", "0", "0", "0"]
        code, failed, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path, "failures", "broken")
        assert code == 0
        assert f"broken event {expected[0][0]} (generation 0" in failed
        assert "retrying after 1 attempt(s)" in failed and "RuntimeError: broken always fails" in failed
        code, replayed, _ = await asyncio.to_thread(
            bastion_hooks, database, tmp_path, "replay", "recorder", "--from", str(expected[0][0])
        )
        assert (code, replayed.strip()) == (
            0,
            f"recorder delivers again from event {expected[0][0]} on (generation 1).",
        )
        await until(lambda: set(calls(database, "recorder").values()) == {2})
    assert effects(database, "recorder") == expected


def test_a_replay_without_a_hook_or_an_event_is_refused_before_connecting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from bastion.cli import main

    assert main(["hooks", "replay", "usage", "--data-dir", str(tmp_path)]) == 2
    assert main(["hooks", "replay", "--from", "3", "--data-dir", str(tmp_path)]) == 2
    assert "replay needs a hook and --from EVENT_ID" in capsys.readouterr().err


async def test_a_hook_runs_on_the_loop_that_started_delivery_where_the_applications_pool_lives(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def probe(event: HookEvent) -> None:
        loops.append(asyncio.get_running_loop())
        async with hooks_store.pool.connection() as conn:  # the pool was opened on this test's loop
            await conn.execute("select 1")

    hooks = HookRegistry([define_hook("probe", events={"run.completed"}, handle=probe, start="earliest")])
    async with await DurableEngine.launch(hooks_database.app_dsn, recovery_interval=1) as engine:
        delivery = await HookDelivery.start(
            engine,
            hooks_store.pool,
            hooks,
            listen_conninfo=hooks_database.app_dsn,
            queue_polling_interval=0.02,
        )
        try:
            await simple_turns(hooks_store, 2)
            await until(lambda: len(loops) == 2)
        finally:
            await delivery.close()
    assert loops == [asyncio.get_running_loop()] * 2
