"""uvicorn that drains on SIGTERM: running turns finish, then the process stops or leaves them to others.

`DrainingServer(config, drain=drain, seconds=30)` serves like `uvicorn.Server`, except for `SIGTERM`
(what a deploy or an orchestrator sends): it keeps listening while it drains (`bastion.drain`), so a new
turn gets 503 `draining` and `GET /ready` 503 rather than a refused connection, and waits up to
`seconds` for the turns it runs. Once they ended it stops the way uvicorn does (what else is still open,
such as a stream following a turn, gets `timeout_graceful_shutdown`, default `GRACE_SECONDS`). Turns
still running at the deadline are left as a process that died leaves them: `abandon` (by default
`leave_running_turns`) exits at once, writing nothing more for them, so another worker on the database
takes each durable turn over and finishes it (a client reading one resumes its stream there). Letting
them fail or be cancelled here would end them for good.

`SIGINT` (Ctrl+C) and a second `SIGTERM` stop the server at once, as uvicorn does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import Final

from bastion._extras import missing_extra
from bastion.drain import DEFAULT_DRAIN_SECONDS, Drain

try:
    import uvicorn
except ImportError as error:
    raise missing_extra("bastion.draining_server", "assistant", error) from error

__all__ = ["GRACE_SECONDS", "DrainingServer", "leave_running_turns"]

logger = logging.getLogger("bastion.drain")

GRACE_SECONDS: Final = 5.0
"""How long uvicorn lets other open requests finish once the turns have (unless its config says)."""


def leave_running_turns(left: int) -> None:
    """End this process now, as if it died: nothing of its running turns is settled or written."""
    logger.warning("Leaving %d running turn(s) to the other workers.", left)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class DrainingServer(uvicorn.Server):
    """A `uvicorn.Server` whose `SIGTERM` drains `drain` for up to `seconds` first (see the module)."""

    def __init__(
        self,
        config: uvicorn.Config,
        *,
        drain: Drain,
        seconds: float = DEFAULT_DRAIN_SECONDS,
        abandon: Callable[[int], None] = leave_running_turns,
    ) -> None:
        super().__init__(config)
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        self.drain = drain
        self.seconds = seconds
        self._abandon = abandon
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await super().serve(sockets)
        finally:
            if self._draining is not None and not self._draining.done():
                self._draining.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self.drain.draining and not self.should_exit and self._loop:
            # A signal handler runs between two bytecodes of the loop's thread: schedule, do not await.
            self._loop.call_soon_threadsafe(self._start_draining)
            return
        super().handle_exit(sig, frame)

    def _start_draining(self) -> None:
        self.drain.start()
        self._draining = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        logger.info("Stopping: no new turns; %d running, given %s s.", self.drain.running, self.seconds)
        left = await self.drain.wait(self.seconds)
        if left:
            self._abandon(left)
        if self.config.timeout_graceful_shutdown is None:
            self.config.timeout_graceful_shutdown = int(GRACE_SECONDS)
        self.should_exit = True
