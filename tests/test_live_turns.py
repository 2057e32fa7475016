"""Live turns on Postgres: a running turn is stopped from another worker, and its stream is resumed
(AI SDK resume protocol) from its start and followed live, across two stores on one database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bastion import AgentTools, define_agent, tool
from bastion.auth import SupabaseEnv
from bastion.chat.endpoint import chat_routes
from bastion.chat.turn import ChatTurn
from bastion.stores import PostgresStore, StoreIdentity
from bastion.stores.live import ChunkBatch, ChunkLog, StreamAssembly
from bastion.worker import create_agent_worker
from tests.conftest import MigratedDatabase
from tests.live_server import served_here
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"
TENANT = "tenant-a"


class GatedModel(FunctionModel):
    """Streams `before`, waits for `gate`, then streams `after` (or calls a tool first, when asked)."""

    def __init__(self, before: Sequence[str], after: Sequence[str], *, tool_call: str | None = None) -> None:
        self.before = list(before)
        self.after = list(after)
        self.tool_call = tool_call
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self.calls = 0
        super().__init__(stream_function=self._stream)

    async def _stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        self.calls += 1
        if self.tool_call is not None and self.calls == 1:
            yield {
                0: DeltaToolCall(name=self.tool_call, json_args="{}", tool_call_id=f"call-{uuid.uuid4().hex}")
            }
            return
        for delta in self.before:
            yield delta
        self.waiting.set()
        await self.gate.wait()
        for delta in self.after:
            yield delta


@dataclass
class Worker:
    url: str
    store: PostgresStore


class Project:
    def __init__(self) -> None:
        self.keys = SigningKeys()
        self.env = SupabaseEnv(url=PROJECT_URL, jwks=self.keys.jwks())

    def headers(self, sub: str) -> dict[str, str]:
        token = es256(self.keys, user_claims(self.env.issuer, time.time(), sub=sub))
        return {"Authorization": f"Bearer {token}"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


tool_cancelled: list[str] = []


def slow_tools(turn: ChatTurn) -> AgentTools:
    @tool
    async def wait_forever() -> str:
        """Waits until cancelled."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            tool_cancelled.append(turn.conversation_id)
            raise
        return "never"

    return AgentTools(tools=[wait_forever])


@contextlib.asynccontextmanager
async def worker(database: MigratedDatabase, project: Project, model: FunctionModel) -> AsyncIterator[Worker]:
    """One worker process's worth: its own store (pool and listener) and its own HTTP server."""
    store = await PostgresStore.open(database.app_dsn, max_size=4)
    agent = define_agent(name="slow", instructions="Answer.", tools=slow_tools)
    routes = chat_routes(
        agent=agent, store=store, model=model, context=lambda turn: turn, stop_wait_seconds=5
    )
    app = create_agent_worker(env=project.env, routes=routes)
    try:
        async with served_here(app) as url:
            try:
                yield Worker(url=url, store=store)
            finally:
                if isinstance(model, GatedModel):
                    model.gate.set()  # a failed test must not leave a turn waiting forever
    finally:
        await store.close()


