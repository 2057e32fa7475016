"""DBOS for a durable peer's server process: launched on the system's own database, as its users do."""

from __future__ import annotations

from typing import Any

from dbos import DBOS, DBOSConfig

POOL_SIZE = 16


def dbos_url(database_url: str) -> str:
    """DBOS's SQLAlchemy URL (the sync psycopg driver) for the harness's `postgresql://` URI."""
    return "postgresql+psycopg://" + database_url.split("://", 1)[1]


def launch_dbos(name: str, database_url: str) -> Any:
    """Configure and launch this process's DBOS, its system tables in the system's database. Declare
    the workflows and steps first (import their modules)."""
    config: DBOSConfig = {
        "name": name,
        "system_database_url": dbos_url(database_url),
        "sys_db_pool_size": POOL_SIZE,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    return DBOS
