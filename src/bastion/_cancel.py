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
    """The model's events, then None once `cancel` is set, even while the model is between tokens."""
    if cancel is None:
        async for event in events:
            yield event
        return
    iterator = aiter(events)
    waiter = asyncio.ensure_future(cancel.wait())
    step: asyncio.Future[EventT] | None = None
    try:
        while not cancel.is_set():
            step = asyncio.ensure_future(anext(iterator))
            await asyncio.wait({step, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
                break
            try:
                yield step.result()
            except StopAsyncIteration:
                return
        yield None
    finally:
        waiter.cancel()
        if step is not None and not step.done():
            step.cancel()  # the reader itself was cancelled while it waited for the model


def this_task_is_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
