"""Conversations as the application's entities: agent name, typed state, application columns, filters.

Each behaviour runs on both stores, the Postgres one on a database that also holds the test
application's projects (`tests/entity_app.py`), migrated after bastion's as an application's are.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeAlias

import httpx2
import psycopg
import pytest

from bastion.auth import SupabaseEnv
from bastion.chat.conversations import ConversationRules, conversation_routes
from bastion.stores import (
    AppColumn,
    Conversation,
    ConversationFilter,
    ConversationSchema,
    InvalidFilterError,
    InvalidInputError,
    InvalidStateError,
    PostgresStore,
    SqliteStore,
    StoreIdentity,
    conversation_cursor,
)
from bastion.stores.entities import title_from_text
from bastion.worker import create_agent_worker
from tests.entity_app import SCHEMA, SQLITE_PROJECTS, Checklist, TaskState, projects_database
from tests.pg import PostgresCluster
from tests.supabase_tokens import SigningKeys, es256, user_claims

Store: TypeAlias = PostgresStore | SqliteStore


@pytest.fixture(scope="session")
def projects_db(pg_cluster: PostgresCluster) -> str:
    return projects_database(pg_cluster)


@pytest.fixture
async def pg(pg_cluster: PostgresCluster, projects_db: str) -> AsyncIterator[PostgresStore]:
    async with await PostgresStore.open(
        pg_cluster.dsn(projects_db, user="bastion_app"), max_size=4, schema=SCHEMA
    ) as store:
        yield store


@pytest.fixture
async def lite(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(tmp_path / "app.sqlite3", schema=SCHEMA) as store:
        await store.migrate()
        assert await store.migrate_application(component="projects", migrations=[SQLITE_PROJECTS]) == [1]
        yield store


@pytest.fixture(params=["pg", "lite"])
def store(request: pytest.FixtureRequest) -> Store:
    opened: Store = request.getfixturevalue(request.param)
    return opened


class Projects:
    """The application's own writes to its projects table (as its owner; projects are not bastion's)."""

    def __init__(self, store: Store, pg_cluster: PostgresCluster, projects_db: str, tmp_path: Path) -> None:
        self._postgres = isinstance(store, PostgresStore)
        self._dsn = pg_cluster.dsn(projects_db)
        self._sqlite = tmp_path / "app.sqlite3"

    def create(self, tenant: str | None) -> str:
        project = str(uuid.uuid4())
        if self._postgres:
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                conn.execute(
                    "insert into app.projects (id, tenant_id, name) values (%s, %s, 'p')", (project, tenant)
                )
        else:
            with sqlite3.connect(self._sqlite) as conn:
                conn.execute(
                    "insert into projects (id, tenant_id, name) values (?, ?, 'p')", (project, tenant)
                )
        return project


@pytest.fixture
def projects(store: Store, pg_cluster: PostgresCluster, projects_db: str, tmp_path: Path) -> Projects:
    return Projects(store, pg_cluster, projects_db, tmp_path)


def person(tenant: str | None = "tenant-a") -> StoreIdentity:
    return StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=tenant)


async def test_typed_state_round_trips_as_the_applications_type(store: Store) -> None:
    alice = person()
    created: Conversation[TaskState] = await store.create_conversation(
        alice, agent_name="planner", state=TaskState(step=1, notes=["draft"])
    )
    assert created.agent_name == "planner"
    assert created.state == TaskState(step=1, notes=["draft"])
    read: Conversation[TaskState] = await store.get_conversation(alice, created.id)
    assert isinstance(read.state, TaskState)
    assert read.state == TaskState(step=1, notes=["draft"])
    updated = await store.set_conversation_state(alice, created.id, {"step": 2})
    assert updated.state == TaskState(step=2, notes=[])
    assert (await store.get_conversation(alice, created.id)).state == TaskState(step=2, notes=[])


async def test_a_conversation_without_state_reads_none(store: Store) -> None:
    alice = person()
    created = await store.create_conversation(alice, title="t")
    assert created.state is None
    assert created.agent_name is None
    assert (await store.get_conversation(alice, created.id)).columns == {"project_id": None}


async def test_invalid_state_is_refused_with_a_clear_error_and_nothing_is_stored(store: Store) -> None:
    alice = person()
    with pytest.raises(InvalidStateError) as refused:
        await store.create_conversation(alice, agent_name="planner", state={"step": "not a number"})
    assert refused.value.code == "invalid_state"
    assert refused.value.status == 400
    assert "step" in refused.value.message
    assert "not a number" not in refused.value.message
    assert await store.list_conversations(alice) == []

    created = await store.create_conversation(alice, state=TaskState(step=1))
    with pytest.raises(InvalidStateError):
        await store.set_conversation_state(alice, created.id, {"notes": ["no step"]})
    assert (await store.get_conversation(alice, created.id)).state == TaskState(step=1)


async def test_state_of_someone_elses_conversation_cannot_be_read_or_written(store: Store) -> None:
    alice, bob = person(), person()
    created = await store.create_conversation(alice, state=TaskState(step=1))
    with pytest.raises(Exception) as refused:
        await store.set_conversation_state(bob, created.id, TaskState(step=9))
    assert getattr(refused.value, "code", None) == "not_found"
    assert (await store.get_conversation(alice, created.id)).state == TaskState(step=1)


async def test_a_dataclass_state_is_validated_and_returned_as_the_dataclass(tmp_path: Path) -> None:
    schema = ConversationSchema(state=Checklist)
    async with await SqliteStore.open(tmp_path / "checklists.sqlite3", schema=schema) as store:
        await store.migrate()
        alice = person()
        created = await store.create_conversation(alice, state=Checklist(done=["a"], due="friday"))
        read = await store.get_conversation(alice, created.id)
        assert read.state == Checklist(done=["a"], due="friday")
        with pytest.raises(InvalidStateError):
            await store.set_conversation_state(alice, created.id, {"done": "not a list"})


async def test_a_filter_on_an_application_column_returns_only_the_callers_matching_conversations(
    store: Store, projects: Projects
) -> None:
    alice, bob = person(), person()
    roadmap, launch = projects.create("tenant-a"), projects.create("tenant-a")
    mine = await store.create_conversation(alice, agent_name="planner", columns={"project_id": roadmap})
    await store.create_conversation(alice, agent_name="planner", columns={"project_id": launch})
    await store.create_conversation(alice, agent_name="writer", columns={"project_id": roadmap})
    await store.create_conversation(bob, agent_name="planner", columns={"project_id": roadmap})

    found = await store.list_conversations(
        alice, filter=ConversationFilter(agent_name="planner", columns={"project_id": roadmap})
    )
    assert [c.id for c in found] == [mine.id]
    assert found[0].columns == {"project_id": roadmap}
    in_project = await store.list_conversations(
        alice, filter=ConversationFilter(columns={"project_id": roadmap})
    )
    assert len(in_project) == 2
    assert {c.agent_name for c in in_project} == {"planner", "writer"}


async def test_time_ranges_and_a_cursor_page_through_the_callers_conversations(store: Store) -> None:
    alice = person()
    created = [await store.create_conversation(alice, agent_name="planner", title=str(n)) for n in range(5)]
    newest_first = [c.id for c in reversed(created)]

    pages: list[str] = []
    cursor = None
    while True:
        page = await store.list_conversations(alice, limit=2, filter=ConversationFilter(cursor=cursor))
        pages += [c.id for c in page]
        if len(page) < 2:
            break
        cursor = conversation_cursor(page[-1])
    assert pages == newest_first

    middle = created[2].updated_at
    later = await store.list_conversations(alice, filter=ConversationFilter(updated_after=middle))
    assert [c.id for c in later] == newest_first[:2]
    earlier = await store.list_conversations(alice, filter=ConversationFilter(updated_before=middle))
    assert [c.id for c in earlier] == newest_first[3:]
    future = datetime.now(UTC) + timedelta(days=1)
    assert await store.list_conversations(alice, filter=ConversationFilter(updated_after=future)) == []


@pytest.mark.parametrize(
    ("bad", "parameter"),
    [
        (ConversationFilter(columns={"owner_id": "x"}), "owner_id"),
        (ConversationFilter(columns={"project_id": "not-a-uuid"}), "project_id"),
        (ConversationFilter(agent_name=""), "agent"),
        (ConversationFilter(cursor="12.not-an-id"), "cursor"),
        (ConversationFilter(updated_after=datetime(2026, 1, 1)), "after"),  # naive: which zone?
    ],
)
async def test_a_malformed_filter_names_its_parameter(
    store: Store, bad: ConversationFilter, parameter: str
) -> None:
    with pytest.raises(InvalidFilterError) as refused:
        await store.list_conversations(person(), filter=bad)
    assert refused.value.parameter == parameter
    assert refused.value.code == "invalid_filter"


async def test_an_unregistered_column_cannot_be_written(store: Store) -> None:
    with pytest.raises(InvalidInputError):
        await store.create_conversation(person(), columns={"owner_id": str(uuid.uuid4())})


def test_an_application_column_cannot_shadow_bastions_own() -> None:
    for name in ("owner_id", "tenant_id", "state", "cursor", "Project", "a;drop"):
        with pytest.raises(ValueError):
            AppColumn(name)
    with pytest.raises(ValueError):
        ConversationSchema(columns=[AppColumn("project_id"), AppColumn("project_id")])


class Browser:
    """The conversation routes over a SQLite store with the test application's schema."""

    def __init__(self, http: httpx2.AsyncClient, keys: SigningKeys, env: SupabaseEnv) -> None:
        self.http, self._keys, self._env = http, keys, env

    def headers(self, caller: StoreIdentity) -> dict[str, str]:
        claims = user_claims(
            self._env.issuer,
            time.time(),
            sub=caller.user_id,
            app_metadata={"provider": "email", "tenant_id": caller.tenant_id},
        )
        return {"Authorization": f"Bearer {es256(self._keys, claims)}"}


