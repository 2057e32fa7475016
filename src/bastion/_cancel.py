"""Cancellation of a turn by the application's signal (an `asyncio.Event` that is set)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


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
