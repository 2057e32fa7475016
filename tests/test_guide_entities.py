"""The entity examples of the guide (`docs/conversations.md`: `run_agent`, then SQLAlchemy) run as written."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import URL
from sqlalchemy.ext.asyncio import create_async_engine

from bastion.stores import PostgresStore, SqliteStore, StoreIdentity
from tests.entity_app import SCHEMA, projects_database
from tests.pg import PostgresCluster
from tests.scripted import ScriptedModel

ROOT = Path(__file__).resolve().parent.parent


def guide_example(name: str, page: str = "conversations.md") -> dict[str, Any]:
    """The namespace of the guide page's `py` block that defines `name`."""
    readme = (ROOT / "docs" / page).read_text()
    [block] = [b for b in re.findall(r"```py\n(.*?)```", readme, flags=re.DOTALL) if f"def {name}(" in b]
    namespace: dict[str, Any] = {}
    exec(block, namespace)
    return namespace


async def test_the_guides_run_agent_example_continues_its_conversation(tmp_path: Path) -> None:
    ask_twice = guide_example("ask_twice")["ask_twice"]
    model = ScriptedModel(["A framework for serving agents."], ["Agents, served."])
    user_id = str(uuid.uuid4())
    async with await SqliteStore.open(tmp_path / "readme.sqlite3") as store:
        await store.migrate()
        assert await ask_twice(store, user_id, model) == "Agents, served."
        [conversation] = await store.list_conversations(StoreIdentity(user_id=user_id))
        assert conversation.agent_name == "helper"
        assert len(await store.list_messages(StoreIdentity(user_id=user_id), conversation.id)) == 4
    assert "A framework for serving agents." in str(model.requests[1].messages)


async def test_the_guides_sqlalchemy_example_returns_only_the_callers_rows(
    pg_cluster: PostgresCluster,
) -> None:
    database = projects_database(pg_cluster)
    project = str(uuid.uuid4())
    with psycopg.connect(pg_cluster.dsn(database), autocommit=True) as conn:
        conn.execute(
            "insert into app.projects (id, tenant_id, name) values (%s, 'tenant-a', 'Launch')", (project,)
        )
    alice, bob = (StoreIdentity(user_id=str(uuid.uuid4()), tenant_id="tenant-a") for _ in range(2))
    async with await PostgresStore.open(pg_cluster.dsn(database, user="bastion_app"), schema=SCHEMA) as store:
        mine = await store.create_conversation(alice, agent_name="planner", columns={"project_id": project})
        await store.create_conversation(alice, agent_name="writer", columns={"project_id": project})
        await store.create_conversation(bob, agent_name="planner", columns={"project_id": project})

    conversations_with_projects = guide_example("conversations_with_projects")["conversations_with_projects"]
    engine = create_async_engine(
        URL.create(
            "postgresql+psycopg",
            username="bastion_app",
            database=database,
            query={"host": pg_cluster.socket_dir, "port": str(pg_cluster.port)},
        )
    )
    try:
        assert await conversations_with_projects(engine, alice, "planner") == [f"{mine.id} in Launch"]
    finally:
        await engine.dispose()
