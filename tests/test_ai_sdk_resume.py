"""The real AI SDK clients (ai 7 and 6, under node) against live turns on Postgres over HTTP: a client
that connects in the middle of a turn resumes it (`resumeStream()`, what `useChat({ resume: true })`
calls) and ends with the stored message; with nothing in flight it gets 204 and does nothing; the
stop route (what the page's Stop button calls) ends a turn, which keeps what it streamed, and the
conversation takes its next turn; the client's own `stop()` only disconnects, and resuming picks the
turn up again."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import define_agent
from bastion.auth import SupabaseEnv
from bastion.chat.endpoint import chat_routes
from bastion.stores import PostgresStore, StoreIdentity
from bastion.worker import create_agent_worker
from tests.ai_sdk import SDKS, resume, run_chat, send
from tests.conftest import MigratedDatabase
from tests.live_server import served_here
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"
TENANT = "tenant-a"
BEFORE = ["Hel", "lo"]
AFTER = [", ", "wor", "ld."]
# What any one step may take at most (a few seconds normally): a broken stop or resume fails, not hangs.
WAIT = 20

ASGIApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
    Awaitable[None],
]


class PacedModel(FunctionModel):
    """A message starting with "slow" streams `BEFORE`, waits for `gate`, then streams `AFTER`; any
    other message is answered at once."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        super().__init__(stream_function=self._stream, model_name="paced")

    async def _stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        last = messages[-1]
        prompt = next((p for p in last.parts if isinstance(p, UserPromptPart)), None)
        if isinstance(last, ModelRequest) and prompt is not None and str(prompt.content).startswith("slow"):
            for delta in BEFORE:
                yield delta
            self.waiting.set()
            await self.gate.wait()
            for delta in AFTER:
                yield delta
        else:
            yield "Fine."


@dataclass
class Served:
    url: str
    store: PostgresStore
    keys: SigningKeys
    env: SupabaseEnv
    # Set once a resume request is answered with a stream (the turn is in flight and followed).
    resumed: asyncio.Event = field(default_factory=asyncio.Event)

    def headers(self, sub: str) -> dict[str, str]:
        token = es256(self.keys, user_claims(self.env.issuer, time.time(), sub=sub))
        return {"Authorization": f"Bearer {token}"}


