"""The hooks' dispatcher ends when cancelled, even as a notification wakes it (the close of a process),
and a draining process's dispatcher starts no more batches, leaving the events that follow to another."""

from __future__ import annotations

import asyncio

from bastion.durable import DurableEngine
from bastion.hooks import HookEvent, HookRegistry, define_hook
from bastion.hooks.delivery import HookDelivery
from bastion.stores import PostgresStore
from tests.durable_cluster import until
from tests.hooks_db import HooksDatabase
from tests.test_hooks_delivery import simple_turns


async def test_a_cancel_that_meets_a_wake_up_still_stops_the_dispatcher() -> None:
    delivery = HookDelivery(
        engine=None,  # type: ignore[arg-type]  # the dispatcher's loop alone: no engine, no database
        pool=None,  # type: ignore[arg-type]
        hooks=HookRegistry(),
        listen_conninfo="",
        poll_interval=60.0,
    )
    dispatched = asyncio.Event()

    async def dispatch() -> int:
        dispatched.set()
        return 0

    async def want_wakeups(wanted: bool) -> bool:
        return False

    delivery.dispatch = dispatch  # type: ignore[method-assign]
    delivery._want_wakeups = want_wakeups  # type: ignore[method-assign]
    loop_task = asyncio.ensure_future(delivery._dispatch_forever())
    await dispatched.wait()
    await asyncio.sleep(0)  # the loop now waits for its next wake-up
    # A notification and the close in the same turn of the event loop: with `asyncio.wait_for` on
    # Python 3.11 the cancellation was swallowed and the loop ran on, so `close` never returned.
    delivery.wake()
    loop_task.cancel()
    done, _ = await asyncio.wait({loop_task}, timeout=2)
    assert loop_task in done and loop_task.cancelled()


async def test_a_stopped_dispatcher_starts_no_batch_and_the_next_dispatcher_delivers(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    seen: list[str] = []

    async def record(event: HookEvent) -> None:
        seen.append(event.conversation_id)

    hooks = HookRegistry([define_hook("drained", events={"run.completed"}, handle=record, start="latest")])
    async with await DurableEngine.launch(hooks_database.app_dsn, recovery_interval=1) as engine:

        async def delivering() -> HookDelivery:
            return await HookDelivery.start(
                engine, hooks_store.pool, hooks, listen_conninfo=hooks_database.app_dsn, poll_interval=0.1
            )

        delivery = await delivering()
        try:
            before = await simple_turns(hooks_store, 1)
            await until(lambda: before in seen, 20)
            delivery.stop_dispatching()  # as the process's drain starts
            after = await simple_turns(hooks_store, 1)
            await asyncio.sleep(1.5)  # a notification and fifteen polls
            assert after not in seen
        finally:
            await delivery.close()
        # Another dispatcher (here this process's next one) delivers it.
        delivery = await delivering()
        try:
            await until(lambda: after in seen, 20)
        finally:
            await delivery.close()
