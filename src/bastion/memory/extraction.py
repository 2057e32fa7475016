"""Facts kept from finished turns: the application's `extract` callback, run off the response path.

After a turn is saved, `ExtractionRunner.schedule` starts the callback as a background task and
returns at once. A failure never reaches the turn: it is logged and retried with a growing delay
(`attempts` times in all), and each fact is remembered with deduplication, so a retry that repeats
facts stores nothing twice. Without the durable engine the retries live in this process only: a
process that stops drops what it has not finished (`drain()` waits for it on shutdown). Once the
memory is started on the engine (`AgentMemory.start`), a chat turn's extraction is a durable job
instead (`bastion.memory.durable_extraction`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias, TypeVar

from bastion.memory.postgres import PostgresMemoryStore
from bastion.stores import StoreIdentity

__all__ = ["ExtractionRunner", "Extractor", "extract_facts"]

logger = logging.getLogger("bastion.memory")

ContextT = TypeVar("ContextT")

Extractor: TypeAlias = Callable[[list[dict[str, Any]], ContextT], Sequence[str] | Awaitable[Sequence[str]]]
"""`extract(messages, context)`: the facts worth keeping from a finished turn's UI messages."""


class ExtractionRunner:
    """Runs extraction tasks in the background, with retries, and lets shutdown wait for them."""

    def __init__(
        self,
        store: PostgresMemoryStore,
        *,
        scope: str,
        attempts: int = 3,
        first_delay: float = 1.0,
    ) -> None:
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError("attempts must be a positive whole number.")
        self._store = store
        self._scope = scope
        self.attempts = attempts
        self.first_delay = first_delay
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(
        self,
        extract: Extractor[ContextT],
        messages: list[dict[str, Any]],
        context: ContextT,
        identity: StoreIdentity,
    ) -> None:
        """Start extracting in the background; returns without waiting."""
        task = asyncio.create_task(self._run(extract, messages, context, identity))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for every scheduled extraction (for shutdown and tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _run(
        self,
        extract: Extractor[ContextT],
        messages: list[dict[str, Any]],
        context: ContextT,
        identity: StoreIdentity,
    ) -> None:
        delay = self.first_delay
        for attempt in range(1, self.attempts + 1):
            try:
                await extract_facts(self._store, self._scope, extract, messages, context, identity)
                return
            except Exception:
                if attempt == self.attempts:
                    logger.exception("Memory extraction failed %d times; giving up on this turn.", attempt)
                    return
                logger.warning("Memory extraction failed (attempt %d); retrying.", attempt, exc_info=True)
            await asyncio.sleep(delay)
            delay *= 2


async def extract_facts(
    store: PostgresMemoryStore,
    scope: str,
    extract: Extractor[ContextT],
    messages: list[dict[str, Any]],
    context: ContextT,
    identity: StoreIdentity,
) -> int:
    """One attempt: `extract` once, and each fact it returns remembered as `identity`; how many."""
    produced = extract(messages, context)
    facts = await produced if inspect.isawaitable(produced) else produced
    if isinstance(facts, str) or not isinstance(facts, Sequence):
        raise TypeError("extract must return a list of facts (strings).")
    stored = 0
    for fact in facts:
        if isinstance(fact, str) and fact.strip():
            await store.remember(identity, fact, scope=scope, source="extract")
            stored += 1
    return stored
