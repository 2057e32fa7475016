"""Durable execution on DBOS in the application's Postgres: the engine every durable part runs on.

`DurableEngine.launch(conninfo)` starts this process's DBOS (after `migrate_durable` created its
schema). Chat turns run on it with `chat_routes(durable=engine)` (`bastion.chat.durable_turns`; their
workflow is declared in `bastion.durable.turn_workflow`, on import), and so does memory extraction
(`AgentMemory.start(engine)`; its workflow is in `bastion.durable.extraction_workflow`), and so does
scheduled retention (`bastion.retention.Retention.start(engine)`; its workflow is in
`bastion.durable.retention_workflow`); hooks and inbox jobs declare their workflows with DBOS's
decorators and run on it.
"""

from bastion._moved import moved_names
from bastion.durable.engine import (
    DURABLE_APPLICATION_VERSION,
    DURABLE_SCHEMA,
    DurableEngine,
    DurableEngineError,
    migrate_durable,
    system_database_url,
)
from bastion.durable.extraction_workflow import MemoryExtractionFailed, extraction_job_id
from bastion.durable.retention_workflow import RetentionNotStarted
from bastion.durable.turn_workflow import DurableTurnError, turn_workflow_id

__getattr__ = moved_names(
    __name__,
    {name: "bastion.chat.durable_turns" for name in ("DurableTurns", "prune_finished_turns")},
)

__all__ = [
    "DURABLE_APPLICATION_VERSION",
    "DURABLE_SCHEMA",
    "DurableEngine",
    "DurableEngineError",
    "DurableTurnError",
    "DurableTurns",
    "MemoryExtractionFailed",
    "RetentionNotStarted",
    "extraction_job_id",
    "migrate_durable",
    "prune_finished_turns",
    "system_database_url",
    "turn_workflow_id",
]
