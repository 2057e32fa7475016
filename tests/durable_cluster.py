"""Durable chat workers as real processes on the test database, and what the take-over tests read.

`Cluster` starts `tests.durable_chat_worker` processes (uvicorn, DBOS, one Postgres store each),
kills them with SIGKILL, and reads back what the database holds: the stored messages, the effects
the scripted model and tools recorded, the run's state and its stream log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import psycopg

from bastion.chat.durable_turns import turn_workflow_id
from bastion.stores.live import ChunkBatch, StreamAssembly
from tests.conftest import MigratedDatabase
from tests.durable_chat_worker import EFFECTS_TABLE, PROJECT_URL
from tests.supabase_tokens import SigningKeys, es256, user_claims

ROOT = Path(__file__).resolve().parent.parent
ISSUER = f"{PROJECT_URL}/auth/v1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Worker:
    name: str
    url: str
    process: asyncio.subprocess.Process
    executor: str
    worker_key: int

    @property
    def alive(self) -> bool:
        return self.process.returncode is None


@dataclass
class Cluster:
    database: MigratedDatabase
    keys: SigningKeys = field(default_factory=SigningKeys)
    workers: list[Worker] = field(default_factory=list)
    starting: dict[str, asyncio.Task[Worker]] = field(default_factory=dict)
    delay: float = 0.05
    log_dir: Path | None = None
    # The source tree each worker runs, by name (another release's, in a rolling deploy); this one's else.
    releases: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        with self.admin() as conn:
            conn.execute(EFFECTS_TABLE)

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.database.admin_dsn, autocommit=True)

    def headers(self, user: str) -> dict[str, str]:
        token = es256(self.keys, user_claims(ISSUER, time.time(), sub=user))
        return {"Authorization": f"Bearer {token}"}

    async def start(
        self,
        name: str,
        *,
        die: str | None = None,
        start_delay: float = 0.0,
        pool_timeout: float = 30.0,
        extra_env: dict[str, str] | None = None,
    ) -> Worker:
        port = free_port()
        root = self.releases.get(name, ROOT)
        env = {
            **os.environ,
            "PYTHONPATH": f"{root / 'src'}:{root}",
            "BASTION_TEST_DSN": self.database.admin_dsn,
            "BASTION_TEST_APP_DSN": self.database.app_dsn,
            "BASTION_TEST_JWKS": json.dumps(self.keys.jwks()),
            "BASTION_TEST_DELAY": str(self.delay),
            "BASTION_EXECUTOR_ID": f"{name}-{uuid.uuid4().hex[:8]}",
            "BASTION_TEST_START_DELAY": str(start_delay),
            "BASTION_TEST_POOL_TIMEOUT": str(pool_timeout),
            **(extra_env or {}),
        }
        env.pop("BASTION_TEST_DIE", None)
        if die is not None:
            env["BASTION_TEST_DIE"] = die
        log = self.log_dir / f"{env['BASTION_EXECUTOR_ID']}.log" if self.log_dir else Path(os.devnull)
        with log.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.durable_chat_worker", str(port),
                cwd=root, env=env, stdout=asyncio.subprocess.PIPE, stderr=stderr,
            )  # fmt: skip
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode().split()
        assert line[:1] == ["ready"], f"worker {name} did not start"
        worker = Worker(name, f"http://127.0.0.1:{port}", process, line[1], int(line[2]))
        self.workers.append(worker)
        return worker

    async def worker(self, name: str, *, die: str | None = None) -> Worker:
        """The live worker called `name`, started when there is none (again, after a kill)."""
        for worker in self.workers:
            if worker.name == name and worker.alive:
                return worker
        if name not in self.starting or self.starting[name].done():
            self.starting[name] = asyncio.ensure_future(self.start(name, die=die))
        try:
            return await asyncio.shield(self.starting[name])
        finally:
            if self.starting.get(name) is not None and self.starting[name].done():
                del self.starting[name]

    def restart_soon(self, name: str) -> None:
        """Start the worker called `name` again in the background (`worker(name)` waits for it)."""
        if name not in self.starting or self.starting[name].done():
            self.starting[name] = asyncio.ensure_future(self.start(name))

    async def kill(self, worker: Worker) -> float:
        """SIGKILL the worker; the moment it died."""
        if worker.alive:
            worker.process.send_signal(signal.SIGKILL)
        await worker.process.wait()
        return time.monotonic()

    async def close(self) -> None:
        await asyncio.gather(*self.starting.values(), return_exceptions=True)
        for worker in self.workers:
            if worker.alive:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.process.wait(), 15)
            except TimeoutError:
                worker.process.kill()
                await worker.process.wait()

    # What the database holds

    def effects(self, conversation: str) -> list[tuple[str, str]]:
        with self.admin() as conn:
            rows = conn.execute(
                "select kind, executor from public.durable_turn_effects where conversation = %s order by at",
                (conversation,),
            ).fetchall()
        return [(kind, executor) for kind, executor in rows]

    def count(self, conversation: str, kind: str) -> int:
        return sum(1 for seen, _ in self.effects(conversation) if seen == kind)

    def messages(self, conversation: str) -> list[dict[str, Any]]:
        with self.admin() as conn:
            rows = conn.execute(
                "select message from bastion.messages where conversation_id = %s order by seq",
                (conversation,),
            ).fetchall()
        return [row[0] for row in rows]

    def logged_stream(self, run_id: str) -> list[dict[str, Any]]:
        """The run's stream as its log holds it, superseded attempts resolved (what a reader replays)."""
        assembly = StreamAssembly()
        with self.admin() as conn:
            for seq, reset, chunks in conn.execute(
                "select seq, reset, chunks from bastion.run_chunks where run_id = %s order by id", (run_id,)
            ):
                assembly.apply(ChunkBatch(seq, chunks, reset))
        return assembly.take()

    def workflow(self, conversation: str, run_id: str) -> tuple[str, str] | None:
        """The turn's workflow: its status and the executor that ran it last."""
        with self.admin() as conn:
            row = conn.execute(
                "select status, executor_id from dbos.workflow_status where workflow_uuid = %s",
                (turn_workflow_id(conversation, run_id),),
            ).fetchone()
        return (row[0], row[1]) if row else None

    def executor_alive(self, executor: str) -> bool:
        """Whether a process holds the executor's liveness lock (what the janitors read as alive)."""
        with self.admin() as conn:
            row = conn.execute(
                "select pg_try_advisory_lock(hashtextextended(%s, 0))", ("bastion.executor:" + executor,)
            ).fetchone()
        return not (row and row[0])  # taken here, it is released as this connection closes

    def listening(self, channel: str) -> bool:
        """Whether a connection of the application's role listens on `channel` (its last statement)."""
        with self.admin() as conn:
            row = conn.execute(
                "select count(*) from pg_stat_activity where usename = 'bastion_app' and query = %s",
                (f"listen {channel}",),
            ).fetchone()
        return bool(row and row[0])

    def run(self, conversation: str) -> tuple[str, str, int | None] | None:
        """The conversation's latest run: id, status, worker key."""
        with self.admin() as conn:
            row = conn.execute(
                "select id::text, status, worker_key from bastion.runs where conversation_id = %s "
                "order by started_at desc limit 1",
                (conversation,),
            ).fetchone()
        return (row[0], row[1], row[2]) if row else None


