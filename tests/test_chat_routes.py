"""The framework's chat route: one call builds claim, prepare, stream, finish and settle over a store."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from bastion import define_agent
from bastion.auth import SupabaseEnv
from bastion.chat.endpoint import chat_routes
from bastion.chat.request import ChatRequest, EmptyMessageError
from bastion.chat.turn import ChatTurn
from bastion.errors import ToolError
from bastion.stores import SqliteStore, StoreIdentity
from bastion.worker import create_agent_worker
from tests.scripted import Call, ScriptedModel
from tests.supabase_tokens import SigningKeys, es256, user_claims
from tests.test_examples import load_example

PROJECT_URL = "https://project-ref.supabase.co"
ADA = "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"
GRACE = "2b9d6c1e-5a4f-4e3d-9c2b-1a0f9e8d7c6b"
IDENTITY = StoreIdentity(user_id=ADA, tenant_id="tenant-a")


class Project:
    def __init__(self) -> None:
        self.keys = SigningKeys()
        self.env = SupabaseEnv(url=PROJECT_URL, jwks=self.keys.jwks())

    def headers(self, sub: str = ADA) -> dict[str, str]:
        token = es256(self.keys, user_claims(self.env.issuer, time.time(), sub=sub))
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(tmp_path / "chat.sqlite3") as store:
        await store.migrate()
        yield store


def user(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


def chunks_of(response: httpx2.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]


async def test_the_ten_line_example_app_serves_a_persisted_turn_with_a_tool(sqlite: SqliteStore) -> None:
    example = load_example("chat_app")
    project = Project()
    model = ScriptedModel([Call("whoami", {})], ["You are Ada."])
    app = example.app(sqlite, project.env, model)
    conversation = str(uuid.uuid4())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        body = {"id": conversation, "messages": [user("who am I?")], "trigger": "submit-message"}
        response = await http.post("/api/chat", json=body, headers=project.headers())
    assert response.status_code == 200, response.text
    chunks = chunks_of(response)
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"user_id": ADA}
    stored = await sqlite.list_messages(IDENTITY, conversation)
    assert [message.role for message in stored] == ["user", "assistant"]
    assistant = stored[-1].message
    assert assistant["id"] == chunks[0]["messageId"]
    parts = [part["type"] for part in assistant["parts"]]
    assert parts == ["step-start", "tool-whoami", "step-start", "text"]


async def test_a_failing_context_factory_settles_the_run_and_frees_the_conversation(
    sqlite: SqliteStore,
) -> None:
    project = Project()
    calls = 0

    def context(turn: ChatTurn) -> ChatTurn:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the context could not be built")
        return turn

    agent = define_agent(name="helper", instructions="Answer.")
    routes = chat_routes(agent=agent, store=sqlite, model=ScriptedModel(["Hello."]), context=context)
    app = create_agent_worker(env=project.env, routes=routes)
    conversation = str(uuid.uuid4())
    first = user("hi")
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        body = {"id": conversation, "messages": [first], "trigger": "submit-message"}
        failed = await http.post("/api/chat", json=body, headers=project.headers())
        assert failed.status_code == 500
        assert failed.json()["code"] == "internal"
        again = await http.post("/api/chat", json=body, headers=project.headers())
    assert again.status_code == 200, again.text
    assert "".join(c["delta"] for c in chunks_of(again) if c["type"] == "text-delta") == "Hello."
    runs = [event.type for event in await sqlite.list_events(IDENTITY, conversation)]
    assert runs == ["run.started", "run.failed", "run.started", "run.completed"]


async def test_tools_that_cannot_be_opened_are_a_502_in_the_tool_sources_words(sqlite: SqliteStore) -> None:
    project = Project()
    model = ScriptedModel(["Hello."])

    def tools(turn: ChatTurn) -> Any:
        raise ToolError("The docs connection is unreachable.")

    agent = define_agent(name="helper", instructions="Answer.", tools=tools)
    app = create_agent_worker(
        env=project.env, routes=chat_routes(agent=agent, store=sqlite, model=model, context=lambda turn: turn)
    )
    conversation = str(uuid.uuid4())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        body = {"id": conversation, "messages": [user("hi")], "trigger": "submit-message"}
        refused = await http.post("/api/chat", json=body, headers=project.headers())
    assert refused.status_code == 502
    assert refused.json() == {"code": "tools_unavailable", "message": "The docs connection is unreachable."}
    assert model.calls == 0
    runs = [event.type for event in await sqlite.list_events(IDENTITY, conversation)]
    assert runs == ["run.started", "run.failed"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"id": "not-a-uuid", "messages": [{"id": "u", "role": "user", "parts": []}]}, "invalid_input"),
        ({"id": str(uuid.uuid4()), "messages": []}, "invalid_input"),
        ({"id": str(uuid.uuid4()), "messages": [{}], "trigger": "resume"}, "invalid_input"),
        ({"id": str(uuid.uuid4()), "messages": [user("")]}, "empty_message"),
        ({"id": str(uuid.uuid4()), "messages": [user(" \n\t ")]}, "empty_message"),
    ],
)
async def test_a_malformed_chat_request_is_a_400(
    sqlite: SqliteStore, body: dict[str, Any], code: str
) -> None:
    project = Project()
    agent = define_agent(name="helper", instructions="Answer.")
    routes = chat_routes(agent=agent, store=sqlite, model=ScriptedModel(), context=lambda turn: turn)
    app = create_agent_worker(env=project.env, routes=routes)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        response = await http.post("/api/chat", json=body, headers=project.headers())
    assert response.status_code == 400
    assert response.json()["code"] == code
    assert "^" not in response.json()["message"]  # no regular expression in words for a person
    assert await sqlite.list_conversations(IDENTITY) == []


async def test_a_bad_conversation_id_is_said_in_words(sqlite: SqliteStore) -> None:
    project = Project()
    routes = chat_routes(
        agent=define_agent(name="helper", instructions="Answer."),
        store=sqlite,
        model=ScriptedModel(),
        context=lambda turn: turn,
    )
    app = create_agent_worker(env=project.env, routes=routes)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        body = {"id": "not-a-uuid", "messages": [user("hello")]}
        response = await http.post("/api/chat", json=body, headers=project.headers())
    assert response.json() == {"code": "invalid_input", "message": "id: must be a UUID.", "field": "id"}


async def test_an_empty_message_is_refused_with_its_own_code_but_a_file_alone_is_a_message() -> None:
    empty = {"id": "m", "role": "user", "parts": [{"type": "text", "text": "  "}]}
    with pytest.raises(EmptyMessageError) as refused:
        ChatRequest.model_validate({"id": ADA, "messages": [empty]})
    assert (refused.value.code, refused.value.status) == ("empty_message", 400)
    assert refused.value.field == "messages[0].parts"
    picture = {"type": "file", "mediaType": "image/png", "url": "https://example.com/a.png"}
    sent = {"id": "m", "role": "user", "parts": [{"type": "text", "text": ""}, picture]}
    assert ChatRequest.model_validate({"id": ADA, "messages": [sent]}).messages == [sent]
    answer = {"id": "a", "role": "assistant", "parts": []}  # an approval's answer says nothing new
    assert ChatRequest.model_validate({"id": ADA, "messages": [empty, answer]}).messages[-1] == answer


async def test_a_first_message_creates_the_conversation_for_the_agent_and_the_context_knows_the_run(
    sqlite: SqliteStore,
) -> None:
    project = Project()
    seen: list[ChatTurn] = []

    def context(turn: ChatTurn) -> ChatTurn:
        seen.append(turn)
        return turn

    agent = define_agent(name="helper", instructions="Answer.")
    routes = chat_routes(agent=agent, store=sqlite, model=ScriptedModel(["Hello."]), context=context)
    app = create_agent_worker(env=project.env, routes=routes)
    conversation = str(uuid.uuid4())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        body = {"id": conversation, "messages": [user("hello  there")], "trigger": "submit-message"}
        response = await http.post("/api/chat", json=body, headers=project.headers())
    assert response.status_code == 200, response.text
    [created] = await sqlite.list_conversations(IDENTITY)
    assert (created.id, created.agent_name, created.title) == (conversation, "helper", "hello there")
    [turn] = seen
    [started, _] = await sqlite.list_events(IDENTITY, conversation)
    assert (turn.conversation_id, turn.run_id) == (conversation, started.run_id)


async def test_a_first_message_that_is_not_a_new_user_message_stores_nothing(sqlite: SqliteStore) -> None:
    project = Project()
    agent = define_agent(name="helper", instructions="Answer.")
    routes = chat_routes(
        agent=agent, store=sqlite, model=ScriptedModel(["Hello."]), context=lambda turn: turn
    )
    app = create_agent_worker(env=project.env, routes=routes)
    reply = {"id": "a1", "role": "assistant", "parts": [{"type": "text", "text": "I said this."}]}
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        body = {"id": str(uuid.uuid4()), "messages": [reply], "trigger": "submit-message"}
        response = await http.post("/api/chat", json=body, headers=project.headers())
    assert response.json()["code"] == "not_found", response.text
    assert await sqlite.list_conversations(IDENTITY) == []


@pytest.mark.parametrize("usage_metadata", [True, False])
async def test_usage_metadata_puts_the_turns_usage_in_the_finish_chunk_and_the_stored_message(
    sqlite: SqliteStore, usage_metadata: bool
) -> None:
    project = Project()
    agent = define_agent(name="helper", instructions="Answer.")
    routes = chat_routes(
        agent=agent,
        store=sqlite,
        model=ScriptedModel(["Hello."]),
        context=lambda turn: turn,
        usage_metadata=usage_metadata,
    )
    app = create_agent_worker(env=project.env, routes=routes)
    conversation = str(uuid.uuid4())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        body = {"id": conversation, "messages": [user("hi")], "trigger": "submit-message"}
        response = await http.post("/api/chat", json=body, headers=project.headers())
    assert response.status_code == 200, response.text
    [finish] = [chunk for chunk in chunks_of(response) if chunk["type"] == "finish"]
    stored = (await sqlite.list_messages(IDENTITY, conversation))[-1].message
    if not usage_metadata:
        assert "messageMetadata" not in finish and "metadata" not in stored
        return
    usage = finish["messageMetadata"]["usage"]
    assert usage["outputTokens"] > 0 and usage["totalTokens"] > usage["outputTokens"]
    assert stored["metadata"] == finish["messageMetadata"]
