"""Durable extraction jobs as plain data: their names, ids and input, and those that gave up.

With the durable engine, a chat turn's memory extraction is one DBOS workflow (`bastion.memory.extract`,
declared in `bastion.durable.extraction_workflow`) whose id is derived from the memory and the run, so
it is enqueued at most once per turn. Its input holds what extraction needs and nothing more: the turn
owner's user and tenant ids (the row-level security identity its facts are stored under; never the
token's other claims), the conversation and run ids, the turn's messages and the retry settings.

A job that failed every attempt ends in DBOS's `ERROR` status (logged as an error when it gives up),
and one DBOS gave up recovering in `MAX_RECOVERY_ATTEMPTS_EXCEEDED`; `failed_extractions` lists both,
reading DBOS's table, so an operator (or a health check) can see them without launching DBOS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from bastion._extraction_names import EXTRACTION_QUEUE, EXTRACTION_WORKFLOW, extraction_job_id
from bastion.stores import StoreIdentity
from bastion.stores._postgres_connection import Pool

__all__ = [
    "EXTRACTION_QUEUE",
    "EXTRACTION_WORKFLOW",
    "ExtractionJob",
    "FailedExtraction",
    "extraction_job_id",
    "extraction_job_input",
    "failed_extractions",
]

_ENDED_IN_ERROR: Final = ("ERROR", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")
_FAILED: Final = """
select workflow_uuid, status, to_timestamp(updated_at / 1000.0)
  from dbos.workflow_status
 where name = %(name)s and status = any(%(statuses)s)
 order by updated_at desc
 limit %(limit)s
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtractionJob:
    """Who and which turn a durable extraction is for: what its `extract` context is rebuilt from.
    `identity` holds the owner's user and tenant ids only."""

    identity: StoreIdentity
    conversation_id: str
    run_id: str

    @classmethod
    def from_input(cls, job: Mapping[str, Any]) -> ExtractionJob:
        identity = StoreIdentity(user_id=job["user_id"], tenant_id=job["tenant_id"])
        return cls(identity=identity, conversation_id=job["conversation_id"], run_id=job["run_id"])


def extraction_job_input(
    memory: str,
    job: ExtractionJob,
    messages: Sequence[Mapping[str, Any]],
    *,
    attempts: int,
    first_delay: float,
) -> dict[str, Any]:
    """The workflow's input (JSON): see the module."""
    return {
        "memory": memory,
        "user_id": job.identity.user_id,
        "tenant_id": job.identity.tenant_id,
        "conversation_id": job.conversation_id,
        "run_id": job.run_id,
        "messages": [dict(message) for message in messages],
        "attempts": attempts,
        "first_delay": first_delay,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedExtraction:
    """An extraction job that gave up. Why is in the process's log (an error naming the run and the
    job): DBOS stores the raised error pickled, which this does not unpickle."""

    workflow_id: str
    memory: str
    run_id: str
    status: str
    ended_at: datetime


async def failed_extractions(pool: Pool, *, limit: int = 100) -> list[FailedExtraction]:
    """The extraction jobs that ended in an error (or that DBOS gave up recovering), latest first;
    none without DBOS's schema. `pool` connects as the application's role (`store.pool`), which
    `migrate_durable(app_role=...)` lets read DBOS's schema. `bastion memory failures` prints them."""
    async with pool.connection() as conn:
        cursor = await conn.execute("select to_regclass('dbos.workflow_status') is not null")
        found = await cursor.fetchone()
        if not (found and found[0]):
            return []
        params = {"name": EXTRACTION_WORKFLOW, "statuses": list(_ENDED_IN_ERROR), "limit": limit}
        cursor = await conn.execute(_FAILED, params)
        rows = await cursor.fetchall()
    failed = []
    for workflow_id, status, ended_at in rows:
        memory, _, run_id = workflow_id.removeprefix(f"{EXTRACTION_WORKFLOW}:").rpartition(":")
        failed.append(
            FailedExtraction(
                workflow_id=workflow_id,
                memory=memory,
                run_id=run_id,
                status=status,
                ended_at=ended_at,
            )
        )
    return failed
