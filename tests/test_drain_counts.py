"""`bastion.drain.Drain` on the chat route, in one process: which turns it counts and waits for, and what
a draining worker answers (the stopping worker itself is in tests/test_drain.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import define_agent
from bastion.chat.endpoint import chat_routes
from bastion.chat.turn import ChatTurn
from bastion.drain import Drain
from bastion.stores import SqliteStore
from bastion.worker import create_agent_worker
from tests.test_chat_routes import IDENTITY, Project, user


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(tmp_path / "chat.sqlite3") as store:
        await store.migrate()
        yield store


class HeldModel:
    """A model whose reply waits until the test lets it go."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        self.asked.set()
        await self.answer.wait()
        yield "done"


def app_of(store: SqliteStore, project: Project, drain: Drain, model: Any, context: Any = None) -> Any:
    agent = define_agent(name="drained", instructions="Answer.")
    routes = chat_routes(
        agent=agent, store=store, model=model, context=context or (lambda turn: turn), drain=drain
    )
    return create_agent_worker(env=project.env, routes=[*routes, drain.ready_route()])


def chat_body(conversation: str, text: str = "hello") -> dict[str, Any]:
    return {"id": conversation, "messages": [user(text)], "trigger": "submit-message"}


async def test_a_drain_waits_for_the_running_turn_and_refuses_new_ones_storing_nothing(
    sqlite: SqliteStore,
) -> None:
    project, drain, held = Project(), Drain(), HeldModel()
    app = app_of(sqlite, project, drain, FunctionModel(stream_function=held.stream))
    running, refused = str(uuid.uuid4()), str(uuid.uuid4())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/ready")).json() == {"status": "ready"}
        turn = asyncio.ensure_future(
            http.post("/api/chat", json=chat_body(running), headers=project.headers())
        )
        await asyncio.wait_for(held.asked.wait(), 10)
        assert drain.running == 1
        assert await drain(0.05) == 1  # the deadline passed with the turn still running

        response = await http.post("/api/chat", json=chat_body(refused), headers=project.headers())
        assert response.status_code == 503
        assert response.json()["code"] == "draining"
        assert response.headers["Retry-After"] == "1"
        ready = await http.get("/ready")
        assert (ready.status_code, ready.json()["code"]) == (503, "draining")

        waiting = asyncio.ensure_future(drain.wait(10))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        held.answer.set()
        assert await waiting == 0
        assert (await turn).status_code == 200
    assert [m.role for m in await sqlite.list_messages(IDENTITY, running)] == ["user", "assistant"]
    conversations = await sqlite.list_conversations(IDENTITY)
    assert [c.id for c in conversations] == [running]


async def test_a_turn_refused_or_failed_before_it_streams_is_no_longer_counted(sqlite: SqliteStore) -> None:
    project, drain, held = Project(), Drain(), HeldModel()

    def failing_context(turn: ChatTurn) -> Any:
        raise RuntimeError("no context")

    failing = app_of(sqlite, project, drain, FunctionModel(stream_function=held.stream), failing_context)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=failing), base_url="http://t") as http:
        response = await http.post("/api/chat", json=chat_body(str(uuid.uuid4())), headers=project.headers())
        assert response.status_code == 500
    assert drain.running == 0

    app = app_of(sqlite, project, drain, FunctionModel(stream_function=held.stream))
    conversation = str(uuid.uuid4())
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as http:
        turn = asyncio.ensure_future(
            http.post("/api/chat", json=chat_body(conversation), headers=project.headers())
        )
        await asyncio.wait_for(held.asked.wait(), 10)
        busy = await http.post("/api/chat", json=chat_body(conversation, "again"), headers=project.headers())
        assert busy.status_code == 409  # the conversation's turn is running: refused by the claim
        assert drain.running == 1
        held.answer.set()
        assert (await turn).status_code == 200
    assert drain.running == 0
    assert await drain(0) == 0


async def test_a_drain_tells_what_registered_once_it_starts_and_only_once() -> None:
    drain, told = Drain(), []
    drain.on_start(lambda: told.append("engine"))
    assert await drain.wait(1) == 0 and told == []  # waiting alone does not start it
    assert await drain(0) == 0
    drain.start()
    assert told == ["engine"] and drain.draining


async def test_a_failing_drain_callback_neither_stops_the_drain_nor_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> None:
        raise RuntimeError("closed already")

    drain, told = Drain(), []
    drain.on_start(broken)
    drain.on_start(lambda: told.append("hooks"))
    drain.start()
    assert drain.draining and told == ["hooks"]
    assert "A drain callback failed" in caplog.text
