"""Deleting a conversation deletes everything derived from it, and its id, used again by someone else,
never reaches the first owner's rows: reproduced over HTTP through the real routes (durable turns,
`persist_sessions` delivered on DBOS, uvicorn on 127.0.0.1) and read back as `authenticated` under
row-level security."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
import uvicorn
from pydantic_ai.messages import ModelMessage, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from starlette.types import ASGIApp

from bastion import define_agent
from bastion.auth import SupabaseEnv
from bastion.chat import chat_routes, conversation_routes
from bastion.durable import DurableEngine
from bastion.hooks import HookDelivery, HookRegistry, chat_id_of, persist_sessions, queued_deliveries
from bastion.memory import HashingEmbedder, PostgresMemoryStore, apply_memory_migrations
from bastion.stores import PostgresStore, StoreIdentity
from bastion.worker import create_agent_worker
from tests.hooks_db import HooksDatabase, as_user
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"
TENANT = "tenant-a"


def echo_model() -> FunctionModel:
    """Answers every message by quoting it, so the user's private text is in both of a turn's messages."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        prompt = next(p.content for p in messages[-1].parts if isinstance(p, UserPromptPart))
        yield f"You said: {prompt}"

    return FunctionModel(stream_function=stream)


@asynccontextmanager
async def served(app: ASGIApp) -> AsyncIterator[str]:
    """`app` over real HTTP (uvicorn on 127.0.0.1) on this event loop, where DBOS was launched."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    # No logging configuration of uvicorn's own: its records reach the test's log capture.
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="on"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        assert not serving.done(), "the test server did not start"
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await serving
        sock.close()


class User:
    """A signed-in user of the tenant, with a token the routes verify."""

    def __init__(self, keys: SigningKeys, env: SupabaseEnv) -> None:
        self.id = str(uuid.uuid4())
        claims = user_claims(env.issuer, time.time(), sub=self.id, app_metadata={"tenant_id": TENANT})
        self.headers = {"Authorization": f"Bearer {es256(keys, claims)}"}
        self.identity = StoreIdentity(user_id=self.id, tenant_id=TENANT, claims={"aud": "authenticated"})

    async def say(self, http: httpx2.AsyncClient, conversation: str, message_id: str, text: str) -> None:
        message = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}
        body = {"id": conversation, "messages": [message], "trigger": "submit-message"}
        for _ in range(100):  # the previous turn's worker may still be closing it: retry, as a client would
            response = await http.post("/api/chat", json=body, headers=self.headers)
            if response.status_code != 409:
                break
            await asyncio.sleep(0.05)
        assert response.status_code == 200, response.text
        assert '"type":"finish"' in response.text.replace(" ", "")


def derived_rows(database: HooksDatabase, conversation: str, runs: list[str]) -> dict[str, int]:
    """Every row derived from the conversation, per table, read as the database's owner."""
    chat = chat_id_of(conversation)

    def count(query: str, *params: Any) -> int:
        [(found,)] = database.rows(query, *params)
        return int(found)

    counts = {
        "ai_chats": count("select count(*) from bastion.ai_chats where conversation_id = %s", conversation),
        "ai_messages": count("select count(*) from bastion.ai_messages where chat_id = %s", chat),
        "ai_runs": count("select count(*) from bastion.ai_runs where chat_id = %s", chat),
        "hook_events": count(
            "select count(*) from bastion.hook_events where conversation_id = %s", conversation
        ),
        "run_chunks": count("select count(*) from bastion.run_chunks where run_id = any(%s::uuid[])", runs),
        "memory_operation_records": count(
            "select count(*) from bastion.memory_documents where scope = 'bastion-ops'"
            " and split_part(path, '/', 3) = any(%s)",
            runs,
        ),
    }
    # Every DBOS table keyed by workflow (status, inputs, outputs, steps, streams...).
    for (table,) in database.rows(
        "select table_name from information_schema.columns where table_schema = 'dbos'"
        " and column_name = 'workflow_uuid' order by table_name"
    ):
        counts[f"dbos.{table}"] = count(
            f"select count(*) from dbos.{table} where starts_with(workflow_uuid, %s)",
            f"bastion.turn:{conversation}:",
        )
    return counts


async def settle(delivery: HookDelivery, pool: Any, done: Any) -> None:
    """Wait until `done()` holds and delivery has nothing left to hand over or finish."""
    for _ in range(600):
        [status] = await delivery.outbox.status()
        if await done() and status.undispatched == 0 and not await queued_deliveries(pool):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("delivery did not settle")


