"""The stream log's cost does not grow with a turn's duration: nobody following, a turn's log is stored
by the writes the turn makes anyway (its tool's claim, its close), as many batches for a slow model as
for a fast one; a reader that attaches mid-reply on another process asks the running worker to stream
live, and gets every chunk."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import psycopg
from pydantic_ai.models.function import FunctionModel

from bastion import define_agent
from bastion.auth import SupabaseEnv
from bastion.chat import chat_routes, create_agent_stream_response
from bastion.stores import PostgresStore
from bastion.stores.live import ChunkBatch, ChunkLog
from bastion.worker import create_agent_worker
from tests.conftest import MigratedDatabase
from tests.live_chat_worker import PROJECT_URL, paced, tools
from tests.live_server import served_here
from tests.supabase_tokens import SigningKeys, es256, user_claims

ROOT = Path(__file__).resolve().parent.parent
ISSUER = f"{PROJECT_URL}/auth/v1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def serve(database: MigratedDatabase, keys: SigningKeys) -> AsyncIterator[str]:
    """A worker in this process: the paced agent's chat routes over its own store."""
    store = await PostgresStore.open(database.app_dsn, max_size=4)
    agent = define_agent(name="paced", instructions="Answer.", tools=tools)
    routes = chat_routes(
        agent=agent, store=store, model=FunctionModel(stream_function=paced), context=lambda turn: turn
    )
    app = create_agent_worker(env=SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks()), routes=routes)
    try:
        async with served_here(app) as url:
            yield url
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def worker_process(database: MigratedDatabase, keys: SigningKeys) -> AsyncIterator[str]:
    """A worker in a process of its own (`tests.live_chat_worker`)."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "BASTION_TEST_APP_DSN": database.app_dsn,
        "BASTION_TEST_JWKS": json.dumps(keys.jwks()),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.live_chat_worker", str(port),
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        assert line.split() == [b"ready"], "the worker process did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), 30)


def headers(keys: SigningKeys, user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {es256(keys, user_claims(ISSUER, time.time(), sub=user))}"}


def turn_body(conversation: str, text: str) -> dict[str, Any]:
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": conversation, "messages": [message], "trigger": "submit-message"}


def chunks_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def log_batches(database: MigratedDatabase, conversation: str) -> list[list[dict[str, Any]]]:
    """The chunks of each batch the conversation's (only) run wrote to its stream log, in order."""
    with psycopg.connect(database.admin_dsn) as conn:
        rows = conn.execute(
            "select k.chunks from bastion.run_chunks k join bastion.runs r on r.id = k.run_id "
            "where r.conversation_id = %s order by k.id",
            (conversation,),
        ).fetchall()
    return [row[0] for row in rows]


async def test_a_turn_nobody_follows_writes_its_log_with_its_tool_claim_and_its_close_however_slow(
    migrated_database: MigratedDatabase,
) -> None:
    keys = SigningKeys()
    user = str(uuid.uuid4())
    written: list[int] = []
    async with serve(migrated_database, keys) as url, httpx2.AsyncClient(timeout=60) as http:
        # The process's first turn also checks for a stop once its listener is connected (one write
        # more); then 30 deltas at once, over about a second, and at once again.
        for milliseconds in (0, 0, 25, 1):
            conversation = str(uuid.uuid4())
            response = await http.post(
                f"{url}/api/chat",
                json=turn_body(conversation, f"paced 30 {milliseconds}"),
                headers=headers(keys, user),
            )
            assert response.status_code == 200, response.text
            sent = chunks_of(response.text)
            deltas = [c["delta"] for c in sent if c["type"] == "text-delta"]
            assert deltas == [f"w{index} " for index in range(30)]
            batches = log_batches(migrated_database, conversation)
            # The log holds every chunk the client was sent, `finish` included, in order.
            assert [chunk for batch in batches for chunk in batch] == sent
            written.append(len(batches))
    # Two steps (the tool call, then the text), and no write of the log's own: the tool's claim
    # stores the log up to the call, the turn's close the rest, `finish` included.
    assert written[1:] == [2, 2, 2], written


async def test_a_follower_attaching_mid_reply_on_another_process_gets_every_chunk_live(
    migrated_database: MigratedDatabase,
) -> None:
    keys = SigningKeys()
    user = str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    deltas = 60
    events: list[tuple[str, int]] = []  # (reader, text deltas it has read), in the order read

    async with (
        worker_process(migrated_database, keys) as running,
        serve(migrated_database, keys) as following,
        httpx2.AsyncClient(timeout=60) as http,
    ):
        body = turn_body(conversation, f"paced {deltas} 30")

        async def read(reader: str, response: httpx2.Response, attached: asyncio.Event | None) -> list[Any]:
            chunks: list[dict[str, Any]] = []
            count = 0
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                    if chunks[-1]["type"] == "text-delta":
                        count += 1
                        events.append((reader, count))
                        if attached is not None and count == 10:
                            attached.set()
            return chunks

        attached = asyncio.Event()
        async with http.stream(
            "POST", f"{running}/api/chat", json=body, headers=headers(keys, user)
        ) as posted:
            assert posted.status_code == 200
            posting = asyncio.ensure_future(read("posted", posted, attached))
            await asyncio.wait_for(attached.wait(), 30)
            async with http.stream(
                "GET", f"{following}/api/chat/{conversation}/stream", headers=headers(keys, user)
            ) as resumed:
                assert resumed.status_code == 200
                followed = await read("followed", resumed, None)
            sent = await posting
    assert followed == sent
    assert [c["type"] for c in followed][-1] == "finish"
    # Streamed live, not only at the step's end: the follower read most of the text while the
    # running worker was still streaming it.
    last = events.index(("posted", deltas))
    assert max((count for reader, count in events[:last] if reader == "followed"), default=0) >= deltas // 2


class _Chunks:
    """A finished turn's chunks, as a session's stream result."""

    finish_reason = "stop"
    cancelled = False

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for chunk in self._chunks:
            yield chunk


async def test_the_log_keeps_each_streamed_chunk_as_the_wire_json_it_was_sent_as() -> None:
    written: list[ChunkBatch] = []

    async def sink(batch: ChunkBatch) -> bool:
        written.append(batch)
        return False

    text = [{"type": "text-delta", "id": "0-0", "delta": f"w{index} "} for index in range(3)]
    chunks = [{"type": "start-step"}, {"type": "text-start", "id": "0-0"}, *text, {"type": "finish-step"}]
    log = ChunkLog(sink, interval=3600)
    response = create_agent_stream_response(_Chunks(chunks), original_messages=[], log=log)
    await response.run_detached()
    assert [chunk["type"] for batch in written for chunk in batch.chunks][-1] == "finish"
    for batch in written:
        # Each chunk's wire text, kept as it was sent, makes the batch's JSON: nothing encoded again.
        assert len(batch.encoded) == len(batch.chunks)
        assert json.loads(batch.json()) == list(batch.chunks)
