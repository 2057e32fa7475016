"""The hooks' dispatcher ends when cancelled, even as a notification wakes it (the close of a process)."""

from __future__ import annotations

import asyncio

from bastion.hooks import HookRegistry
from bastion.hooks.delivery import HookDelivery


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
