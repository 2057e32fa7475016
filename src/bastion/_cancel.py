"""Cancellation of a turn by the application's signal (an `asyncio.Event` that is set)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from typing import Any, TypeVar

EventT = TypeVar("EventT")


class AgentCancelledError(Exception):
    """The application's cancellation signal stopped the turn."""

    code = "cancelled"

    def __init__(self) -> None:
        super().__init__("The turn was cancelled.")


async def unless_cancelled(work: Awaitable[Any], cancel: asyncio.Event | None) -> Any:
    """Await `work`; if `cancel` is set first, cancel the work and raise `AgentCancelledError`."""
    if cancel is None:
        return await work
    if cancel.is_set():
        if asyncio.iscoroutine(work):
            work.close()
        raise AgentCancelledError
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    finally:
        waiter.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise AgentCancelledError
    return task.result()


async def until_cancelled(
    events: AsyncIterable[EventT], cancel: asyncio.Event | None
) -> AsyncIterator[EventT | None]:
    """The model's events, then None once `cancel` is set, even while the model is between tokens.

    The events are read in the task that iterates, so an event costs a flag and a check: `cancel`
    interrupts the read only when it is set while this task waits for the model (it cancels the
    task there, and takes that cancellation back); set at any other time, the next check sees it.
    """
    if cancel is None:
        async for event in events:
            yield event
        return
    if cancel.is_set():
        yield None
        return
    reader: asyncio.Task[Any] | None = None  # the task waiting for the model, while it waits
    interrupted: asyncio.Task[Any] | None = None

    def interrupt() -> None:
        nonlocal interrupted
        if reader is not None and interrupted is None:
            interrupted = reader
            reader.cancel()

    watcher = asyncio.ensure_future(cancel.wait())
    watcher.add_done_callback(lambda _: interrupt())
    iterator = aiter(events)
    try:
        while True:
            if cancel.is_set():  # set while no read waited: nothing interrupted
                yield None
                return
            reader = asyncio.current_task()
            try:
                event = await anext(iterator)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if interrupted is None or interrupted.uncancel() > 0:
                    raise  # cancelled from outside too
                yield None
                return
            finally:
                reader = None
            if interrupted is not None:  # the model's read ended despite the interruption
                interrupted.uncancel()
                yield None
                return
            if cancel.is_set():
                yield None
                return
            yield event
    finally:
        watcher.cancel()


def this_task_is_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
