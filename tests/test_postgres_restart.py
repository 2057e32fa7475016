"""Postgres restarted under a running worker (as a failover looks to it): requests are answered or refused
with 503 and `Retry-After`, never 500, and the worker recovers by itself, without a restart.

The module runs its own embedded server (`PostgresCluster(own=True)`), so stopping it disturbs no other
test; the workers are `tests.durable_chat_worker` processes (uvicorn, DBOS, a Postgres store), and the
assistant runs in this process (its hooks delivered by DBOS).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest

from bastion.durable import DurableEngine, migrate_durable
from bastion.hooks.delivery import CHANNEL as HOOKS_CHANNEL
from bastion.stores import apply_migrations
from bastion.stores.postgres_live import CHANNEL
from tests.conftest import MigratedDatabase
from tests.durable_cluster import (
    Cluster,
    Worker,
    cluster_of,
    post_turn,
    resumed_stream,
    until,
    user_message,
)
from tests.pg import PostgresCluster
from tests.test_assistant import chat, serve_assistant

# How long a request waits for a pooled connection while the database is down, before its 503.
POOL_TIMEOUT = 3.0
# Turns in flight when the database restarts.
TURNS = 6


@pytest.fixture(scope="module")
def restartable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigratedDatabase]:
    """A migrated database on a server of the module's own, which the tests stop and start."""
    cluster = PostgresCluster(Path(tmp_path_factory.mktemp("restartable")) / "data", own=True)
    name = cluster.database()
    asyncio.run(apply_migrations(cluster.dsn(name)))
    cluster.create_login_roles()
    asyncio.run(migrate_durable(cluster.dsn(name), app_role="bastion_app"))
    yield MigratedDatabase(cluster, name)
    cluster.close(stop=True)


async def probe(cluster: Cluster, worker: Worker, user: str, conversation: str) -> tuple[int, str | None]:
    """One request that reads the database (is a turn in flight?): its status and `Retry-After`."""
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.get(
            f"{worker.url}/api/chat/{conversation}/stream", headers=cluster.headers(user)
        )
    return response.status_code, response.headers.get("retry-after")


async def test_requests_across_a_postgres_restart_get_503_with_retry_after_never_500(
    restartable: MigratedDatabase,
) -> None:
    async with cluster_of(restartable) as cluster:
        worker = await cluster.start("steady", pool_timeout=POOL_TIMEOUT)
        user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
        status, chunks = await (await post_turn(cluster, worker, user, conversation, [user_message("hello")]))
        assert status == 200 and chunks[-1]["type"] == "finish"

        async def warm() -> None:
            """Every connection of the worker's pool in use at once, so the restart breaks each."""
            probes = await asyncio.gather(*(probe(cluster, worker, user, conversation) for _ in range(8)))
            assert {answer for answer in probes} == {(204, None)}

        # A restart between requests: the pool replaces the connections it broke before handing them out.
        await warm()
        restartable.cluster.stop()
        restartable.cluster.start()
        assert [await probe(cluster, worker, user, conversation) for _ in range(8)] == [(204, None)] * 8

        # Requests while the database is down are refused with Retry-After; after it is back, each is
        # answered or refused for a moment, and the worker serves again without a restart.
        await warm()
        restartable.cluster.stop()
        down = [await probe(cluster, worker, user, conversation) for _ in range(2)]
        restartable.cluster.start()
        after = [await probe(cluster, worker, user, conversation) for _ in range(12)]
        assert down == [(503, "2")] * 2
        assert all(answer in {(204, None), (503, "2")} for answer in after), after
        assert after[-3:] == [(204, None)] * 3, after

        history = cluster.messages(conversation)
        status, chunks = await (
            await post_turn(cluster, worker, user, conversation, [*history, user_message("again")])
        )
        assert status == 200 and chunks[-1]["type"] == "finish"


async def turn_refused(cluster: Cluster, worker: Worker, user: str) -> tuple[int, str | None, str]:
    """A new turn asked for: its status, `Retry-After` and error code."""
    body = {"id": str(uuid.uuid4()), "messages": [user_message("hello")], "trigger": "submit-message"}
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.post(f"{worker.url}/api/chat", json=body, headers=cluster.headers(user))
    return response.status_code, response.headers.get("retry-after"), response.json()["code"]


async def follow_once(
    cluster: Cluster, worker: Worker, user: str, conversation: str, reading: asyncio.Event
) -> tuple[int, list[dict[str, Any]]]:
    """One `GET …/stream` of the turn in flight, read until it ends or breaks: its status and chunks
    (`reading` is set at the first)."""
    chunks: list[dict[str, Any]] = []
    async with httpx2.AsyncClient(timeout=60) as http:
        try:
            async with http.stream(
                "GET", f"{worker.url}/api/chat/{conversation}/stream", headers=cluster.headers(user)
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))
                        reading.set()
                return response.status_code, chunks
        except httpx2.HTTPError:
            return -1, chunks
        finally:
            reading.set()


