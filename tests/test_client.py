"""The typed Python client against the real assistant: uvicorn, Postgres, development sign-in, a scripted
model, every method over real HTTP, and the server's errors raised with their code, field and Retry-After."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import assemble_ui_messages
from bastion.auth import SupabaseEnv
from bastion.chat.conversations import ConversationRules, FeedbackOut, conversation_routes
from bastion.client import BastionApiError, BastionClient, BastionStreamError, UIMessageChunk, user_message
from bastion.stores import SqliteStore
from bastion.worker import create_agent_worker
from tests.entity_app import SCHEMA, SQLITE_PROJECTS
from tests.pg import PostgresCluster
from tests.scripted import ScriptedModel
from tests.supabase_tokens import SigningKeys, es256, user_claims
from tests.test_assistant import Served, serve_assistant
from tests.test_examples import load_example


class HeldModel(FunctionModel):
    """Streams a first word, then waits (for a stop) before the rest."""

    def __init__(self) -> None:
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        super().__init__(stream_function=self._stream)

    async def _stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "Hold "
        self.holding.set()
        await self.release.wait()
        yield "on."


@pytest.fixture
async def served(pg_cluster: PostgresCluster, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve_assistant(pg_cluster, tmp_path) as running:
        yield running


async def token_of(served: Served, user: str) -> str:
    return (await served.sign_in(user))["Authorization"].removeprefix("Bearer ")


async def collect(chunks: AsyncIterator[UIMessageChunk]) -> list[UIMessageChunk]:
    return [chunk async for chunk in chunks]


def text_of(chunks: list[UIMessageChunk]) -> str:
    return "".join(chunk["delta"] for chunk in chunks if chunk["type"] == "text-delta")


async def test_every_conversation_method_over_http(served: Served) -> None:
    served.app.active_model = ScriptedModel(["Hello ", "Ada."], ["Again."])
    token = await token_of(served, "ada")
    issued: list[str] = []

    async def current_token() -> str:
        issued.append(token)
        return token

    async with BastionClient(served.url, token=current_token) as client:
        conversation = str(uuid.uuid4())
        first = await collect(client.chat(conversation, [user_message("hello there")]))
        assert first[0]["type"] == "start" and first[-1]["type"] == "finish"
        assert text_of(first) == "Hello Ada."
        assert first[-1]["messageMetadata"]["usage"]["outputTokens"] > 0
        second = await collect(client.chat(conversation, [user_message("and again")]))
        assert text_of(second) == "Again."

        found = await client.get_conversation(conversation)
        assert (found.id, found.title, found.agent_name) == (conversation, "hello there", "assistant")
        created = await client.create_conversation(title="Plans")
        assert created.title == "Plans" and created.revision == 0
        renamed = await client.rename_conversation(created.id, "Launch plans")
        assert renamed.title == "Launch plans" and renamed.updated_at >= created.updated_at

        page = await client.list_conversations(limit=1)
        assert [item.id for item in page.conversations] == [created.id] and page.next is not None
        rest = await client.list_conversations(limit=1, cursor=page.next)
        assert [item.id for item in rest.conversations] == [conversation]
        assert [item.id async for item in client.conversations(page_size=1)] == [created.id, conversation]
        by_agent = await client.list_conversations(agent="assistant")
        assert [item.id for item in by_agent.conversations] == [conversation]

        everything = await client.list_messages(conversation)
        assert [message["role"] for message in everything.messages] == ["user", "assistant"] * 2
        head = await client.list_messages(conversation, limit=3)
        tail = await client.list_messages(conversation, after=head.next)
        assert [m["id"] for m in head.messages + tail.messages] == [m["id"] for m in everything.messages]
        assert len(tail.messages) == 1 and tail.next == everything.next
        assert (await client.list_messages(conversation, after=everything.next)).messages == []
        assistant_reply = everything.messages[-1]
        assert assistant_reply["id"] == second[0]["messageId"]
        assert assemble_ui_messages(second)[-1]["parts"] == assistant_reply["parts"]

        events = await client.list_events(conversation)
        assert [event.type for event in events.events] == ["run.started", "run.completed"] * 2
        one = await client.list_events(conversation, limit=1)
        after = await client.list_events(conversation, after=one.next)
        assert [e.id for e in one.events + after.events] == [e.id for e in events.events]

        feedback = await client.add_feedback(conversation, assistant_reply["id"], "up", comment="Clear.")
        assert isinstance(feedback, FeedbackOut)
        assert (feedback.rating, feedback.comment, feedback.message_id) == (
            "up",
            "Clear.",
            assistant_reply["id"],
        )

        await client.delete_conversation(created.id)
        with pytest.raises(BastionApiError) as gone:
            await client.get_conversation(created.id)
    assert gone.value.status == 404 and gone.value.code == "not_found"
    assert issued and set(issued) == {token}


async def test_a_refused_request_raises_its_status_code_and_field(served: Served) -> None:
    async with BastionClient(served.url, token=await token_of(served, "ada")) as client:
        with pytest.raises(BastionApiError) as missing:
            await client.get_conversation(str(uuid.uuid4()))
        with pytest.raises(BastionApiError) as malformed:
            await client.get_conversation("../../health")
        created = await client.create_conversation()
        with pytest.raises(BastionApiError) as too_long:
            await client.rename_conversation(created.id, "x" * 501)
        bad = {"id": "m1", "role": "system", "parts": [{"type": "text", "text": "hi"}]}
        with pytest.raises(BastionApiError) as bad_role:
            await collect(client.chat(str(uuid.uuid4()), [bad]))  # type: ignore[list-item]
        with pytest.raises(BastionApiError) as bad_cursor:
            await client.list_events(created.id, limit=1000)
        assert (await client.get_conversation(created.id)).title is None
        assert [item.id for item in (await client.list_conversations()).conversations] == [created.id]
    async with BastionClient(served.url) as anonymous:
        with pytest.raises(BastionApiError) as unsigned:
            await anonymous.list_conversations()
    assert (missing.value.status, missing.value.code, missing.value.field) == (404, "not_found", None)
    assert (malformed.value.status, malformed.value.code) == (404, "not_found")
    assert (too_long.value.status, too_long.value.code, too_long.value.field) == (
        400,
        "invalid_input",
        "title",
    )
    assert "500" in too_long.value.message
    assert (bad_role.value.status, bad_role.value.field) == (400, "messages[0].role")
    assert (bad_cursor.value.code, bad_cursor.value.field) == ("invalid_input", "limit")
    assert (unsigned.value.status, unsigned.value.code) == (401, "missing_token")
    assert unsigned.value.retry_after is None


async def test_a_busy_conversation_is_a_409_with_retry_after_and_resume_and_stop_follow_the_turn(
    served: Served,
) -> None:
    model = HeldModel()
    served.app.active_model = model
    async with BastionClient(served.url, token=await token_of(served, "lin")) as client:
        conversation = str(uuid.uuid4())
        with pytest.raises(BastionApiError) as unknown:
            await client.stop(conversation)
        assert unknown.value.status == 404
        running = asyncio.ensure_future(collect(client.chat(conversation, [user_message("hold on")])))
        try:
            await asyncio.wait_for(model.holding.wait(), 30)
            with pytest.raises(BastionApiError) as busy:
                await collect(client.chat(conversation, [user_message("are you there?")]))
            resumed = asyncio.ensure_future(collect(client.resume(conversation)))
            stopped = await client.stop(conversation)
            original, followed = await asyncio.wait_for(asyncio.gather(running, resumed), 30)
        finally:
            model.release.set()
            running.cancel()
        assert await client.stop(conversation) is None
        assert await collect(client.resume(conversation)) == []
        messages = (await client.list_messages(conversation)).messages
    assert (busy.value.status, busy.value.code) == (409, "turn_conflict")
    assert busy.value.retry_after is not None and 1 <= busy.value.retry_after <= 30
    assert stopped is not None and stopped.settled is True
    assert text_of(original) == text_of(followed) == "Hold "
    assert followed[0] == original[0] and followed[-1]["type"] == original[-1]["type"] == "finish"
    assert [message["role"] for message in messages] == ["user", "assistant"]
    assert messages[-1]["id"] == original[0]["messageId"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            b': comment\ndata: {"type":"start",\ndata: "messageId":"m"}\n\ndata: [DONE]\n\n',
            [{"type": "start", "messageId": "m"}],
        ),
        (b'data: {"type":"start"}\n\n', BastionStreamError),
        (b"data: [1, 2]\n\ndata: [DONE]\n\n", BastionStreamError),
    ],
    ids=["multi-line data and a comment", "no end", "not a chunk"],
)
async def test_the_stream_is_read_as_server_sent_events(body: bytes, expected: Any) -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as http:
        client = BastionClient("http://bastion.test", token="t", http=http)
        if isinstance(expected, list):
            assert await collect(client.resume(str(uuid.uuid4()))) == expected
        else:
            with pytest.raises(expected):
                await collect(client.resume(str(uuid.uuid4())))


async def test_an_error_body_that_is_not_bastions_still_raises_with_the_status_code() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(503, content=b"<html>down</html>", headers={"retry-after": "7"})

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(answer)) as http:
        client = BastionClient("http://bastion.test", http=http)
        with pytest.raises(BastionApiError) as error:
            await client.list_conversations()
    assert (error.value.status, error.value.code, error.value.retry_after) == (503, "unavailable", 7.0)


async def test_the_client_example_chats_rates_and_deletes(served: Served) -> None:
    served.app.active_model = ScriptedModel(["You are Ada."])
    example = load_example("api_client")
    token = await token_of(served, "ada")
    assert await example.main(served.url, token) == "You are Ada. [404 not_found]"
    async with BastionClient(served.url, token=token) as client:
        assert (await client.list_conversations()).conversations == []


async def test_the_client_keeps_an_applications_columns_and_state(tmp_path: Path) -> None:
    keys = SigningKeys()
    env = SupabaseEnv(url="https://project-ref.supabase.co", jwks=keys.jwks())
    token = es256(keys, user_claims(env.issuer, time.time(), sub="7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"))
    async with await SqliteStore.open(tmp_path / "app.sqlite3", schema=SCHEMA) as store:
        await store.migrate()
        await store.migrate_application(component="projects", migrations=[SQLITE_PROJECTS])
        routes = conversation_routes(store, rules=ConversationRules(state="write"))
        app = create_agent_worker(env=env, routes=routes)
        # In this loop (the store is this loop's), over the ASGI transport rather than a socket.
        async with (
            httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as http,
            BastionClient("http://app.test", token=token, http=http) as client,
        ):
            created = await client.create_conversation(title="Plan")
            assert created.model_extra == {"project_id": None, "state": None}
            changed = await client.set_conversation_state(created.id, {"step": 2})
            assert changed.model_extra is not None and changed.model_extra["state"] == {
                "step": 2,
                "notes": [],
            }
            with pytest.raises(BastionApiError) as invalid:
                await client.set_conversation_state(created.id, {"step": "two"})
            [listed] = (await client.list_conversations()).conversations
    assert listed.model_extra == changed.model_extra
    assert (invalid.value.status, invalid.value.code) == (400, "invalid_state")
