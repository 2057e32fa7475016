"""A new conversation's first turn through `chat_routes` on Postgres: created and claimed in one round trip,
and refused or claimed exactly as before when its id is already taken. Counted, not timed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx2
import psycopg

from bastion import define_agent
from bastion.chat import chat_routes
from bastion.stores import PostgresStore, StoreIdentity
from bastion.stores.postgres_live import PostgresLiveTurns
from bastion.worker import create_agent_worker
from tests.conftest import MigratedDatabase
from tests.durable_cluster import user_message
from tests.live_server import served_here
from tests.scripted import ScriptedModel
from tests.test_chat_routes import Project
from tests.test_durable_round_trips import counting_proxy, lookup_tools, serve

TURNS = 3


def _body(conversation: str, text: str) -> dict[str, Any]:
    return {"id": conversation, "messages": [user_message(text)], "trigger": "submit-message"}


async def _stored(database: MigratedDatabase, conversation: str) -> tuple[list[Any], list[Any]]:
    """The conversation's owner and title, and its messages' roles, read as the database's owner."""
    async with await psycopg.AsyncConnection.connect(database.admin_dsn) as conn:
        owners = await (
            await conn.execute(
                "select owner_id::text, title from bastion.conversations where id = %s", (conversation,)
            )
        ).fetchall()
        roles = await (
            await conn.execute(
                "select role from bastion.messages where conversation_id = %s order by seq", (conversation,)
            )
        ).fetchall()
    return owners, [role for (role,) in roles]


async def test_a_new_conversations_first_turn_is_created_and_claimed_in_one_round_trip(
    migrated_database: MigratedDatabase,
) -> None:
    project = Project()
    model = ScriptedModel(*[["Hello."] for _ in range(TURNS + 1)])
    with counting_proxy(migrated_database) as counter:
        dsn = migrated_database.cluster.dsn(
            migrated_database.name, user="bastion_app", host=counter.socket_dir
        )
        async with await PostgresStore.open(dsn, max_size=2) as store:
            store._live = PostgresLiveTurns(store, listen_conninfo=dsn, flush_interval=3600)
            async with serve(store, None, model, project) as url, httpx2.AsyncClient(timeout=30) as http:
                headers = project.headers(str(uuid.uuid4()))

                async def turn() -> str:
                    conversation = str(uuid.uuid4())
                    response = await http.post(
                        f"{url}/api/chat", json=_body(conversation, "hi"), headers=headers
                    )
                    assert response.status_code == 200 and '"finish"' in response.text
                    return conversation

                await turn()  # connections, the worker lock and the listener are set up once
                await asyncio.sleep(0.2)
                before = counter.round_trips
                conversations = []
                for _ in range(TURNS):
                    conversations.append(await turn())
                    await asyncio.sleep(0.2)
                trips = (counter.round_trips - before) / TURNS
    # Its creation with its claim, then its close (which carries the stream log).
    assert trips == 2
    for conversation in conversations:
        owners, roles = await _stored(migrated_database, conversation)
        assert [title for _, title in owners] == ["hi"] and roles == ["user", "assistant"]


async def test_a_first_message_to_someone_elses_conversation_is_not_found_and_stores_nothing(
    migrated_database: MigratedDatabase,
) -> None:
    project = Project()
    ada, grace = str(uuid.uuid4()), str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    async with (
        await PostgresStore.open(migrated_database.app_dsn, max_size=2) as store,
        serve(store, None, ScriptedModel(["Hello, Ada."], ["Hello, Grace."]), project) as url,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        first = await http.post(
            f"{url}/api/chat", json=_body(conversation, "ada's"), headers=project.headers(ada)
        )
        assert first.status_code == 200
        foreign = await http.post(
            f"{url}/api/chat", json=_body(conversation, "grace's"), headers=project.headers(grace)
        )
        assert (foreign.status_code, foreign.json()["code"]) == (404, "not_found")
    owners, roles = await _stored(migrated_database, conversation)
    assert owners == [(ada, "ada's")] and roles == ["user", "assistant"]


async def test_a_first_message_to_the_callers_own_empty_conversation_claims_it(
    migrated_database: MigratedDatabase,
) -> None:
    project = Project()
    ada = str(uuid.uuid4())
    agent = define_agent(name="own-empty", instructions="Answer.", tools=lookup_tools)
    async with (
        await PostgresStore.open(migrated_database.app_dsn, max_size=2) as store,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        routes = chat_routes(agent=agent, store=store, model=ScriptedModel(["Hello."]), context=lambda t: t)
        async with served_here(create_agent_worker(env=project.env, routes=routes)) as url:
            identity = StoreIdentity(user_id=ada, tenant_id="tenant-a")  # as the token names them
            created = await store.create_conversation(
                identity, title="Made by the app", agent_name="own-empty"
            )
            response = await http.post(
                f"{url}/api/chat", json=_body(created.id, "hi"), headers=project.headers(ada)
            )
        assert response.status_code == 200 and '"finish"' in response.text, response.text
    owners, roles = await _stored(migrated_database, created.id)
    assert owners == [(ada, "Made by the app")] and roles == ["user", "assistant"]


async def test_claim_new_turn_claims_only_a_conversation_its_own_transaction_created(
    migrated_database: MigratedDatabase,
) -> None:
    ada = StoreIdentity(user_id=str(uuid.uuid4()), tenant_id="tenant-a", claims={"aud": "authenticated"})
    claim = "select bastion.claim_new_turn(%s, %s, %s, 1, 30, '[]', '[]')"

    async def as_ada(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(
            "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)",
            (ada.database_claims(),),
        )

    earlier, new = str(uuid.uuid4()), str(uuid.uuid4())
    async with await psycopg.AsyncConnection.connect(migrated_database.app_dsn) as conn:
        async with conn.transaction():
            await as_ada(conn)
            await conn.execute("insert into bastion.conversations (id) values (%s)", (earlier,))
        async with conn.transaction():  # ada's own conversation, created by an earlier transaction
            await as_ada(conn)
            taken = await (await conn.execute(claim, (earlier, str(uuid.uuid4()), "r1"))).fetchone()
        async with conn.transaction():
            await as_ada(conn)
            await conn.execute("insert into bastion.conversations (id) values (%s)", (new,))
            claimed = await (await conn.execute(claim, (new, str(uuid.uuid4()), "r2"))).fetchone()
    assert taken == ({"outcome": "taken"},)
    assert claimed is not None and claimed[0]["outcome"] == "claimed" and claimed[0]["revision"] == 1
    async with await psycopg.AsyncConnection.connect(migrated_database.admin_dsn) as conn:
        runs = await (
            await conn.execute(
                "select conversation_id::text from bastion.runs where conversation_id in (%s, %s)",
                (earlier, new),
            )
        ).fetchall()
    assert runs == [(new,)]
