"""The names DBOS knows memory extraction jobs by: plain strings, below both the workflow that runs
them (`bastion.durable.extraction_workflow`) and what lists and deletes them (`bastion.memory`,
`bastion.retention`), which work without DBOS installed."""

from __future__ import annotations

from typing import Final

__all__ = ["EXTRACTION_QUEUE", "EXTRACTION_WORKFLOW", "extraction_job_id"]

EXTRACTION_WORKFLOW: Final = "bastion.memory.extract"
EXTRACTION_QUEUE: Final = "bastion.memory.extraction"


def extraction_job_id(memory: str, run_id: str) -> str:
    """The extraction job of a turn's run: one per memory and run, whoever enqueues it."""
    return f"{EXTRACTION_WORKFLOW}:{memory}:{run_id}"
