"""Run leases kept alive while this process runs the turn, so a short lease never cuts a live turn.

A run holds its conversation for `lease_seconds` from its last renewal. The lease is what frees a
conversation whose process died without anyone being able to prove it (a machine that vanished);
it is short, so each store renews the leases of the runs it is running every third of a lease,
until the run finishes (or this process dies, which is the point).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Final

__all__ = ["DEFAULT_LEASE_SECONDS", "LeaseKeeper", "new_worker_key"]

logger = logging.getLogger("bastion.stores")

DEFAULT_LEASE_SECONDS: Final = 30.0

Renew = Callable[[list[str], float], Awaitable[None]]


def new_worker_key() -> int:
    """A random positive 63-bit key naming this process's store on the runs it claims."""
    return secrets.randbits(62) + 1


class LeaseKeeper:
    """Renews, through `renew(run_ids, lease_seconds)`, the leases of the runs held here."""

    def __init__(self, renew: Renew) -> None:
        self._renew = renew
        self._held: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    def hold(self, run_id: str, lease_seconds: float) -> None:
        """Keep renewing `run_id`'s lease until `release`; a zero lease is never renewed."""
        if self._closed or lease_seconds <= 0:
            return
        self._held[run_id] = lease_seconds
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._keep())

    def release(self, run_id: str) -> None:
        self._held.pop(run_id, None)

    async def close(self) -> None:
        """Stop renewing: the runs still held keep their lease only until it runs out."""
        self._closed = True
        self._held.clear()
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    async def _keep(self) -> None:
        while self._held:
            await asyncio.sleep(min(self._held.values()) / 3)
            by_lease: dict[float, list[str]] = {}
            for run_id, lease in self._held.items():
                by_lease.setdefault(lease, []).append(run_id)
            for lease, run_ids in by_lease.items():
                try:
                    await self._renew(run_ids, lease)
                except Exception:
                    logger.warning("Renewing the leases of %d runs failed.", len(run_ids), exc_info=True)
