"""Cancellation of a turn by the application's signal (an `asyncio.Event` that is set)."""

from __future__ import annotations

import asyncio
from collections import deque
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

    One task reads the model for the whole request and hands its events over through a buffer, so
    watching `cancel` costs a check per event, not a task and a wait of its own.
    """
    if cancel is None:
        async for event in events:
            yield event
        return
    if cancel.is_set():
        yield None
        return
    buffer: deque[EventT] = deque()
    ready = asyncio.Event()
    ended: list[BaseException | None] = []

    async def read() -> None:
        try:
            async for event in events:
                buffer.append(event)
                ready.set()
        except BaseException as error:
            ended.append(error)
            if isinstance(error, asyncio.CancelledError):
                raise
        else:
            ended.append(None)
        finally:
            ready.set()

    reader = asyncio.ensure_future(read())
    watcher = asyncio.ensure_future(cancel.wait())
    watcher.add_done_callback(lambda _: ready.set())
    try:
        while True:
            if cancel.is_set():
                if not reader.done():
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
                yield None
                return
            if buffer:
                yield buffer.popleft()
            elif ended:
                if ended[0] is not None:
                    raise ended[0]
                return
            else:
                ready.clear()
                await ready.wait()
    finally:
        watcher.cancel()
        if not reader.done():
            reader.cancel()  # the reader itself was cancelled while it waited for the model


def this_task_is_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