def noticing_resumes(app: ASGIApp, resumed: asyncio.Event) -> ASGIApp:
    """`app`, setting `resumed` when a resume request starts answering with a stream."""

    async def wrapped(
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/stream"):
            await app(scope, receive, send)
            return

        async def noticing(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.start" and message["status"] == 200:
                resumed.set()

        await app(scope, receive, noticing)

    return wrapped


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def serve(database: MigratedDatabase, model: PacedModel) -> AsyncIterator[Served]:
    """The framework's chat routes over a Postgres store, served by uvicorn."""
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    store = await PostgresStore.open(database.app_dsn, max_size=4)
    agent = define_agent(name="paced", instructions="Answer.")
    routes = chat_routes(
        agent=agent, store=store, model=model, context=lambda turn: turn, stop_wait_seconds=5
    )
    resumed = asyncio.Event()
    app = noticing_resumes(create_agent_worker(env=env, routes=routes), resumed)
    try:
        async with served_here(app) as url:
            try:
                yield Served(url=url, store=store, keys=keys, env=env, resumed=resumed)
            finally:
                model.gate.set()  # a failed test must not leave a turn waiting forever
    finally:
        await store.close()


def user_message(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


def reply_text(message: dict[str, Any]) -> str:
    return "".join(part["text"] for part in message["parts"] if part["type"] == "text")


def stream_path(conversation: str, sdk: str) -> str:
    """The resume request each client makes: AI SDK 7 asks for `reset-step` retractions."""
    return f"/api/chat/{conversation}/stream" + ("?resetStep=1" if sdk == "7" else "")


@pytest.mark.parametrize("sdk", SDKS)
async def test_a_client_that_connects_mid_turn_resumes_it_and_ends_with_the_stored_message(
    migrated_database: MigratedDatabase, sdk: str
) -> None:
    model = PacedModel()
    ada = str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    identity = StoreIdentity(user_id=ada, tenant_id=TENANT)
    asked = user_message("slow please")
    async with serve(migrated_database, model) as served, httpx2.AsyncClient(timeout=30) as http:
        # Another tab sends the message; this client arrives while the reply is half written, as a
        # page reloaded mid-reply does: with the stored messages, then `resumeStream()`.
        body = {"id": conversation, "messages": [asked], "trigger": "submit-message"}
        posted = asyncio.ensure_future(
            http.post(f"{served.url}/api/chat", json=body, headers=served.headers(ada))
        )
        await asyncio.wait_for(model.waiting.wait(), WAIT)
        client = asyncio.ensure_future(
            run_chat(
                sdk,
                f"{served.url}/api/chat",
                [resume(), resume()],
                messages=[asked],
                headers=served.headers(ada),
                chat_id=conversation,
                timeout=WAIT,
                reset_step=sdk == "7",
            )
        )
        await asyncio.wait_for(served.resumed.wait(), WAIT)
        model.gate.set()
        resumed, idle = await client
        assert (await posted).status_code == 200
        stored = [m.message for m in await served.store.list_messages(identity, conversation)]

    assert resumed["status"] == "ready", resumed["error"]
    assert resumed["requests"] == [{"method": "GET", "path": stream_path(conversation, sdk), "status": 200}]
    # The replay from the turn's start gave the words written before the client came, then the rest.
    assert reply_text(resumed["messages"][-1]) == "".join(BEFORE + AFTER)
    assert resumed["messages"] == stored
    # Once the turn ended there is nothing to resume: 204, and the client changes nothing.
    assert idle["status"] == "ready" and idle["error"] is None
    assert idle["requests"] == [{"method": "GET", "path": stream_path(conversation, sdk), "status": 204}]
    assert idle["messages"] == stored


@pytest.mark.parametrize("sdk", SDKS)
async def test_with_nothing_in_flight_a_resuming_client_gets_204_and_does_nothing(
    migrated_database: MigratedDatabase, sdk: str
) -> None:
    model = PacedModel()
    ada = str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    identity = StoreIdentity(user_id=ada, tenant_id=TENANT)
    async with serve(migrated_database, model) as served:
        url, headers = f"{served.url}/api/chat", served.headers(ada)
        [answered] = await run_chat(sdk, url, [send("hello")], headers=headers, chat_id=conversation)
        stored = [m.message for m in await served.store.list_messages(identity, conversation)]
        # A fresh client with the stored history, as a page opened on this conversation.
        [idle] = await run_chat(
            sdk,
            url,
            [resume()],
            messages=stored,
            headers=headers,
            chat_id=conversation,
            reset_step=sdk == "7",
        )

    assert answered["status"] == "ready", answered["error"]
    assert reply_text(stored[-1]) == "Fine."
    assert idle == {
        "status": "ready",
        "error": None,
        "finishReason": None,
        "messages": stored,
        "requests": [{"method": "GET", "path": stream_path(conversation, sdk), "status": 204}],
    }


@pytest.mark.parametrize("sdk", SDKS)
async def test_the_stop_route_ends_the_turn_with_what_it_streamed_and_the_conversation_goes_on(
    migrated_database: MigratedDatabase, sdk: str
) -> None:
    model = PacedModel()
    ada = str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    identity = StoreIdentity(user_id=ada, tenant_id=TENANT)
    async with serve(migrated_database, model) as served:
        stopped, after = await run_chat(
            sdk,
            f"{served.url}/api/chat",
            [send("slow please", interrupt="stop", when="".join(BEFORE)), send("and now?")],
            headers=served.headers(ada),
            chat_id=conversation,
            timeout=WAIT,
        )
        stored = [m.message for m in await served.store.list_messages(identity, conversation)]
        events = [e.type for e in await served.store.list_events(identity, conversation)]

    assert stopped["status"] == "ready", stopped["error"]
    chat, stop = stopped["requests"]
    assert (chat["method"], chat["path"], chat["status"]) == ("POST", "/api/chat", 200)
    assert stop == {"method": "POST", "path": f"/api/chat/{conversation}/stop", "status": 200}
    # The reply stopped where it was: what the client shows is what was saved, and no more came.
    assert reply_text(stopped["messages"][-1]) == "".join(BEFORE)
    assert stopped["messages"] == stored[:2]
    assert [e for e in events if e.startswith("run.")] == [
        "run.started",
        "run.cancelled",
        "run.started",
        "run.completed",
    ]
    assert after["status"] == "ready", after["error"]
    assert reply_text(after["messages"][-1]) == "Fine."
    assert after["messages"] == stored
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("sdk", SDKS)
async def test_the_clients_own_stop_only_disconnects_and_resuming_picks_the_turn_up_again(
    migrated_database: MigratedDatabase, sdk: str
) -> None:
    model = PacedModel()
    ada = str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    identity = StoreIdentity(user_id=ada, tenant_id=TENANT)
    async with serve(migrated_database, model) as served:
        client = asyncio.ensure_future(
            run_chat(
                sdk,
                f"{served.url}/api/chat",
                [send("slow please", interrupt="disconnect", when="".join(BEFORE)), resume()],
                headers=served.headers(ada),
                chat_id=conversation,
                timeout=WAIT,
                reset_step=sdk == "7",
            )
        )
        # The turn waits for the gate until the client reconnects: it cannot have ended meanwhile.
        await asyncio.wait_for(served.resumed.wait(), WAIT)
        model.gate.set()
        disconnected, resumed = await client
        stored = [m.message for m in await served.store.list_messages(identity, conversation)]
        events = [e.type for e in await served.store.list_events(identity, conversation)]

    assert disconnected["status"] == "ready", disconnected["error"]
    assert reply_text(disconnected["messages"][-1]) == "".join(BEFORE)
    assert resumed["status"] == "ready", resumed["error"]
    assert resumed["requests"] == [{"method": "GET", "path": stream_path(conversation, sdk), "status": 200}]
    assert reply_text(resumed["messages"][-1]) == "".join(BEFORE + AFTER)
    assert resumed["messages"] == stored
    assert [e for e in events if e.startswith("run.")] == ["run.started", "run.completed"]
