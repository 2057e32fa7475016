"""A database with bastion's, memory's and the inbox's migrations and DBOS's schema, shared by the inbox
tests of one session; helpers to act as staff, as a contact and as a channel."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest

from bastion.durable import migrate_durable
from bastion.inbox import (
    CONTACT_ROLE,
    INBOX_STAFF_ROLE,
    ContactPrincipal,
    InboxChannel,
    PostgresInbox,
    apply_inbox_migrations,
)
from bastion.memory import apply_memory_migrations
from bastion.stores import PostgresStore, StoreIdentity, apply_migrations
from tests.pg import ClusterDatabase, PostgresCluster


class InboxDatabase(ClusterDatabase):
    """The session's database with the inbox's migrations beside bastion's and memory's."""


@pytest.fixture(scope="session")
def inbox_database(pg_cluster: PostgresCluster) -> InboxDatabase:
    name = pg_cluster.database("inbox")
    dsn = pg_cluster.dsn(name)
    asyncio.run(apply_migrations(dsn))
    asyncio.run(apply_memory_migrations(dsn))
    asyncio.run(apply_inbox_migrations(dsn))
    pg_cluster.create_login_roles()
    asyncio.run(migrate_durable(dsn, app_role="bastion_app"))
    return InboxDatabase(pg_cluster, name)


@pytest.fixture
async def inbox_store(inbox_database: InboxDatabase) -> AsyncIterator[PostgresStore]:
    async with await PostgresStore.open(inbox_database.app_dsn, max_size=8) as store:
        yield store


@pytest.fixture
async def inbox(inbox_store: PostgresStore) -> PostgresInbox:
    return PostgresInbox(inbox_store)


def new_tenant() -> str:
    return f"tenant-{uuid.uuid4().hex[:8]}"


def staff_of(tenant: str | None, *, named: bool = True) -> StoreIdentity:
    """A signed-in user of `tenant`, whose token names them inbox staff unless `named` is false."""
    app_metadata = {"roles": [INBOX_STAFF_ROLE]} if named else {}
    claims = {"aud": "authenticated", "app_metadata": app_metadata}
    return StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=tenant, claims=claims)


def channel_of(tenant: str, name: str = "chat") -> InboxChannel:
    return InboxChannel(name=name, tenant_id=tenant, secret=f"secret-{tenant}-{name}-0123456789")


async def as_contact(
    dsn: str, contact: ContactPrincipal, statement: str, params: tuple[object, ...] = ()
) -> list[tuple]:
    """Run one statement in a transaction as the contact's database role, connected as `dsn`'s role."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        await conn.execute(
            "select set_config('role', %s, true), set_config('request.jwt.claims', %s, true)",
            (CONTACT_ROLE, contact.database_claims()),
        )
        cursor = await conn.execute(statement, params)
        return await cursor.fetchall() if cursor.description else []