@contextlib.asynccontextmanager
async def browser(store: SqliteStore, rules: ConversationRules) -> AsyncIterator[Browser]:
    keys = SigningKeys()
    env = SupabaseEnv(url="https://project-ref.supabase.co", jwks=keys.jwks())
    app = create_agent_worker(env=env, routes=conversation_routes(store, rules=rules))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
        yield Browser(http, keys, env)


async def test_the_browser_sees_the_agent_and_columns_but_not_the_state_by_default(lite: SqliteStore) -> None:
    alice = person()
    created = await lite.create_conversation(alice, agent_name="planner", state=TaskState(step=1))
    async with browser(lite, ConversationRules()) as client:
        path = f"/api/conversations/{created.id}"
        shown = (await client.http.get(path, headers=client.headers(alice))).json()
        assert shown["agent_name"] == "planner"
        assert shown["project_id"] is None
        assert "state" not in shown
        listed = (await client.http.get("/api/conversations", headers=client.headers(alice))).json()
        assert "state" not in listed["conversations"][0]
        refused = await client.http.patch(path, json={"state": {"step": 5}}, headers=client.headers(alice))
        assert refused.status_code == 403
    assert (await lite.get_conversation(alice, created.id)).state == TaskState(step=1)


async def test_rules_can_let_the_browser_read_or_write_the_state(lite: SqliteStore) -> None:
    alice = person()
    created = await lite.create_conversation(alice, state=TaskState(step=1))
    path = f"/api/conversations/{created.id}"
    async with browser(lite, ConversationRules(state="read")) as client:
        assert (await client.http.get(path, headers=client.headers(alice))).json()["state"] == {
            "step": 1,
            "notes": [],
        }
        refused = await client.http.patch(path, json={"state": {"step": 5}}, headers=client.headers(alice))
        assert refused.status_code == 403
    async with browser(lite, ConversationRules(state="write")) as client:
        written = await client.http.patch(path, json={"state": {"step": 2}}, headers=client.headers(alice))
        assert written.status_code == 200
        assert written.json()["state"] == {"step": 2, "notes": []}
        invalid = await client.http.patch(
            path, json={"state": {"step": "two"}}, headers=client.headers(alice)
        )
        assert invalid.status_code == 400
        assert invalid.json()["code"] == "invalid_state"
        assert "step" in invalid.json()["message"]
    assert (await lite.get_conversation(alice, created.id)).state == TaskState(step=2)


