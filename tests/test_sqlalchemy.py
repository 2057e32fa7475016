"""bastion's tables in the application's SQLAlchemy `MetaData`, queried as the verified caller."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import URL, Column, ForeignKey, MetaData, Table, Text, Uuid, create_engine, func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bastion.sqlalchemy import bastion_tables, caller_session, exclude_bastion_tables, sync_caller_session
from bastion.stores import PostgresStore, StoreIdentity
from tests.entity_app import SCHEMA, TaskState, projects_database
from tests.pg import PostgresCluster

metadata = MetaData()
projects = Table(
    "projects",
    metadata,
    Column("id", Uuid(as_uuid=False), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    schema="app",
)
agent_tables = bastion_tables(
    metadata, conversation_columns=[Column("project_id", Uuid(as_uuid=False), ForeignKey("app.projects.id"))]
)


@pytest.fixture(scope="module")
def database(pg_cluster: PostgresCluster) -> str:
    return projects_database(pg_cluster)


def url(cluster: PostgresCluster, database: str, user: str) -> URL:
    return URL.create(
        "postgresql+psycopg",
        username=user,
        database=database,
        query={"host": cluster.socket_dir, "port": str(cluster.port)},
    )


@pytest.fixture
async def engine(pg_cluster: PostgresCluster, database: str) -> AsyncIterator[AsyncEngine]:
    created = create_async_engine(url(pg_cluster, database, "bastion_app"))
    yield created
    await created.dispose()


def person() -> StoreIdentity:
    return StoreIdentity(user_id=str(uuid.uuid4()), tenant_id="tenant-a")


async def seed(pg_cluster: PostgresCluster, database: str) -> tuple[StoreIdentity, StoreIdentity]:
    """Alice and Bob each have a planner conversation in the same project of their tenant."""
    project = str(uuid.uuid4())
    with psycopg.connect(pg_cluster.dsn(database), autocommit=True) as conn:
        conn.execute(
            "insert into app.projects (id, tenant_id, name) values (%s, 'tenant-a', 'Roadmap')", (project,)
        )
    alice, bob = person(), person()
    async with await PostgresStore.open(pg_cluster.dsn(database, user="bastion_app"), schema=SCHEMA) as store:
        for owner in (alice, bob):
            await store.create_conversation(
                owner, agent_name="planner", state=TaskState(step=1), columns={"project_id": project}
            )
    return alice, bob


def planner_conversations_with_projects() -> Any:
    conversations = agent_tables.conversations
    return (
        select(conversations.c.id, conversations.c.owner_id, projects.c.name, conversations.c.state)
        .join(projects, projects.c.id == conversations.c.project_id)
        .where(conversations.c.agent_name == "planner")
    )


async def test_a_join_with_an_application_table_returns_only_the_callers_rows(
    pg_cluster: PostgresCluster, database: str, engine: AsyncEngine
) -> None:
    alice, bob = await seed(pg_cluster, database)
    async with caller_session(engine, alice) as session:
        rows = (await session.execute(planner_conversations_with_projects())).all()
    assert [(owner, name, state) for _, owner, name, state in rows] == [
        (alice.user_id, "Roadmap", {"step": 1, "notes": []})
    ]
    async with caller_session(engine, bob) as session:
        rows = (await session.execute(planner_conversations_with_projects())).all()
    assert [owner for _, owner, _, _ in rows] == [bob.user_id]
    stranger = StoreIdentity(user_id=str(uuid.uuid4()), tenant_id="tenant-b")
    async with caller_session(engine, stranger) as session:
        assert (await session.execute(planner_conversations_with_projects())).all() == []
        assert (await session.execute(select(func.count()).select_from(agent_tables.messages))).scalar() == 0


async def test_the_caller_lasts_only_for_its_transaction(engine: AsyncEngine) -> None:
    async with caller_session(engine, person()) as session:
        assert (await session.execute(select(func.current_user()))).scalar() == "authenticated"
    async with engine.connect() as conn:
        assert (await conn.execute(select(func.current_user()))).scalar() == "bastion_app"
        # Without a caller the application role sees nothing: no claims, no rows.
        assert (
            await conn.execute(select(func.count()).select_from(agent_tables.conversations))
        ).scalar() == 0


async def test_a_raw_owner_connection_bypasses_the_rules(pg_cluster: PostgresCluster, database: str) -> None:
    """Documented, for trusted code only: the owner reads every user's rows."""
    await seed(pg_cluster, database)
    owner = create_engine(url(pg_cluster, database, "postgres"))
    app = create_engine(url(pg_cluster, database, "bastion_app"))
    try:
        with owner.connect() as conn:
            everyone = conn.execute(select(func.count()).select_from(agent_tables.conversations)).scalar()
        with sync_caller_session(app, person()) as session:
            nobody = session.execute(select(func.count()).select_from(agent_tables.conversations)).scalar()
    finally:
        owner.dispose()
        app.dispose()
    assert everyone is not None and everyone > 0
    assert nobody == 0


def test_alembic_leaves_bastions_tables_to_bastions_migrations() -> None:
    assert not exclude_bastion_tables(agent_tables.conversations, "conversations", "table", False, None)
    assert not exclude_bastion_tables(agent_tables.conversations.c.state, "state", "column", False, None)
    assert exclude_bastion_tables(projects, "projects", "table", False, None)