def user_message(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


def sse_chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def start_turn(
    http: httpx2.AsyncClient, url: str, headers: dict[str, str], conversation: str, text: str
) -> asyncio.Task[httpx2.Response]:
    body = {"id": conversation, "messages": [user_message(text)], "trigger": "submit-message"}
    return asyncio.ensure_future(http.post(f"{url}/api/chat", json=body, headers=headers))


async def test_a_resumed_stream_replays_the_turn_from_its_start_then_follows_it_live(
    migrated_database: MigratedDatabase,
) -> None:
    project = Project()
    model = GatedModel(["Hel", "lo"], [", ", "world."])
    ada, grace = str(uuid.uuid4()), str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    async with (
        worker(migrated_database, project, model) as first,
        worker(migrated_database, project, model) as second,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        nothing = await http.get(f"{second.url}/api/chat/{conversation}/stream", headers=project.headers(ada))
        assert nothing.status_code == 404
        for method, action in (("GET", "stream"), ("POST", "stop")):
            # A malformed id is not found, like a foreign one: ids cannot be probed by their shape.
            malformed = await http.request(
                method, f"{second.url}/api/chat/not-a-uuid/{action}", headers=project.headers(ada)
            )
            assert (malformed.status_code, malformed.json()["code"]) == (404, "not_found")
        posted = await start_turn(http, first.url, project.headers(ada), conversation, "hi")
        await model.waiting.wait()
        foreign = await http.get(
            f"{second.url}/api/chat/{conversation}/stream", headers=project.headers(grace)
        )
        assert foreign.status_code == 404
        async with http.stream(
            "GET", f"{second.url}/api/chat/{conversation}/stream", headers=project.headers(ada)
        ) as resumed:
            assert resumed.status_code == 200
            assert resumed.headers["x-vercel-ai-ui-message-stream"] == "v1"
            lines = resumed.aiter_lines()
            replayed: list[dict[str, Any]] = []
            while "".join(c.get("delta", "") for c in replayed) != "Hello":
                line = await anext(lines)
                if line.startswith("data: {"):
                    replayed.append(json.loads(line[6:]))
            model.gate.set()
            rest = [line async for line in lines]
        followed = replayed + sse_chunks("\n".join(rest))
        response = await posted
        assert rest[-2:] == ["data: [DONE]", ""] or rest[-1] == "data: [DONE]"
        assert followed == sse_chunks(response.text)
        assert followed[0]["type"] == "start"
        assert "".join(c["delta"] for c in followed if c["type"] == "text-delta") == "Hello, world."
        after = await http.get(f"{second.url}/api/chat/{conversation}/stream", headers=project.headers(ada))
        assert after.status_code == 204


async def test_a_turn_is_stopped_from_another_worker_and_keeps_what_it_streamed(
    migrated_database: MigratedDatabase,
) -> None:
    project = Project()
    model = GatedModel(["Partial ", "answer"], [" that never comes."])
    ada, grace = str(uuid.uuid4()), str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    identity = StoreIdentity(user_id=ada, tenant_id=TENANT)
    async with (
        worker(migrated_database, project, model) as first,
        worker(migrated_database, project, model) as second,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        idle = await http.post(f"{second.url}/api/chat/{conversation}/stop", headers=project.headers(ada))
        assert idle.status_code == 404
        posted = await start_turn(http, first.url, project.headers(ada), conversation, "hi")
        await model.waiting.wait()
        # Wait until the partial text reached the log, so "what was streamed" is well defined.
        await wait_for_chunks(second.store, identity, conversation, "Partial answer")
        foreign = await http.post(
            f"{second.url}/api/chat/{conversation}/stop", headers=project.headers(grace)
        )
        assert foreign.status_code == 404
        stopped = await http.post(f"{second.url}/api/chat/{conversation}/stop", headers=project.headers(ada))
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["settled"] is True
        response = await posted
        chunks = sse_chunks(response.text)
        assert [c["type"] for c in chunks][-2:] == ["abort", "finish"]
        stored = await first.store.list_messages(identity, conversation)
        assert [m.role for m in stored] == ["user", "assistant"]
        text = [p["text"] for p in stored[-1].message["parts"] if p["type"] == "text"]
        assert text == ["Partial answer"]
        events = [e.type for e in await first.store.list_events(identity, conversation)]
        assert events[-1] == "run.cancelled"
        again = await http.post(f"{second.url}/api/chat/{conversation}/stop", headers=project.headers(ada))
        assert again.status_code == 204
        model.gate.set()
        next_turn = await start_turn(http, second.url, project.headers(ada), conversation, "again")
        assert (await next_turn).status_code == 200


async def wait_for_chunks(
    store: PostgresStore, identity: StoreIdentity, conversation: str, text: str
) -> None:
    """Follow the conversation's running turn through `store` (another worker's) until its text is `text`:
    the follower makes the running worker write its stream log at once."""
    live = store.live_turns()
    for _ in range(150):
        current = await live.live_run(identity, conversation)
        if current is not None:
            streamed = ""
            chunks = live.follow(identity, current.run_id)
            try:
                async with asyncio.timeout(5):
                    async for chunk in chunks:
                        streamed += chunk.get("delta", "") if chunk["type"] == "text-delta" else ""
                        if streamed == text:
                            return
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(0.02)
    raise AssertionError("The turn's stream never reached the log.")


def test_a_reset_supersedes_an_earlier_attempt_and_repeated_chunks_are_skipped() -> None:
    start, step = {"type": "start"}, {"type": "start-step"}
    a1, a2, b1 = ({"type": "text-delta", "id": "0-0", "delta": d} for d in ("dead ", "attempt", "new"))
    replay = StreamAssembly()
    for batch in (
        ChunkBatch(0, [start, step, a1]),
        ChunkBatch(3, [a2]),
        ChunkBatch(0, [start, step]),  # a taken-over turn rewrites its deterministic prefix
        ChunkBatch(2, [b1], reset=True),
    ):
        assert replay.apply(batch) is False
    assert replay.take() == [start, step, b1]

    live = StreamAssembly()
    live.apply(ChunkBatch(0, [start, step, a1]))
    assert live.take() == [start, step, a1]
    assert live.apply(ChunkBatch(2, [b1], reset=True)) is True
    assert live.take() == [b1]


async def test_a_durable_mark_rides_on_the_logs_next_write_or_on_a_write_of_no_chunks() -> None:
    written: list[ChunkBatch] = []
    failing = [False]

    async def sink(batch: ChunkBatch) -> bool:
        if failing[0]:
            failing[0] = False
            raise OSError("the database went away")
        written.append(batch)
        return False

    log = ChunkLog(sink, interval=3600)  # written only when flushed here
    log.add({"type": "start"})
    await log.flush()
    log.mark_durable()
    failing[0] = True
    await log.flush()  # the write carrying the mark fails: the mark waits for the next write
    log.add({"type": "start-step"})
    await log.flush()
    log.mark_durable()
    await log.flush()  # nothing to log: a write of no chunks carries the mark
    await log.flush()
    await log.close()
    assert [(batch.seq, len(batch.chunks), batch.durable) for batch in written] == [
        (0, 1, False),
        (1, 1, True),
        (2, 0, True),
    ]


async def test_closing_the_log_while_a_write_waits_for_the_database_writes_that_batch_again() -> None:
    written: list[ChunkBatch] = []
    waiting = asyncio.Event()
    stalled = [True]

    async def sink(batch: ChunkBatch) -> bool:
        if stalled[0]:  # a write waiting for a connection while the database restarts
            stalled[0] = False
            waiting.set()
            await asyncio.Event().wait()
        written.append(batch)
        return False

    log = ChunkLog(sink, interval=3600)
    log.add({"type": "start"})
    log.add({"type": "finish-step"})  # a step boundary: written in the background at once
    await waiting.wait()
    log.add({"type": "finish"})
    await log.close()  # stops the writer mid-write, then writes what the log holds
    types = [chunk["type"] for batch in written for chunk in batch.chunks]
    assert types == ["start", "finish-step", "finish"]
    assert written[0].seq == 0


@pytest.mark.parametrize("position", [0, 2])
def test_a_gap_shows_nothing_past_it(position: int) -> None:
    assembly = StreamAssembly()
    assembly.apply(ChunkBatch(0, [{"type": "start"}][:position] or [{"type": "start"}]))
    assert assembly.apply(ChunkBatch(5, [{"type": "finish"}])) is False
    assert not assembly.finished


async def test_a_replayed_log_of_a_taken_over_turn_is_read_without_retracting_anything(
    store: PostgresStore,
) -> None:
    """A reader that joins after a take-over reads the dead attempt and the reset that supersedes it in one
    go: it must send only what stands, so an AI SDK 6 client (no `reset-step`) can read the turn at all."""
    from bastion import start_agent_run
    from bastion.stores import TurnContext

    identity = StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=TENANT)
    conversation = (await store.create_conversation(identity, title="t")).id
    first = [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]
    run = await start_agent_run(
        persistence=store.persistence(),
        context=TurnContext(identity=identity, conversation_id=conversation, request_id=str(uuid.uuid4())),
        messages=first,
        trigger="submit-message",
    )
    live = store.live_turns()
    log = live.log(identity, run.state.run_id, on_stop=lambda: None)
    start, step = {"type": "start", "messageId": "a1"}, {"type": "start-step"}
    text = {"type": "text-start", "id": "0-0"}
    for chunk in (start, step, text, {"type": "text-delta", "id": "0-0", "delta": "dead"}):
        log.add(chunk)
    await log.flush()
    log.reset()
    log.add({"type": "text-delta", "id": "0-0", "delta": "kept"})
    await log.flush()
    taken_over = live.log(identity, run.state.run_id, on_stop=lambda: None)
    for chunk in (start, step, text):
        taken_over.add(chunk)
    taken_over.reset()
    for chunk in ({"type": "text-delta", "id": "0-0", "delta": "final"}, {"type": "finish"}):
        taken_over.add(chunk)
    await taken_over.close()
    await log.close()
    read = [chunk async for chunk in live.follow(identity, run.state.run_id)]
    assert [chunk.get("delta") for chunk in read if chunk["type"] == "text-delta"] == ["final"]
    assert read[-1] == {"type": "finish"}


async def test_a_superseded_follow_ends_the_events_without_done_and_without_an_error() -> None:
    from bastion.chat.endpoint import _events
    from bastion.stores.live import StreamSuperseded

    async def superseded() -> AsyncIterator[dict[str, Any]]:
        yield {"type": "start"}
        raise StreamSuperseded()

    assert [event async for event in _events(superseded())] == [b'data: {"type":"start"}\n\n']
