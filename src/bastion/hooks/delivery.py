"""Delivery of the outbox to hooks on DBOS, so a dead worker's deliveries are finished by a live one.

Each process runs a dispatcher: woken by the outbox's notifications (channel `bastion_hooks`) and
polling slowly as well, it takes each hook's next events and starts one workflow delivering all of
them, grouped by conversation in order, with the id
`bastion.hook:{hook}:{first event id}-{last event id}` (zero-padded, so ids sort in event order; a
replay adds `:r{generation}`), then moves the hook's position. Starting an id again is a no-op, so
a dispatcher that dies between the start and the move loses nothing: the next one starts the same
batch again, or (if more events arrived meanwhile) a longer one, whose events already handed over
are delivered a second time — at least once, as always. A hook's batches run one at a time, in
order, and start at least `batch_interval` apart: the dispatcher starts none while one of the
hook's batches is in flight in any process (it looks for one in DBOS's table under the position's
lock), and events arriving meanwhile wait in the outbox for the next, so a busy system hands them
over in fewer, larger batches (each workflow costs DBOS a few transactions however many events it
carries); with little load a batch starts as soon as its events are written. A batch whose process
dies is recovered by a live process's janitor (`DurableEngine`).

The outbox's triggers notify only while a dispatcher waits for them (`bastion.hook_wakeups`,
migration 0004): a dispatcher with a batch in flight or one due soon says it needs no wake-up, and
says so again once it has nothing left to look at. Notifying makes a transaction's commit wait for
every other notifying transaction's, so under load the turns' commits no longer queue on that; an
event written just as a dispatcher falls idle may wait for its slow poll (`poll_interval`).

Batches are started, not enqueued: a queue would add a wait for its next poll, and polling a queue
often enough for a short lag cost more CPU than delivering. Each hook still has a queue of its own
(`bastion.hooks.{hook}`, polled every `queue_polling_interval`), partitioned with one delivery at a
time per partition, for the conversations set aside. A batch
calls the hook in its workflow with each conversation's events in order; when an event fails (and may be
retried), the batch sets that conversation aside: it records a hold and enqueues a delivery of the
conversation's remaining events in the conversation's partition, which retries the failed event with
a durable sleep between attempts (the hook's `RetryPolicy`) before the next, then releases the hold.
Later batches hand a held conversation's events to its partition too, so they stay in order behind
the retried one, while the hook's other conversations go on in the batches: a broken event holds up
only its own conversation of its own hook, never a turn (turns only write the outbox), another hook
or another conversation. Every failed attempt is recorded for the operator; after the last one the
delivery gives up on that event and goes on (`replay` delivers it again).

Workflows earlier versions enqueued (batches in the queue's `~batches` partition, and
`bastion.hooks.deliver`, one per conversation) still run from the hook's queue, and a batch waiting
there counts as in flight, so deliveries in flight across an upgrade finish, in order.

An outbox that cannot be reached (a transient database error, `psycopg.OperationalError`, not the
hook's own) fails no delivery: a batch sets the conversations it could not finish aside, and a lane
pauses durably (from 1 s, doubling up to a minute) and tries its step again until the outbox answers.

A worker killed after the hook acted and before DBOS recorded the outcome (the batch's end, or a
retry's step) makes the next worker call the hook again with those events: delivery is at least
once, and a hook keyed by `HookEvent.id` acts once in effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

import psycopg
from dbos import DBOS, SetWorkflowID

from bastion.durable import DurableEngine
from bastion.hooks._batches import (
    BATCH_WORKFLOWS,
    Aside,
    Batch,
    SetAside,
    activate,
    deactivate,
    deliver_events,
    delivery_workflow_id,
    delivery_workflow_prefix,
    hook_queue_name,
)
from bastion.hooks.events import HookEvent
from bastion.hooks.outbox import Connection, Pool, PostgresHookOutbox, autocommit_connection
from bastion.hooks.registry import Hook, HookRegistry

__all__ = [
    "CHANNEL",
    "HookDelivery",
    "delivery_workflow_id",
    "delivery_workflow_prefix",
    "hook_queue_name",
]

logger = logging.getLogger("bastion.hooks")

CHANNEL: Final = "bastion_hooks"
_BEHIND_RETRY: Final = 0.02
# A hook's batch in flight: any of its batch workflows not finished, started or enqueued anywhere.
_IN_FLIGHT: Final = (
    "select exists (select 1 from dbos.workflow_status where status in ('ENQUEUED', 'PENDING')"
    " and name = any(%s) and starts_with(workflow_uuid, %s))"
)
# Conversations of a batch a hook taking no whole batch is called for at once (each in order).
_CONVERSATIONS_AT_ONCE: Final = 8


class HookDelivery:
    """This process's delivery of the outbox to `hooks`: a dispatcher plus the hooks' DBOS queues.

    Start it with `await HookDelivery.start(engine, pool, hooks, listen_conninfo=...)` after the
    engine launched; one per process (DBOS is one per process). `pool` connects as the application's
    role; `listen_conninfo` is a direct (session) connection for notifications.
    """

    def __init__(
        self,
        engine: DurableEngine,
        pool: Pool,
        hooks: HookRegistry,
        *,
        listen_conninfo: str,
        poll_interval: float = 1.0,
        batch_size: int = 500,
        batch_interval: float = 0.5,
    ) -> None:
        self.engine = engine
        self._pool = pool
        self.outbox: Final = PostgresHookOutbox(pool)
        self.hooks: Final = hooks
        self._listen_conninfo = listen_conninfo
        self._poll = poll_interval
        self._batch = batch_size
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._behind = False
        self._interval = batch_interval
        # Per hook: its batch running in this process, and when its next batch may start.
        self._running: dict[str, asyncio.Future[int]] = {}
        self._next_start: dict[str, float] = {}
        self._due: float | None = None
        self._wakeups_wanted: bool | None = None  # as this process last set `hook_wakeups`

    @classmethod
    async def start(
        cls,
        engine: DurableEngine,
        pool: Pool,
        hooks: HookRegistry,
        *,
        listen_conninfo: str,
        poll_interval: float = 1.0,
        batch_size: int = 500,
        queue_polling_interval: float = 1.0,
        batch_interval: float = 0.5,
    ) -> HookDelivery:
        """Register the hooks and their queues (each polled every `queue_polling_interval` seconds, the
        wait before a conversation set aside is delivered again), then dispatch until `close`. A hook's
        batches start at least `batch_interval` seconds apart, so a busy outbox is handed over in
        fewer, larger batches (each delivery workflow costs DBOS a few transactions)."""
        delivery = cls(
            engine,
            pool,
            hooks,
            listen_conninfo=listen_conninfo,
            poll_interval=poll_interval,
            batch_size=batch_size,
            batch_interval=batch_interval,
        )
        await delivery.outbox.register(hooks)
        for hook in hooks:
            await engine.register_queue(
                hook_queue_name(hook.name),
                partition_concurrency=1,
                polling_interval_sec=queue_polling_interval,
            )
        activate(delivery)
        delivery._tasks = [
            asyncio.ensure_future(delivery._listen()),
            asyncio.ensure_future(delivery._dispatch_forever()),
        ]
        return delivery

    def hook(self, name: str) -> Hook:
        hook = self.hooks.get(name)
        if hook is None:
            raise LookupError(f"No hook named {name!r} is registered in this process.")
        return hook

    def wake(self) -> None:
        self._wake.set()

    async def dispatch(self) -> int:
        """Start a batch of each hook's next events where none is in flight; returns how many."""
        started = 0
        self._behind, self._due = False, None
        for hook in self.hooks:
            running = self._running.get(hook.name)
            if running is not None and not running.done():
                continue  # its end wakes the dispatcher
            due = self._next_start.get(hook.name, 0.0)
            if time.monotonic() < due:
                self._wait_until(due)
                continue
            async with self.outbox.window(hook.name, limit=self._batch, load=False) as opened:
                if opened is None:
                    continue
                conn, window = opened
                batch: dict[str, list[int]] = {}
                for event_id, conversation in window.taken:
                    batch.setdefault(conversation, []).append(event_id)
                if batch:
                    if await self._in_flight(conn, hook.name):
                        # Another process's batch (or one recovered, or enqueued by an earlier version).
                        self._wait_until(time.monotonic() + self._interval)
                        continue
                    first, last = window.taken[0][0], window.taken[-1][0]
                    await self._start(hook, first, last, batch, window.generation)
                    started += 1
                if window.position is not None:
                    await self.outbox.advance(conn, hook.name, window.position)
                self._behind = self._behind or window.behind or window.full
        return started

    def _wait_until(self, due: float) -> None:
        self._due = due if self._due is None else min(self._due, due)

    async def _in_flight(self, conn: Connection, hook: str) -> bool:
        cursor = await conn.execute(_IN_FLIGHT, (list(BATCH_WORKFLOWS), delivery_workflow_prefix(hook)))
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def _start(
        self, hook: Hook, first: int, last: int, batch: dict[str, list[int]], generation: int
    ) -> None:
        with SetWorkflowID(delivery_workflow_id(hook.name, first, last, generation)):
            handle = await DBOS.start_workflow_async(
                deliver_events, hook.name, list(batch.items()), generation
            )
        self._next_start[hook.name] = time.monotonic() + self._interval
        running = asyncio.ensure_future(handle.get_result())
        running.add_done_callback(self._batch_ended)
        self._running[hook.name] = running

    def _batch_ended(self, running: asyncio.Future[int]) -> None:
        if not running.cancelled() and running.exception() is not None:
            logger.warning("A hook's delivery batch failed.", exc_info=running.exception())
        self._wake.set()

    async def attempt_batch(self, hook_name: str, batch: Batch, generation: int) -> Aside:
        hook = self.hook(hook_name)
        held = await self.outbox.held(hook_name, [conversation for conversation, _ in batch])
        aside: Aside = [(conversation, ids, 0) for conversation, ids in batch if conversation in held]
        batch = [(conversation, ids) for conversation, ids in batch if conversation not in held]
        event_ids = [event_id for _, ids in batch for event_id in ids]
        by_ids = hook.handle_event_ids
        if by_ids is not None and event_ids and await self._took_whole(hook, lambda: by_ids(event_ids)):
            return aside
        events = await self.outbox.events(event_ids)
        whole = hook.handle_batch
        if whole is not None and events:
            in_order = [events[event_id] for event_id in event_ids if event_id in events]
            if await self._took_whole(hook, lambda: whole(in_order)):
                return aside
        gate = asyncio.Semaphore(_CONVERSATIONS_AT_ONCE)

        async def conversation_of(conversation: str, event_ids: list[int]) -> SetAside | None:
            async with gate:
                for index, event_id in enumerate(event_ids):
                    event = events.get(event_id)
                    if event is None:
                        continue  # no longer in the outbox: nothing to deliver
                    try:
                        failed = await self._call(hook, event, generation, 1)
                    except psycopg.OperationalError:
                        # The outbox, not the hook: its lane tries the event again once it answers.
                        logger.warning(
                            "Hook %s's delivery could not reach the outbox.", hook_name, exc_info=True
                        )
                        return conversation, event_ids[index:], 0
                    if failed and hook.retry.max_attempts > 1:
                        return conversation, event_ids[index:], 1
            return None

        outcomes = await asyncio.gather(*(conversation_of(c, ids) for c, ids in batch))
        return aside + [outcome for outcome in outcomes if outcome is not None]

    async def _took_whole(self, hook: Hook, call: Callable[[], Awaitable[None]]) -> bool:
        """Whether the hook took a whole batch at once (`call`); when it raised, the batch goes out
        event by event, which finds the failing event and retries it alone."""
        try:
            async with asyncio.timeout(hook.timeout):
                await call()
        except Exception:
            logger.info("Hook %s failed on a batch; delivering it event by event.", hook.name, exc_info=True)
            return False
        return True

    async def attempt(
        self, hook_name: str, event_ids: list[int], generation: int, attempt: int
    ) -> tuple[int, str | None]:
        hook = self.hook(hook_name)
        events = await self.outbox.events(event_ids)
        for index, event_id in enumerate(event_ids):
            tries = attempt if index == 0 else 1
            event = events.get(event_id)
            if event is None:
                continue  # no longer in the outbox: nothing to deliver
            error = await self._call(hook, event, generation, tries)
            if error is not None:
                return index, error
            if tries > 1:
                await self.outbox.record_delivered(hook_name, event_id, generation)
        return len(event_ids), None

    async def _call(self, hook: Hook, event: HookEvent, generation: int, tries: int) -> str | None:
        """Call the hook with one event (its `tries`th try); the error, recorded, if it failed."""
        try:
            async with asyncio.timeout(hook.timeout):
                await hook.handle(event)
        except Exception as error:
            text = f"{type(error).__name__}: {_message_of(error)}"
            gave_up = tries >= hook.retry.max_attempts
            logger.warning(
                "Hook %s failed on event %s (attempt %s%s).",
                hook.name,
                event.id,
                tries,
                ", giving up" if gave_up else "",
                exc_info=True,
            )
            await self.outbox.record_failure(
                event, hook.name, generation, attempt=tries, error=text, gave_up=gave_up
            )
            return text
        return None

    async def _dispatch_forever(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.dispatch()
                idle = self._idle()
                if await self._want_wakeups(idle) and idle:
                    continue  # woken by nobody until now: look again for events written meanwhile
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("Dispatching hook events failed; trying again.", exc_info=True)
            # Committed events behind a transaction still running: look again soon, as that
            # transaction's end may notify nobody. A hook waiting for its next batch's start: then.
            wait = _BEHIND_RETRY if self._behind else self._poll
            if self._due is not None:
                wait = min(wait, max(0.0, self._due - time.monotonic()))
            # `asyncio.timeout`, not `wait_for`: on Python 3.11, `wait_for` swallows a cancellation that
            # arrives as the event is set (a notification as `close` cancels), and this loop never ends.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    def _idle(self) -> bool:
        """Whether nothing but a notification would make this dispatcher look at the outbox soon."""
        running = any(not batch.done() for batch in self._running.values())
        return not running and not self._behind and self._due is None

    async def _want_wakeups(self, wanted: bool) -> bool:
        """Say whether this dispatcher waits for the outbox's notifications (the triggers notify only
        while one does); returns whether that changed."""
        if self._wakeups_wanted is wanted:
            return False
        async with autocommit_connection(self._pool) as conn:
            await conn.execute("update bastion.hook_wakeups set wanted = %s", (wanted,))
        self._wakeups_wanted = wanted
        return True

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._listen_conninfo, autocommit=True
                ) as conn:
                    await conn.execute(f"listen {CHANNEL}")
                    self._wake.set()
                    async for _ in conn.notifies():
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("Listening for hook events failed; reconnecting.", exc_info=True)
                await asyncio.sleep(self._poll)

    def stop_dispatching(self) -> None:
        """Start no more batches, for good (a draining process: `Drain.on_start`). The batches running
        here go on; the other processes' dispatchers deliver the events that follow. `close` still
        ends the rest."""
        for task in self._tasks:
            task.cancel()

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Stop waiting for the batches (shielded: DBOS's own tasks run on, or are recovered).
        for running in self._running.values():
            running.cancel()
        self._running.clear()
        deactivate(self)


def _message_of(error: Exception) -> str:
    """The error's message; a message that cannot be read is not the hook's failure to deliver."""
    try:
        return str(error)
    except Exception:
        return "(its message could not be read)"