def outcome(cluster: Cluster, conversation: str, answer: tuple[int, list[dict[str, Any]]]) -> str:
    """What became of a turn: `completed` (stored whole, streamed to its `finish`) or `failed` (the
    client saw an error: a refusal or an `error` chunk, and the run is settled); anything else fails."""
    status, chunks = answer
    run = cluster.run(conversation)
    types = [chunk["type"] for chunk in chunks]
    if status == 200 and types[-1:] == ["finish"] and "error" not in types:
        assert run is not None and run[1] == "completed", (run, types)
        assert [m["role"] for m in cluster.messages(conversation)] == ["user", "assistant"]
        return "completed"
    assert status != 200 or "error" in types, f"a turn ended silently: {status} {types}"
    assert run is None or run[1] != "running", run
    return "failed"


async def test_turns_in_flight_across_a_postgres_restart_complete_or_fail_visibly_and_new_turns_work(
    restartable: MigratedDatabase,
) -> None:
    async with cluster_of(restartable) as cluster:
        worker = await cluster.start("steady", pool_timeout=POOL_TIMEOUT)
        user = str(uuid.uuid4())
        conversations = [str(uuid.uuid4()) for _ in range(TURNS)]
        posted = [
            await post_turn(cluster, worker, user, conversation, [user_message(f"turn {conversation}")])
            for conversation in conversations
        ]
        # Every turn is streaming its first model request when the database crashes (no checkpoint: it
        # recovers from its write-ahead log, as after a failover). A turn asked for meanwhile is refused.
        await until(lambda: all(cluster.count(c, "model:turn:0") for c in conversations), 30)
        reading = [asyncio.Event() for _ in range(2)]
        followers = [
            asyncio.ensure_future(follow_once(cluster, worker, user, c, read))
            for c, read in zip(conversations, reading, strict=False)
        ]
        await asyncio.wait_for(asyncio.gather(*(read.wait() for read in reading)), 30)
        restartable.cluster.stop(mode="immediate")
        refused = await turn_refused(cluster, worker, user)
        restartable.cluster.start()
        answers = await asyncio.wait_for(asyncio.gather(*posted), 90)  # no turn hangs
        followed = await asyncio.wait_for(asyncio.gather(*followers), 90)  # nor any follower
        assert refused == (503, "2", "database_unavailable"), refused
        # A turn whose run was left running by the outage settles once its lease runs out, at most.
        await until(lambda: all((run := cluster.run(c)) and run[1] != "running" for c in conversations), 60)
        outcomes = [outcome(cluster, c, answer) for c, answer in zip(conversations, answers, strict=True)]
        print(f"turns across a Postgres restart: {outcomes.count('completed')} completed, "
              f"{outcomes.count('failed')} failed visibly, of {TURNS}")  # fmt: skip
        for conversation in conversations:
            assert cluster.count(conversation, "tool:start") <= 1, cluster.effects(conversation)
        # Every turn's workflow ends too (none left PENDING for a janitor to run again).
        await until(lambda: all(settled_workflow(cluster, c) for c in conversations), 30)
        # A follower rides the outage out with its turn: it reads the reply its turn's client read.
        for (status, chunks), answer in zip(followed, answers, strict=False):
            assert status == 200 and chunks[-1]["type"] == answer[1][-1]["type"], (chunks[-3:], answer)
            assert texts(chunks) == texts(answer[1])

        # The same worker serves new turns, durable again: pools, listener and DBOS reconnected.
        await new_turn_streams_to_its_post_and_its_followers(cluster, worker, user)
        assert cluster.listening(CHANNEL), "the live turns' listener did not reconnect"
        # Its janitor holds the executor's liveness lock again: no other worker takes its turns for dead.
        await until(lambda: cluster.executor_alive(worker.executor), 30)
        for conversation in conversations:
            history = cluster.messages(conversation)
            if history and history[-1]["role"] == "user":
                history = history[:-1]  # a failed turn stored its user message alone
            status, chunks = await (
                await post_turn(cluster, worker, user, conversation, [*history, user_message("again")])
            )
            assert status == 200 and chunks[-1]["type"] == "finish", (status, chunks[-3:])


async def new_turn_streams_to_its_post_and_its_followers(cluster: Cluster, worker: Worker, user: str) -> None:
    """A new turn with a tool call runs once, durably, and the clients that resume it while it streams
    (`GET …/stream`, as a reloaded page does) read the whole reply live."""
    fresh = str(uuid.uuid4())
    posted = await post_turn(cluster, worker, user, fresh, [user_message(f"turn {fresh}")])
    await until(lambda: cluster.count(fresh, "model:turn:0"), 30)
    followed = await asyncio.wait_for(
        asyncio.gather(*(resumed_stream(cluster, worker, user, fresh, timeout=30) for _ in range(2))), 60
    )
    status, chunks = await asyncio.wait_for(posted, 60)
    assert status == 200 and chunks[-1]["type"] == "finish", chunks[-3:]
    for follower in followed:
        assert follower is not None and texts(follower) == texts(chunks), (follower, chunks)
    run = cluster.run(fresh)
    assert run is not None and run[1] == "completed"
    assert cluster.count(fresh, "tool:start") == 1
    await until(lambda: (found := cluster.workflow(fresh, run[0])) and found[0] == "SUCCESS", 30)