async def test_the_list_route_filters_by_agent_and_pages_with_next(lite: SqliteStore) -> None:
    alice, bob = person(), person()
    planners = [await lite.create_conversation(alice, agent_name="planner") for _ in range(3)]
    await lite.create_conversation(alice, agent_name="writer")
    await lite.create_conversation(bob, agent_name="planner")
    async with browser(lite, ConversationRules()) as client:
        seen: list[str] = []
        query = "/api/conversations?agent=planner&limit=2"
        while query:
            page = (await client.http.get(query, headers=client.headers(alice))).json()
            seen += [c["id"] for c in page["conversations"]]
            query = f"/api/conversations?agent=planner&limit=2&cursor={page['next']}" if page["next"] else ""
    assert seen == [c.id for c in reversed(planners)]


def test_a_long_first_message_makes_a_title_cut_at_a_word() -> None:
    long = "Please plan the launch of the new pricing page with the marketing team before Friday afternoon"
    title = title_from_text(long, max_length=80)
    assert title == "Please plan the launch of the new pricing page with the marketing team before…"
    assert title is not None and len(title) <= 80
    assert title_from_text("  a  short\n title ", max_length=80) == "a short title"
    assert title_from_text(" \n ", max_length=80) is None
    one_word = "x" * 100  # no word boundary near the end: cut where it must be
    assert title_from_text(one_word, max_length=80) == "x" * 79 + "…"
