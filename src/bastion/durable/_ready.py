"""What a workflow needs from its process, waited for when DBOS runs the workflow before it is there.

DBOS recovers and dequeues work from the moment it launches (its queues live in the database, so a
new process dequeues jobs of queues it has not registered yet), while a process registers its chat
routes, hooks and inbox after launching it, since they need the engine. So a recovered turn, hook
delivery or inbox reply may start in a process still starting up: each looks up what it runs on
through `registered`, which waits for it (up to `REGISTRATION_WAIT_SECONDS`) instead of failing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final, TypeVar

__all__ = ["REGISTRATION_WAIT_SECONDS", "registered"]

REGISTRATION_WAIT_SECONDS: Final = 30.0
_POLL_SECONDS: Final = 0.05

T = TypeVar("T")


async def registered(find: Callable[[], T | None], *, timeout: float = REGISTRATION_WAIT_SECONDS) -> T | None:
    """What `find` returns once it returns something, polling up to `timeout` seconds; else None."""
    deadline = time.monotonic() + timeout
    while (found := find()) is None:
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(_POLL_SECONDS)
    return found
