"""Durable execution on DBOS in the application's Postgres: the engine every durable part runs on.

`DurableEngine.launch(conninfo)` starts this process's DBOS (after `migrate_durable` created its
schema); turns, hooks and inbox jobs declare their workflows with DBOS's decorators and run on it.
"""

from bastion.durable.engine import (
    DURABLE_APPLICATION_VERSION,
    DURABLE_SCHEMA,
    DurableEngine,
    DurableEngineError,
    migrate_durable,
    system_database_url,
)

__all__ = [
    "DURABLE_APPLICATION_VERSION",
    "DURABLE_SCHEMA",
    "DurableEngine",
    "DurableEngineError",
    "migrate_durable",
    "system_database_url",
]
