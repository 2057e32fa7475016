"""Memory in an agent's turn: recall as a context message before the new user message (not in the
instructions), `remember`/`forget` as tools behind the permission map and the operation claim,
nothing at all without a signed-in user, and extraction after the turn that never fails it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from pydantic_ai.messages import ModelRequest, SystemPromptPart, UserPromptPart

from bastion import ToolPolicy, define_agent, start_agent_run
from bastion.memory import AgentMemory, HashingEmbedder, PostgresMemoryStore, define_memory
from bastion.stores import PostgresStore, StoreIdentity, TurnContext
from tests.memory_db import MemoryDatabase, someone
from tests.scripted import Call, ScriptedModel

SCOPE = "agent-test"


@dataclass(frozen=True)
class Ctx:
    identity: StoreIdentity | None
    operation: str


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{uuid.uuid4().hex[:8]}", "role": "user", "parts": [{"type": "text", "text": text}]}


def memory_for(store: PostgresMemoryStore, **options: Any) -> AgentMemory[Ctx]:
    return define_memory(
        store=store,
        identity=lambda ctx: ctx.identity,
        operation_id=lambda ctx: ctx.operation,
        scope=SCOPE,
        **options,
    )


async def run_turn(
    app_store: PostgresStore, memory: AgentMemory[Ctx], model: ScriptedModel, who: StoreIdentity, text: str
) -> list[dict[str, Any]]:
    """One persisted turn in a new conversation; returns the stream's chunks."""
    conversation = await app_store.create_conversation(who)
    turn = TurnContext(identity=who, conversation_id=conversation.id, request_id=str(uuid.uuid4()))
    run = await start_agent_run(
        persistence=app_store.persistence(), context=turn, messages=[user(text)], trigger="submit-message"
    )
    agent = define_agent(
        name="remembering",
        instructions="Static instructions.",
        tools=memory.tools,
        permissions={"remember": ToolPolicy(), "forget": ToolPolicy()},
        context_messages=memory.context_messages,
    )
    ctx = Ctx(identity=who, operation=run.state.run_id)
    session = await agent.prepare(context=ctx, execute_tool=run.execute_tool)
    chunks = [chunk async for chunk in await session.stream(model=model, messages=run.messages)]
    await run.finish(status="completed")
    await session.close()
    return chunks


@pytest.fixture
async def app_store(memory_database: MemoryDatabase) -> Any:
    async with await PostgresStore.open(memory_database.app_dsn, max_size=4) as store:
        yield store


async def test_a_remembered_fact_is_recalled_in_a_new_conversation_before_the_user_message(
    app_store: PostgresStore, memory_database: MemoryDatabase
) -> None:
    memory = memory_for(PostgresMemoryStore(app_store, embedder=HashingEmbedder(64)))
    ada = someone()
    first = ScriptedModel([Call("remember", {"fact": "The user's name is Ada"})], ["Noted."])
    chunks = await run_turn(app_store, memory, first, ada, "my name is Ada")
    [output] = [c for c in chunks if c["type"] == "tool-output-available"]
    assert output["output"]["outcome"] == "created"
    async with await psycopg.AsyncConnection.connect(memory_database.admin_dsn) as conn:
        claims = await (
            await conn.execute(
                "select tool_name, status from bastion.tool_executions where owner_id = %s", (ada.user_id,)
            )
        ).fetchall()
    assert claims == [("remember", "completed")]

    second = ScriptedModel(["Your name is Ada."])
    await run_turn(app_store, memory, second, ada, "what is my name?")
    [request] = second.requests
    parts = [
        part for message in request.messages if isinstance(message, ModelRequest) for part in message.parts
    ]
    system = [part.content for part in parts if isinstance(part, SystemPromptPart)]
    assert len(system) == 1 and "The user's name is Ada" in system[0]
    assert isinstance(parts[-1], UserPromptPart) and parts[-1].content == "what is my name?"
    assert "Ada" not in (request.messages[-1].instructions or "")  # type: ignore[union-attr]


async def test_another_user_recalls_nothing_of_it(app_store: PostgresStore) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    memory = memory_for(store)
    ada, bob = someone(), someone()
    await store.remember(ada, "The user's name is Ada", scope=SCOPE)
    model = ScriptedModel(["I don't know."])
    await run_turn(app_store, memory, model, bob, "what is my name?")
    parts = [p for m in model.requests[0].messages if isinstance(m, ModelRequest) for p in m.parts]
    assert not [part for part in parts if isinstance(part, SystemPromptPart)]