async def until(check: Callable[[], Any], timeout: float = 60.0, step: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(step)


def user_message(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


def sse_chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def post_turn(
    cluster: Cluster, worker: Worker, user: str, conversation: str, messages: list[dict[str, Any]]
) -> asyncio.Task[tuple[int, list[dict[str, Any]]]]:
    """POST a turn in the background: its status and the chunks it got before the stream ended or broke."""

    async def post() -> tuple[int, list[dict[str, Any]]]:
        body = {"id": conversation, "messages": messages, "trigger": "submit-message"}
        chunks: list[dict[str, Any]] = []
        async with httpx2.AsyncClient(timeout=60) as http:
            try:
                async with http.stream(
                    "POST", f"{worker.url}/api/chat", json=body, headers=cluster.headers(user)
                ) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            chunks.append(json.loads(line[6:]))
                    return response.status_code, chunks
            except httpx2.HTTPError:
                return -1, chunks

    return asyncio.ensure_future(post())


async def resumed_stream(
    cluster: Cluster, worker: Worker, user: str, conversation: str, *, timeout: float = 60.0
) -> list[dict[str, Any]] | None:
    """The turn in flight as `GET …/stream` serves it, read to its `finish`; None once none is in
    flight. A stream closed because a take-over superseded what it sent is read again from the start,
    as the AI SDK 6 client does."""
    deadline = time.monotonic() + timeout
    async with httpx2.AsyncClient(timeout=60) as http:
        while time.monotonic() < deadline:
            chunks: list[dict[str, Any]] = []
            with contextlib.suppress(httpx2.HTTPError):
                async with http.stream(
                    "GET", f"{worker.url}/api/chat/{conversation}/stream", headers=cluster.headers(user)
                ) as response:
                    if response.status_code == 204:
                        return None
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            chunks.append(json.loads(line[6:]))
            if chunks and chunks[-1]["type"] == "finish":
                return chunks
            await asyncio.sleep(0.05)
    raise AssertionError("The resumed stream never finished.")


@contextlib.asynccontextmanager
async def cluster_of(
    database: MigratedDatabase, delay: float = 0.05, log_dir: Path | None = None
) -> AsyncIterator[Cluster]:
    cluster = Cluster(database, delay=delay, log_dir=log_dir or _log_dir())
    try:
        yield cluster
    finally:
        await cluster.close()


def _log_dir() -> Path | None:
    """Where workers write their stderr, when `BASTION_TEST_WORKER_LOGS` names a directory."""
    where = os.environ.get("BASTION_TEST_WORKER_LOGS")
    return Path(where) if where else None