async def test_a_deleted_conversation_leaves_nothing_and_its_reused_id_never_reaches_the_old_owner(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    await apply_memory_migrations(hooks_database.admin_dsn)
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    agent = define_agent(name="echo", instructions="Answer.")
    memory = PostgresMemoryStore(hooks_store, embedder=HashingEmbedder(64))
    ada, bob = User(keys, env), User(keys, env)
    conversation = str(uuid.uuid4())
    chat = chat_id_of(conversation)
    engine = await DurableEngine.launch(hooks_database.app_dsn, recovery_interval=1)
    async with engine:
        routes = chat_routes(
            agent=agent, store=hooks_store, model=echo_model(), context=lambda turn: turn, durable=engine
        )
        app = create_agent_worker(env=env, routes=[*routes, *conversation_routes(hooks_store)])
        delivery = await HookDelivery.start(
            engine,
            hooks_store.pool,
            HookRegistry([persist_sessions(hooks_store.pool)]),
            listen_conninfo=hooks_database.app_dsn,
            queue_polling_interval=0.02,
        )
        try:
            async with served(app) as url, httpx2.AsyncClient(base_url=url, timeout=30) as http:
                await ada.say(http, conversation, "m1", "my private plan is to resign")
                await ada.say(http, conversation, "m2", "and my salary is 91k")
                runs = [
                    run
                    for (run,) in hooks_database.rows(
                        "select id::text from bastion.runs where conversation_id = %s", conversation
                    )
                ]
                for run in runs:  # the turns' memory recalls, stored under their operation (the run)
                    await memory.recall(ada.identity, "plan", operation_id=run, scope="chat")

                async def copied() -> bool:
                    rows = hooks_database.rows(
                        "select count(*) from bastion.ai_messages where chat_id = %s", chat
                    )
                    finished = hooks_database.rows(
                        "select count(*) from dbos.workflow_status where starts_with(workflow_uuid, %s)"
                        " and status = 'SUCCESS'",
                        f"bastion.turn:{conversation}:",
                    )
                    return rows == [(4,)] and finished == [(2,)]

                await settle(delivery, hooks_store.pool, copied)
                before = derived_rows(hooks_database, conversation, runs)
                assert before["ai_messages"] == 4 and before["dbos.workflow_status"] == 2, before

                deleted = await http.delete(f"/api/conversations/{conversation}", headers=ada.headers)
                assert deleted.status_code == 204
                await asyncio.sleep(0.3)  # any late event has had its chance to write
                await settle(delivery, hooks_store.pool, lambda: _true())
                after = derived_rows(hooks_database, conversation, runs)
                assert after == dict.fromkeys(before, 0), json.dumps({"before": before, "after": after})
                assert (
                    await as_user(hooks_database.app_dsn, ada.identity, "select id from bastion.ai_messages")
                    == []
                )

                # Bob starts a conversation with the same id and the same first message id.
                await bob.say(http, conversation, "m1", "bob's own note")

                async def bobs_copy() -> bool:
                    rows = hooks_database.rows(
                        "select count(*) from bastion.ai_messages where chat_id = %s", chat
                    )
                    return rows == [(2,)]

                await settle(delivery, hooks_store.pool, bobs_copy)
        finally:
            await delivery.close()

    ada_reads = await as_user(
        hooks_database.app_dsn,
        ada.identity,
        "select 'chat', id::text from bastion.ai_chats union all "
        "select 'message', parts::text from bastion.ai_messages union all "
        "select 'run', id::text from bastion.ai_runs",
    )
    assert ada_reads == []
    [(owner, leaf)] = await as_user(
        hooks_database.app_dsn,
        bob.identity,
        "select owner_id::text, current_leaf_id from bastion.ai_chats where conversation_id = %s",
        (conversation,),
    )
    bobs_messages = await as_user(
        hooks_database.app_dsn,
        bob.identity,
        "select id, role, owner_id::text, parts from bastion.ai_messages"
        " where chat_id = %s order by created_at",
        (chat,),
    )
    assert owner == bob.id
    assert [(m, role, who) for m, role, who, _ in bobs_messages] == [
        ("m1", "user", bob.id),
        (leaf, "assistant", bob.id),
    ]
    assert "bob's own note" in json.dumps(bobs_messages[0][3])
    assert "resign" not in json.dumps(bobs_messages)


async def _true() -> bool:
    return True


async def test_a_conversation_deleted_while_its_durable_turn_runs_leaves_nothing_behind(
    hooks_database: HooksDatabase, hooks_store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    await apply_memory_migrations(hooks_database.admin_dsn)
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    inside, release = asyncio.Event(), asyncio.Event()

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "First words "
        inside.set()
        await release.wait()
        yield "and the rest."

    agent = define_agent(name="slow", instructions="Answer.")
    ada = User(keys, env)
    conversation = str(uuid.uuid4())
    engine = await DurableEngine.launch(hooks_database.app_dsn, recovery_interval=1)
    async with engine:
        routes = chat_routes(
            agent=agent,
            store=hooks_store,
            model=FunctionModel(stream_function=stream),
            context=lambda turn: turn,
            durable=engine,
        )
        app = create_agent_worker(env=env, routes=[*routes, *conversation_routes(hooks_store)])
        async with served(app) as url, httpx2.AsyncClient(base_url=url, timeout=30) as http:
            message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "a secret"}]}
            body = {"id": conversation, "messages": [message], "trigger": "submit-message"}
            posting = asyncio.ensure_future(http.post("/api/chat", json=body, headers=ada.headers))
            await asyncio.wait_for(inside.wait(), 10)
            [(run,)] = hooks_database.rows(
                "select id::text from bastion.runs where conversation_id = %s", conversation
            )
            deleted = await http.delete(f"/api/conversations/{conversation}", headers=ada.headers)
            assert deleted.status_code == 204
            release.set()
            answered = await posting
            await asyncio.sleep(0.5)  # the workflow's last writes, had it any left
    # The client saw the turn end with an error and the stream finish, and the server's response task
    # ended cleanly rather than failing on the workflow the delete took away.
    assert answered.status_code == 200
    assert answered.text.endswith('data: {"type":"finish","finishReason":"error"}\n\ndata: [DONE]\n\n')
    assert [r.getMessage() for r in caplog.records if r.name.startswith("uvicorn") and r.levelno >= 40] == []
    left = derived_rows(hooks_database, conversation, [run])
    assert left == dict.fromkeys(left, 0), json.dumps(left)
