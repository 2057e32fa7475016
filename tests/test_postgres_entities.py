"""What the database itself enforces for conversation entities: who may write agent names and state,
tenant scoping through an application's relation (over HTTP and over direct SQL), and the upgrade of
a database made by earlier migrations."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx2
import psycopg
import pytest

from bastion.auth import SupabaseEnv
from bastion.chat.conversations import conversation_routes
from bastion.stores import (
    ConversationFilter,
    PostgresStore,
    StoreIdentity,
    apply_migrations,
    available_migrations,
)
from bastion.worker import create_agent_worker
from tests.entity_app import SCHEMA, TaskState, projects_database
from tests.pg import PostgresCluster
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"
ENTITIES_MIGRATION = next(m.version for m in available_migrations() if m.name == "conversation_entities")


@dataclass(frozen=True)
class Database:
    cluster: PostgresCluster
    name: str

    def dsn(self, user: str = "postgres") -> str:
        return self.cluster.dsn(self.name, user=user)


@pytest.fixture(scope="module")
def database(pg_cluster: PostgresCluster) -> Database:
    return Database(pg_cluster, projects_database(pg_cluster))


@pytest.fixture
async def store(database: Database) -> AsyncIterator[PostgresStore]:
    async with await PostgresStore.open(database.dsn("bastion_app"), max_size=4, schema=SCHEMA) as opened:
        yield opened


def person(tenant: str | None = "tenant-a") -> StoreIdentity:
    return StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=tenant)


def create_project(database: Database, tenant: str) -> str:
    project = str(uuid.uuid4())
    with psycopg.connect(database.dsn(), autocommit=True) as conn:
        conn.execute("insert into app.projects (id, tenant_id, name) values (%s, %s, 'p')", (project, tenant))
    return project


def move_project(database: Database, project: str, tenant: str) -> None:
    with psycopg.connect(database.dsn(), autocommit=True) as conn:
        conn.execute("update app.projects set tenant_id = %s where id = %s", (tenant, project))


async def as_direct_client(
    database: Database, caller: StoreIdentity, statement: str, *params: object
) -> list:
    """A user with a valid token connecting directly (like Supabase's Data API): `authenticated` only."""
    async with await psycopg.AsyncConnection.connect(database.dsn("api_client")) as conn:
        await conn.execute(
            "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)",
            (caller.database_claims(),),
        )
        cursor = await conn.execute(statement, params)
        return await cursor.fetchall() if cursor.description else []


async def test_a_direct_client_cannot_set_an_agent_name_or_state(
    database: Database, store: PostgresStore
) -> None:
    alice = person()
    with pytest.raises(psycopg.Error) as refused:
        await as_direct_client(
            database,
            alice,
            "insert into bastion.conversations (title, state) values ('t', %s)",
            '{"step": 1}',
        )
    assert refused.value.sqlstate == "BS403"
    created = await store.create_conversation(alice, agent_name="planner", state=TaskState(step=1))
    with pytest.raises(psycopg.Error) as forged:
        await as_direct_client(
            database,
            alice,
            "update bastion.conversations set state = '{\"step\": 99}' where id = %s",
            created.id,
        )
    assert forged.value.sqlstate == "BS403"
    assert (await store.get_conversation(alice, created.id)).state == TaskState(step=1)
    # What a direct client may do is unchanged: create and rename, and read its own rows.
    await as_direct_client(database, alice, "insert into bastion.conversations (title) values ('mine')")
    rows = await as_direct_client(
        database, alice, "select agent_name, state from bastion.conversations where id = %s", created.id
    )
    assert rows == [("planner", {"step": 1, "notes": []})]


class Api:
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


@pytest.fixture
async def api(store: PostgresStore) -> AsyncIterator[Api]:
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    app = create_agent_worker(env=env, routes=conversation_routes(store))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
        yield Api(http, keys, env)


async def test_tenant_scoping_through_a_project_hides_other_tenants_conversations_in_api_and_sql(
    database: Database, store: PostgresStore, api: Api
) -> None:
    alice = person("tenant-a")
    project = create_project(database, "tenant-a")
    other_tenants = create_project(database, "tenant-b")
    created = await store.create_conversation(alice, agent_name="planner", columns={"project_id": project})
    await store.create_conversation(alice, agent_name="planner")

    # A project of another tenant cannot take the caller's conversations.
    with pytest.raises(psycopg.Error) as refused:
        await store.create_conversation(alice, columns={"project_id": other_tenants})
    assert refused.value.sqlstate == "42501"  # the row-level security check, not a stored row

    listed = await api.http.get(f"/api/conversations?project_id={project}", headers=api.headers(alice))
    assert listed.status_code == 200
    assert [c["id"] for c in listed.json()["conversations"]] == [created.id]
    assert listed.json()["conversations"][0]["project_id"] == project

    in_sql = "select id::text from bastion.conversations where project_id = %s"
    assert await as_direct_client(database, alice, in_sql, project) == [(created.id,)]

    # The project moves to another tenant: the relation wins, its conversations leave tenant-a.
    move_project(database, project, "tenant-b")
    assert (
        await api.http.get(f"/api/conversations?project_id={project}", headers=api.headers(alice))
    ).json()["conversations"] == []
    assert (
        await api.http.get(f"/api/conversations/{created.id}", headers=api.headers(alice))
    ).status_code == 404
    messages = await api.http.get(f"/api/conversations/{created.id}/messages", headers=api.headers(alice))
    assert messages.status_code == 404
    assert await as_direct_client(database, alice, in_sql, project) == []
    everything = await as_direct_client(database, alice, "select count(*) from bastion.conversations")
    assert everything == [(1,)]  # the conversation outside any project is still theirs
    # Nobody in the new tenant reaches it either: it is still alice's, and owner rules still apply.
    bob = person("tenant-b")
    assert (
        await store.list_conversations(bob, filter=ConversationFilter(columns={"project_id": project})) == []
    )

    move_project(database, project, "tenant-a")
    back = await api.http.get(f"/api/conversations?project_id={project}", headers=api.headers(alice))
    assert [c["id"] for c in back.json()["conversations"]] == [created.id]


async def test_a_bad_filter_over_http_is_a_400_naming_the_parameter(store: PostgresStore, api: Api) -> None:
    alice = person()
    for query, parameter in [
        ("project_id=nope", "project_id"),
        ("owner_id=x", "owner_id"),
        ("before=yesterday", "before"),
        ("after=2026-01-01T00:00:00", "after"),
        ("cursor=abc", "cursor"),
        ("agent=a&agent=b", "agent"),
    ]:
        response = await api.http.get(f"/api/conversations?{query}", headers=api.headers(alice))
        assert response.status_code == 400, query
        assert response.json() == {
            "code": "invalid_filter",
            "message": f"The filter {parameter!r} is not valid.",
            "field": parameter,
        }
    too_few = await api.http.get("/api/conversations?limit=0", headers=api.headers(alice))
    assert too_few.status_code == 400
    assert too_few.json()["field"] == "limit"


async def test_the_upgrade_converts_text_state_after_an_audit_and_keeps_every_row_visible(
    pg_cluster: PostgresCluster,
) -> None:
    name = pg_cluster.database("upgrade")
    dsn = pg_cluster.dsn(name)
    previous = ENTITIES_MIGRATION - 1
    earlier = [m.version for m in available_migrations() if m.version <= previous]
    assert await apply_migrations(dsn, upto=previous) == earlier
    pg_cluster.create_login_roles()
    alice, bob = person("tenant-a"), person(None)
    good, empty, bad, plain = (str(uuid.uuid4()) for _ in range(4))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # An earlier application kept its state as text on the conversations.
        await conn.execute("alter table bastion.conversations add column state text")
        rows = [
            (good, alice, "tenant-a", '{"step": 3}'),
            (empty, alice, "tenant-a", " "),
            (bad, bob, None, "step three"),
            (plain, bob, None, None),
        ]
        for conversation, owner, tenant, state in rows:
            await conn.execute(
                "insert into bastion.conversations (id, owner_id, tenant_id, title, state) "
                "values (%s, %s, %s, 't', %s)",
                (conversation, owner.user_id, tenant, state),
            )
            await conn.execute(
                "insert into bastion.messages (conversation_id, owner_id, tenant_id, seq, id, role, message) "
                "values (%s, %s, %s, 1, 'u1', 'user', %s)",
                (conversation, owner.user_id, tenant, json.dumps({"id": "u1", "role": "user", "parts": []})),
            )

    with pytest.raises(psycopg.Error) as refused:
        await apply_migrations(dsn)
    assert bad in str(refused.value)
    assert good not in str(refused.value)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        column = await conn.execute(
            "select data_type from information_schema.columns "
            "where table_schema = 'bastion' and table_name = 'conversations' and column_name = 'state'"
        )
        assert await column.fetchall() == [("text",)]  # nothing of the migration was applied
        latest = await conn.execute("select max(version) from bastion.bastion_migrations")
        assert await latest.fetchone() == (earlier[-1],)
        await conn.execute("update bastion.conversations set state = %s where id = %s", ('"step three"', bad))
        await conn.commit()

    applied = await apply_migrations(dsn)
    assert ENTITIES_MIGRATION in applied
    async with await PostgresStore.open(pg_cluster.dsn(name, user="bastion_app")) as store:
        mine = {c.id: c for c in await store.list_conversations(alice)}
        assert set(mine) == {good, empty}
        assert mine[good].state == {"step": 3}
        assert mine[empty].state is None
        theirs = {c.id: c for c in await store.list_conversations(bob)}
        assert set(theirs) == {bad, plain}
        assert theirs[bad].state == "step three"
        assert theirs[plain].state is None and theirs[plain].agent_name is None
        for owner, conversation in [(alice, good), (alice, empty), (bob, bad), (bob, plain)]:
            assert [m.id for m in await store.list_messages(owner, conversation)] == ["u1"]