async def test_remember_waits_for_approval_when_the_permission_map_asks_for_it(
    app_store: PostgresStore,
) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    memory = memory_for(store)
    ada = someone()
    conversation = await app_store.create_conversation(ada)
    turn = TurnContext(identity=ada, conversation_id=conversation.id, request_id=str(uuid.uuid4()))
    run = await start_agent_run(
        persistence=app_store.persistence(),
        context=turn,
        messages=[user("I am Ada")],
        trigger="submit-message",
    )
    agent = define_agent(
        name="careful",
        instructions="",
        tools=memory.tools,
        permissions={"remember": ToolPolicy(needs_approval=True), "forget": ToolPolicy()},
        context_messages=memory.context_messages,
    )
    session = await agent.prepare(
        context=Ctx(identity=ada, operation=run.state.run_id), execute_tool=run.execute_tool
    )
    model = ScriptedModel([Call("remember", {"fact": "The user's name is Ada"})])
    chunks = [chunk async for chunk in await session.stream(model=model, messages=run.messages)]
    await run.finish(status="completed")
    await session.close()
    assert "tool-approval-request" in [chunk["type"] for chunk in chunks]
    assert await store.list_memories(ada, scope=SCOPE) == []


async def test_forget_through_the_tool_removes_the_memory(app_store: PostgresStore) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    memory = memory_for(store)
    ada = someone()
    kept = await store.remember(ada, "Lives on Baker Street", scope=SCOPE)
    model = ScriptedModel([Call("forget", {"memory_id": kept.memory_id})], ["Forgotten."])
    await run_turn(app_store, memory, model, ada, "forget where I live")
    assert await store.list_memories(ada, scope=SCOPE) == []


async def test_tools_can_be_renamed_or_dropped(app_store: PostgresStore) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    ctx = Ctx(identity=someone(), operation="op")
    renamed = memory_for(store, remember_name="profile__remember", forget_name="profile__forget")
    assert [t.name for t in renamed.tools(ctx)] == ["profile__remember", "profile__forget"]
    assert memory_for(store, tools=False).tools(ctx) == []


async def test_without_a_signed_in_user_memory_recalls_nothing_offers_nothing_stores_nothing(
    app_store: PostgresStore,
) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    extracted: list[str] = []

    def extract(messages: list[dict[str, Any]], ctx: Ctx) -> list[str]:
        extracted.append("called")
        return ["anything"]

    memory = memory_for(store, extract=extract)
    anonymous = Ctx(identity=None, operation="op")
    assert await memory.context_messages([user("what is my name?")], anonymous) == []
    assert memory.tools(anonymous) == []
    memory.after_turn([user("my name is Ada")], anonymous)
    await memory.drain()
    assert extracted == []


async def test_a_required_tenant_is_required(app_store: PostgresStore) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    memory = memory_for(store, require_tenant=True)
    assert memory.tools(Ctx(identity=someone(), operation="op")) == []
    assert len(memory.tools(Ctx(identity=someone("acme"), operation="op"))) == 2


async def test_extraction_runs_after_the_turn_and_is_retried_until_it_succeeds(
    app_store: PostgresStore,
) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    attempts: list[int] = []

    async def flaky(messages: list[dict[str, Any]], ctx: Ctx) -> list[str]:
        attempts.append(len(messages))
        if len(attempts) < 3:
            raise RuntimeError("the extraction model timed out")
        return ["Prefers tea over coffee", "Prefers tea over coffee."]

    memory = memory_for(store, extract=flaky, extract_attempts=3, extract_retry_delay=0.01)
    ada = someone()
    memory.after_turn([user("I prefer tea")], Ctx(identity=ada, operation="op"))
    assert attempts == []  # scheduled, not run on the response path
    await memory.drain()
    assert attempts == [1, 1, 1]
    assert [m.text for m in await store.list_memories(ada, scope=SCOPE)] == ["Prefers tea over coffee"]


async def test_an_extraction_that_always_fails_gives_up_quietly(
    app_store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    calls = 0

    def broken(messages: list[dict[str, Any]], ctx: Ctx) -> list[str]:
        nonlocal calls
        calls += 1
        raise RuntimeError("no")

    memory = memory_for(store, extract=broken, extract_attempts=2, extract_retry_delay=0.01)
    memory.after_turn([user("hi")], Ctx(identity=someone(), operation="op"))
    await memory.drain()
    assert calls == 2
    assert "giving up" in caplog.text


async def test_a_failing_recall_leaves_the_turn_without_memory(
    app_store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    class Down(HashingEmbedder):
        async def embed_queries(self, texts: Any) -> list[list[float]]:
            raise ConnectionError("embedder down")

    memory = memory_for(PostgresMemoryStore(app_store, embedder=Down(64)))
    assert await memory.context_messages([user("hello")], Ctx(identity=someone(), operation="op")) == []
    assert "Recalling memory failed" in caplog.text


async def test_a_replayed_step_gets_the_same_context_message_text(app_store: PostgresStore) -> None:
    store = PostgresMemoryStore(app_store, embedder=HashingEmbedder(64))
    memory = memory_for(store)
    ada = someone()
    await store.remember(ada, "Birthday on 10 December", scope=SCOPE)
    ctx = Ctx(identity=ada, operation=str(uuid.uuid4()))
    [first] = await memory.context_messages([user("when is my birthday?")], ctx)
    await store.remember(ada, "Birthday party planned for 12 December", scope=SCOPE)
    [again] = await memory.context_messages([user("when is my birthday?")], ctx)
    assert first["parts"] == again["parts"]
