"""Postgres fixtures: one embedded server per test session and one migrated database shared by tests
that isolate themselves by using fresh user ids (row-level security does the rest)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bastion.durable import DurableEngine, migrate_durable
from bastion.stores import PostgresStore, SqliteStore, apply_migrations
from tests.hooks_db import hooks_database, hooks_store  # noqa: F401  (the hooks' fixtures)
from tests.inbox_db import inbox, inbox_database, inbox_store  # noqa: F401  (the inbox's fixtures)
from tests.memory_db import memory_database, memory_store  # noqa: F401  (memory's fixtures)
from tests.oauth_db import oauth_keys, oauth_pool  # noqa: F401  (the OAuth connections' fixtures)
from tests.pg import ClusterDatabase, PostgresCluster


class MigratedDatabase(ClusterDatabase):
    """The session's database with bastion's migrations and DBOS's schema."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long chaos tests run only when asked for (`BASTION_CHAOS=1`, as `.ci/run` does)."""
    if os.environ.get("BASTION_CHAOS") == "1":
        return
    skip = pytest.mark.skip(reason="a chaos test: set BASTION_CHAOS=1 to run it")
    for item in items:
        if "chaos" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pg_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresCluster]:
    cluster = PostgresCluster(tmp_path_factory.mktemp("postgres") / "data")
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def migrated_database(pg_cluster: PostgresCluster) -> MigratedDatabase:
    name = pg_cluster.database()
    asyncio.run(apply_migrations(pg_cluster.dsn(name)))
    pg_cluster.create_login_roles()
    asyncio.run(migrate_durable(pg_cluster.dsn(name), app_role="bastion_app"))
    return MigratedDatabase(pg_cluster, name)


@pytest.fixture
async def store(migrated_database: MigratedDatabase) -> AsyncIterator[PostgresStore]:
    """A store connected as the application role, never as a superuser."""
    store = await PostgresStore.open(
        migrated_database.app_dsn, admin_conninfo=migrated_database.admin_dsn, max_size=8
    )
    async with store:
        yield store


@pytest.fixture
async def postgres_store(migrated_database: MigratedDatabase) -> AsyncIterator[PostgresStore]:
    """The Postgres store under its own name, for suites that run against every store."""
    store = await PostgresStore.open(
        migrated_database.app_dsn, admin_conninfo=migrated_database.admin_dsn, max_size=8
    )
    async with store:
        yield store


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    """A migrated SQLite store on a fresh file."""
    async with await SqliteStore.open(tmp_path / "bastion.sqlite3") as store:
        await store.migrate()
        yield store


@pytest.fixture
async def durable_engine(migrated_database: MigratedDatabase) -> AsyncIterator[DurableEngine]:
    """This test process's DBOS on the migrated database, as the application's role (one at a time)."""
    engine = await DurableEngine.launch(migrated_database.app_dsn, recovery_interval=0.2)
    async with engine:
        yield engine