def settled_workflow(cluster: Cluster, conversation: str) -> bool:
    run = cluster.run(conversation)
    found = cluster.workflow(conversation, run[0]) if run else None
    return found is not None and found[0] in ("SUCCESS", "ERROR")


def texts(chunks: list[dict[str, Any]]) -> str:
    return "".join(chunk.get("delta", "") for chunk in chunks if chunk["type"] == "text-delta")


async def test_the_assistant_delivers_its_hooks_again_after_a_postgres_restart(
    restartable: MigratedDatabase, tmp_path: Path
) -> None:
    """The assistant in this process (uvicorn, DBOS, hook delivery): its hooks' listener reconnects, and a
    turn after the restart reaches the chat tables through a hook delivery, without restarting it."""

    def chats(conversation: str) -> int:
        with psycopg.connect(served.config.database_url, autocommit=True) as conn:
            row = conn.execute(
                "select count(*) from bastion.ai_chats where conversation_id = %s", (conversation,)
            ).fetchone()
        return int(row[0]) if row else 0

    def hooks_listening() -> bool:
        with psycopg.connect(served.config.database_url, autocommit=True) as conn:
            row = conn.execute(
                "select count(*) from pg_stat_activity where datname = current_database() and query = %s",
                (f"listen {HOOKS_CHANNEL}",),
            ).fetchone()
        return bool(row and row[0])

    async with serve_assistant(restartable.cluster, tmp_path) as served:
        headers = await served.sign_in("ada")
        before = str(uuid.uuid4())
        assert (await chat(served, headers, before, [user_message("hello")])).status_code == 200
        await until(lambda: chats(before), 30)
        assert hooks_listening()

        restartable.cluster.stop(mode="immediate")
        restartable.cluster.start()
        after = str(uuid.uuid4())
        statuses = [(await chat(served, headers, after, [user_message("again")])).status_code]
        while statuses[-1] == 503 and len(statuses) < 10:  # refused while the pool reconnects, at most
            await asyncio.sleep(0.5)
            statuses.append((await chat(served, headers, after, [user_message("again")])).status_code)
        assert statuses[-1] == 200 and set(statuses[:-1]) <= {503}, statuses
        await until(lambda: chats(after), 30)
        await until(hooks_listening, 30)  # its listener reconnected


PASSWORD_ROLE = "bastion_password_app"
PASSWORD = "only-with-this"


def password_only_conninfo(database: MigratedDatabase) -> str:
    """The application's role as a hosted database has it: a login that needs its password (here a
    member of `bastion_app`), whose conninfo carries the password; the server asks for it from now on."""
    cluster = database.cluster
    with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:
        if conn.execute("select 1 from pg_roles where rolname = %s", (PASSWORD_ROLE,)).fetchone() is None:
            conn.execute(f"create role {PASSWORD_ROLE} login password '{PASSWORD}' in role bastion_app")
            row = conn.execute("show hba_file").fetchone()
            assert row is not None
            hba = Path(row[0])
            rules = f"local all {PASSWORD_ROLE} scram-sha-256\nhost all {PASSWORD_ROLE} all scram-sha-256\n"
            hba.write_text(rules + hba.read_text())
            conn.execute("select pg_reload_conf()")
    conninfo = f"{cluster.dsn(database.name, user=PASSWORD_ROLE)} password={PASSWORD}"
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(cluster.dsn(database.name, user=PASSWORD_ROLE)).close()
    psycopg.connect(conninfo).close()
    return conninfo


def lock_held(database: MigratedDatabase, executor: str) -> bool:
    """Whether a session holds the executor's liveness lock (what other workers' janitors read as alive)."""
    with psycopg.connect(database.admin_dsn, autocommit=True) as conn:
        row = conn.execute(
            "select pg_try_advisory_lock(hashtextextended(%s, 0))", ("bastion.executor:" + executor,)
        ).fetchone()
    return not (row and row[0])  # taken here, it is released as this connection closes


async def test_the_engine_takes_its_liveness_lock_back_after_a_restart_with_a_password_login(
    restartable: MigratedDatabase,
) -> None:
    """The engine reconnects its lock with the connection string it was launched with: the broken
    connection's own omits the password, so with it a password login could never take the lock back,
    and other workers would take this live worker's turns for a dead one's."""
    conninfo = password_only_conninfo(restartable)
    async with await DurableEngine.launch(conninfo, recovery_interval=0.2) as engine:
        assert lock_held(restartable, engine.executor_id)
        restartable.cluster.stop(mode="immediate")
        restartable.cluster.start()
        await until(lambda: lock_held(restartable, engine.executor_id), 20)
