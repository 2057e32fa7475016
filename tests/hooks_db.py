"""A database of its own for each hooks test: bastion's, the hooks' and the chat tables' migrations,
DBOS's schema, and nothing another test wrote (the outbox is global, so its events must be ours)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from bastion.durable import migrate_durable
from bastion.hooks import apply_chat_table_migrations, apply_hooks_migrations
from bastion.stores import PostgresStore, StoreIdentity, apply_migrations
from tests.pg import ClusterDatabase, PostgresCluster


class HooksDatabase(ClusterDatabase):
    """A database with the hooks' and chat tables' migrations beside bastion's."""

    def execute(self, statement: str, *params: Any) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(statement.encode() if not params else statement, params or None)

    def rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


def create_hooks_database(cluster: PostgresCluster) -> HooksDatabase:
    name = cluster.database("hooks")
    dsn = cluster.dsn(name)

    async def migrate() -> None:
        await apply_migrations(dsn)
        await apply_hooks_migrations(dsn)
        await apply_chat_table_migrations(dsn)

    asyncio.run(migrate())
    cluster.create_login_roles()
    asyncio.run(migrate_durable(dsn, app_role="bastion_app"))
    return HooksDatabase(cluster, name)


@pytest.fixture
def hooks_database(pg_cluster: PostgresCluster) -> HooksDatabase:
    return create_hooks_database(pg_cluster)


@pytest.fixture
async def hooks_store(hooks_database: HooksDatabase) -> AsyncIterator[PostgresStore]:
    async with await PostgresStore.open(hooks_database.app_dsn, max_size=8) as store:
        yield store


def someone(tenant: str | None = "tenant-a", *, anonymous: bool = False) -> StoreIdentity:
    claims: dict[str, Any] = {"aud": "authenticated", "is_anonymous": anonymous}
    return StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=tenant, claims=claims)


async def as_user(
    dsn: str, who: StoreIdentity, statement: str, params: tuple[object, ...] = ()
) -> list[tuple]:
    """One statement in a transaction as `who` (role `authenticated`), connected as `dsn`'s role."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await conn.execute(
            "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)",
            (who.database_claims(),),
        )
        cursor = await conn.execute(statement, params)
        return await cursor.fetchall() if cursor.description else []
