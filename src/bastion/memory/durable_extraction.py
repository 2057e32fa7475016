"""An agent memory's extraction as durable jobs on the `DurableEngine`, once started there.

`await memory.start(engine, context=...)` registers the memory by name in this process (every process
that launches the engine must start the same memories: a job may run in any of them) and the queue
its jobs run on. From then on a finished chat turn (`ChatEndpoint(after_turn=memory.after_chat_turn)`)
enqueues its extraction as a job whose id is derived from the run, so a turn taken over by another
process, or finished twice, still has one job. The job runs in whichever process dequeues it, maybe
after the one that enqueued it died, so `extract`'s context is rebuilt there from the job
(`context(ExtractionJob)`), never carried in it. Facts are stored as the turn's owner, with
deduplication, so an attempt run again after a crash stores nothing twice. See
`bastion.durable.extraction_workflow` for the retries and the failed state.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Generic, TypeAlias, TypeVar

from bastion.durable import DurableEngine
from bastion.durable.extraction_workflow import EXTRACTIONS, enqueue_extraction
from bastion.memory.extraction import Extractor, extract_facts
from bastion.memory.extraction_jobs import EXTRACTION_QUEUE, ExtractionJob, extraction_job_input
from bastion.memory.postgres import PostgresMemoryStore

__all__ = ["DurableExtraction", "JobContext"]

ContextT = TypeVar("ContextT")

JobContext: TypeAlias = Callable[[ExtractionJob], "ContextT | Awaitable[ContextT]"]
"""`context(job)`: the context `extract` gets in a durable job, rebuilt from the job."""


class DurableExtraction(Generic[ContextT]):
    """One memory's extraction jobs: enqueued after a turn, run from a job's input in any process."""

    def __init__(
        self,
        *,
        name: str,
        store: PostgresMemoryStore,
        scope: str,
        extract: Extractor[ContextT],
        context: JobContext[ContextT],
        attempts: int,
        first_delay: float,
    ) -> None:
        self.name = name
        self._store = store
        self._scope = scope
        self._extract = extract
        self._context = context
        self._attempts = attempts
        self._first_delay = first_delay

    async def start(self, engine: DurableEngine, *, concurrency: int) -> None:
        """Run this memory's jobs in this process (at most `concurrency` at once)."""
        running = EXTRACTIONS.get(self.name)
        if running is not None and running is not self:
            raise RuntimeError(f"A memory named {self.name!r} already runs extraction jobs in this process.")
        await engine.register_queue(EXTRACTION_QUEUE, worker_concurrency=concurrency)
        EXTRACTIONS[self.name] = self

    def stop(self) -> None:
        if EXTRACTIONS.get(self.name) is self:
            del EXTRACTIONS[self.name]

    async def enqueue(self, job: ExtractionJob, messages: Sequence[Mapping[str, Any]]) -> str:
        """Enqueue the turn's job (once: a second enqueue for its run finds the first); its id."""
        job_input = extraction_job_input(
            self.name, job, messages, attempts=self._attempts, first_delay=self._first_delay
        )
        return await enqueue_extraction(job_input)

    async def run_job(self, job_input: dict[str, Any]) -> int:
        """One attempt of a job: `extract` with the context rebuilt from it, facts stored as its owner."""
        job = ExtractionJob.from_input(job_input)
        built = self._context(job)
        context: ContextT = await built if inspect.isawaitable(built) else built
        messages = [dict(message) for message in job_input["messages"]]
        return await extract_facts(self._store, self._scope, self._extract, messages, context, job.identity)
