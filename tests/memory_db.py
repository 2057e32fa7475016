"""A database with bastion's and memory's migrations, shared by the memory tests of one session."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from bastion.memory import HashingEmbedder, PostgresMemoryStore, apply_memory_migrations
from bastion.stores import PostgresStore, StoreIdentity, apply_migrations
from tests.pg import ClusterDatabase, PostgresCluster


class MemoryDatabase(ClusterDatabase):
    """The session's database with bastion's and memory's migrations."""


@pytest.fixture(scope="session")
def memory_database(pg_cluster: PostgresCluster) -> MemoryDatabase:
    name = pg_cluster.database("memory")
    dsn = pg_cluster.dsn(name)
    asyncio.run(apply_migrations(dsn))
    asyncio.run(apply_memory_migrations(dsn))
    pg_cluster.create_login_roles()
    return MemoryDatabase(pg_cluster, name)


@pytest.fixture
async def memory_store(memory_database: MemoryDatabase) -> AsyncIterator[PostgresMemoryStore]:
    """Memory as the application role, with the lexical test embedder (deterministic)."""
    async with await PostgresStore.open(memory_database.app_dsn, max_size=4) as store:
        yield PostgresMemoryStore(store, embedder=HashingEmbedder(64))


def someone(tenant: str | None = None) -> StoreIdentity:
    return StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=tenant, claims={"aud": "authenticated"})


async def as_user(
    dsn: str, who: StoreIdentity, statement: str, params: tuple[object, ...] = ()
) -> list[tuple]:
    """Run one statement in a transaction as `who`, connected as `dsn`'s login role."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await conn.execute(
            "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)",
            (who.database_claims(),),
        )
        cursor = await conn.execute(statement, params)
        return await cursor.fetchall() if cursor.description else []
