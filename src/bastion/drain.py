"""Draining a worker that was told to stop: no new turn, the running ones finish, readiness fails.

A deploy replaces workers one by one. A worker told to stop (`SIGTERM`) should not cut a reply short
while another worker can serve: it `start`s its `Drain`, after which the chat routes answer a new turn
with 503 `draining` (and `Retry-After`, storing nothing), and `GET /ready` answers 503 so a load
balancer stops sending it requests. The turns it is running carry on; `wait(timeout)` returns once
they have all ended, or at the deadline with how many are left. Durable turns left at the deadline are
finished by another worker once this process is gone (`bastion.durable`); stopping the process is the
server's part (`bastion.draining_server` does it for uvicorn).

A `Drain` counts the turns of the chat endpoints built with it (`chat_routes(drain=...)`), from the
moment a request is admitted until its turn settles, taken-over turns included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import ClassVar, Final, Literal

from starlette.requests import Request
from starlette.responses import Response

from bastion.api import StrictModel, json_response, operation
from bastion.errors import BastionError
from bastion.worker import RequestContext, Route

__all__ = ["DEFAULT_DRAIN_SECONDS", "Drain", "DrainingError", "Readiness", "TurnHold"]

logger = logging.getLogger("bastion.drain")

DEFAULT_DRAIN_SECONDS: Final = 30.0
"""How long a stopping worker lets its running turns finish, unless the application says otherwise."""


class DrainingError(BastionError):
    """This worker is stopping and takes no new turn: the client tries again (another worker answers)."""

    code: ClassVar[str] = "draining"
    status: ClassVar[int] = 503
    retry_after: ClassVar[int] = 1

    def __init__(self) -> None:
        super().__init__("This server is restarting. Try again in a moment.")

    @property
    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": str(self.retry_after)}


class Readiness(StrictModel):
    """The worker takes new turns."""

    status: Literal["ready"]


class TurnHold:
    """One admitted turn, counted until `release` (which may be called more than once)."""

    def __init__(self, drain: Drain) -> None:
        self._drain: Drain | None = drain

    def release(self) -> None:
        drain, self._drain = self._drain, None
        if drain is not None:
            drain._released()


class Drain:
    """The drain of one process's chat endpoints; see the module's docstring."""

    def __init__(self) -> None:
        self._draining = False
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_start: list[Callable[[], object]] = []

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def running(self) -> int:
        """Turns admitted and not yet settled."""
        return self._running

    def admit(self) -> TurnHold:
        """Count a new turn, or refuse it with `DrainingError` once draining."""
        if self._draining:
            raise DrainingError()
        return self.hold()

    def hold(self) -> TurnHold:
        """Count a turn this process already runs (one taken over, one opened by an admitted request),
        draining or not."""
        self._running += 1
        self._idle.clear()
        return TurnHold(self)

    def on_start(self, callback: Callable[[], object]) -> None:
        """Call `callback` when the drain starts (a durable engine stops taking over dead workers' turns)."""
        self._on_start.append(callback)

    def start(self) -> None:
        """From now on, refuse new turns and report not ready."""
        if self._draining:
            return
        self._draining = True
        for callback in self._on_start:
            # One failing (a part already closed) must not stop the others, nor the drain itself.
            try:
                callback()
            except Exception:
                logger.exception("A drain callback failed; the drain goes on.")

    async def wait(self, timeout: float) -> int:
        """Wait up to `timeout` seconds for the running turns to end; how many are still running."""
        if timeout > 0 and self._running:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for may swallow a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._idle.wait()
        return self._running

    async def __call__(self, timeout: float = DEFAULT_DRAIN_SECONDS) -> int:
        """`start`, then `wait(timeout)`: the turns still running at the deadline."""
        self.start()
        return await self.wait(timeout)

    def _released(self) -> None:
        self._running -= 1
        if self._running == 0:
            self._idle.set()

    def ready_route(self, path: str = "/ready") -> Route:
        """`GET /ready`: 200 while this worker takes new turns, 503 `draining` once it is stopping."""
        return Route(method="GET", path=path, auth="none", handler=self.ready)

    @operation(responses={200: Readiness}, errors={503: (DrainingError.code,)})
    async def ready(self, request: Request, context: RequestContext) -> Response:
        """Whether this worker takes new turns: a load balancer sends to it only while this says ready."""
        if self._draining:
            raise DrainingError()
        return json_response(Readiness(status="ready"))
