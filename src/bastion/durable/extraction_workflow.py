"""Memory extraction's DBOS workflow, declared when `bastion.durable` is imported.

A finished turn's extraction is one job (`bastion.memory.extract`) on the queue
`bastion.memory.extraction`, with the id `bastion.memory.extract:{memory}:{run}`: enqueuing it again
for the same turn finds that workflow and starts nothing. Its input is plain data
(`bastion.memory.extraction_jobs`); the module-level workflow finds what runs it by the memory's
name in `EXTRACTIONS`, registered by `AgentMemory.start` (`bastion.memory.durable_extraction`),
waiting for it while its process starts (`bastion.durable._ready`).

Each attempt is a step that never raises: it says how many facts it stored or why it failed. A failed
attempt is tried again after a durable pause (from the memory's first delay, doubling up to a minute),
`attempts` times in all; then the workflow logs an error and raises `MemoryExtractionFailed`, so
DBOS records it as `ERROR`, which `bastion.memory.failed_extractions` lists.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Final, Protocol

from bastion._extras import missing_extra

try:
    from dbos import DBOS, SetWorkflowID
except ImportError as error:
    raise missing_extra("bastion.durable", "durable", error) from error

from bastion._extraction_names import EXTRACTION_QUEUE, EXTRACTION_WORKFLOW, extraction_job_id
from bastion.durable._ready import REGISTRATION_WAIT_SECONDS, registered

__all__ = [
    "EXTRACTIONS",
    "EXTRACTION_QUEUE",
    "EXTRACTION_WORKFLOW",
    "ExtractionJobRunner",
    "MemoryExtractionFailed",
    "enqueue_extraction",
    "extraction_job_id",
]

logger = logging.getLogger("bastion.memory")

_LONGEST_PAUSE: Final = 60.0


class MemoryExtractionFailed(RuntimeError):
    """A turn's extraction failed every attempt: its workflow ends in ERROR with this."""

    code: ClassVar[str] = "memory_extraction_failed"


class ExtractionJobRunner(Protocol):
    """What runs one attempt of a job from its input (a started `AgentMemory`): the facts stored."""

    async def run_job(self, job: dict[str, Any]) -> int: ...


# The one registry DBOS forces: this process's started memories by name.
EXTRACTIONS: Final[dict[str, ExtractionJobRunner]] = {}


async def enqueue_extraction(job: dict[str, Any]) -> str:
    """Enqueue the job under its id (a job already there, running or ended, is left as it is)."""
    workflow_id = extraction_job_id(job["memory"], job["run_id"])
    with SetWorkflowID(workflow_id):
        await DBOS.enqueue_workflow_async(EXTRACTION_QUEUE, _extraction, job)
    return workflow_id


@DBOS.step(name="bastion.memory.extract.attempt")
async def _attempt(job: dict[str, Any]) -> dict[str, Any]:
    """One attempt: `{"stored": n}`, or `{"failure": "<error type>"}` (the error itself is logged
    here, never stored, as it may quote the conversation)."""
    runner = await registered(lambda: EXTRACTIONS.get(job["memory"]))
    if runner is None:
        logger.error(
            "No memory named %r was started in this process within %.0f s: start it (AgentMemory.start) "
            "in every process that launches the durable engine.",
            job["memory"],
            REGISTRATION_WAIT_SECONDS,
        )
        return {"failure": "memory_not_started"}
    try:
        return {"stored": await runner.run_job(job)}
    except Exception as error:
        logger.warning("Memory extraction of run %s failed.", job["run_id"], exc_info=True)
        return {"failure": type(error).__name__}


@DBOS.workflow(name=EXTRACTION_WORKFLOW)
async def _extraction(job: dict[str, Any]) -> int:
    attempts, pause = int(job["attempts"]), float(job["first_delay"])
    failure = "none"
    for attempt in range(1, attempts + 1):
        outcome = await _attempt(job)
        if "stored" in outcome:
            return int(outcome["stored"])
        failure = str(outcome["failure"])
        if attempt < attempts:
            await DBOS.sleep_async(pause)
            pause = min(pause * 2, _LONGEST_PAUSE)
    logger.error(
        "Memory extraction of run %s failed %d times (last: %s); gave up: its job %s ended in ERROR.",
        job["run_id"],
        attempts,
        failure,
        DBOS.workflow_id,
    )
    raise MemoryExtractionFailed(f"Memory extraction failed {attempts} times (last: {failure}).")
