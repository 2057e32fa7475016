"""A worker told to stop (SIGTERM) drains: no new turn, its running turns finish up to a deadline, and
what is still running then is taken over by another worker, never cut short or lost.

Real worker processes (`tests.durable_chat_worker`: uvicorn through `bastion.draining_server`, DBOS,
a Postgres store) on the test database. The scripted model streams slowly enough (about six seconds
a turn) for a request to reach the stopping worker while its turn runs.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator

import httpx2
import pytest
import pytest_asyncio

from tests.conftest import MigratedDatabase
from tests.durable_cluster import Cluster, Worker, cluster_of, post_turn, resumed_stream, until, user_message
from tests.test_durable_turns import check_turn

pytestmark = pytest.mark.asyncio(loop_scope="module")

DELAY = 0.3  # seconds per streamed delta: a turn takes about 22 of them


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(migrated_database: MigratedDatabase) -> AsyncIterator[Cluster]:
    async with cluster_of(migrated_database, delay=DELAY) as cluster:
        await cluster.worker("staying")
        yield cluster


async def readiness(worker: Worker) -> tuple[int, dict[str, str]]:
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.get(f"{worker.url}/ready")
        return response.status_code, response.json()


async def test_a_stopping_worker_finishes_its_turn_refuses_new_ones_then_exits(cluster: Cluster) -> None:
    stopping = await cluster.start("stopping", extra_env={"BASTION_TEST_DRAIN_SECONDS": "45"})
    assert await readiness(stopping) == (200, {"status": "ready"})
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    posted = await post_turn(cluster, stopping, user, conversation, [user_message(f"turn {conversation}")])
    await until(lambda: cluster.count(conversation, "model:turn:0") > 0)

    stopping.process.send_signal(signal.SIGTERM)
    ready, said = await until_drained(stopping)
    assert (ready, said["code"]) == (503, "draining")
    # A new turn, on a new conversation and on the running one, is refused, and nothing is stored.
    refused = str(uuid.uuid4())
    async with httpx2.AsyncClient(timeout=10) as http:
        for target in (refused, conversation):
            body = {"id": target, "messages": [user_message(f"turn {target}")], "trigger": "submit-message"}
            response = await http.post(f"{stopping.url}/api/chat", json=body, headers=cluster.headers(user))
            assert response.status_code == 503, response.text
            assert response.json()["code"] == "draining"
            assert response.headers["Retry-After"] == "1"
    assert stopping.alive, "the worker stopped before its turn ended"
    assert cluster.messages(refused) == [] and cluster.run(refused) is None

    # The running turn streams to its end from the stopping worker, which exits after it.
    status, chunks = await posted
    assert status == 200 and chunks[-1]["type"] == "finish"
    await asyncio.wait_for(stopping.process.wait(), 30)
    assert stopping.process.returncode == 0
    await check_turn(cluster, conversation, chunks, tool_ran=True)
    assert [cluster.count(conversation, f"model:turn:{step}") for step in (0, 1)] == [1, 1]
    assert {executor for _, executor in cluster.effects(conversation)} == {stopping.executor}
    run = cluster.run(conversation)
    assert run is not None and cluster.workflow(conversation, run[0]) == ("SUCCESS", stopping.executor)


async def test_a_turn_still_running_at_the_deadline_is_finished_by_another_worker(cluster: Cluster) -> None:
    staying = await cluster.worker("staying")
    stopping = await cluster.start("leaving", extra_env={"BASTION_TEST_DRAIN_SECONDS": "0.5"})
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    posted = await post_turn(cluster, stopping, user, conversation, [user_message(f"turn {conversation}")])
    await until(lambda: cluster.count(conversation, "model:turn:0") > 0)
    await asyncio.sleep(DELAY * 3)  # mid-stream of the first model request, well before its tool

    stopped_at = time.monotonic()
    stopping.process.send_signal(signal.SIGTERM)
    await asyncio.wait_for(stopping.process.wait(), 30)
    print(f"the stopping worker left after {time.monotonic() - stopped_at:.2f} s")
    assert stopping.process.returncode == 0
    await posted  # its client's stream broke with the worker; the client resumes it elsewhere

    resumed = await resumed_stream(cluster, staying, user, conversation)
    await check_turn(cluster, conversation, resumed, tool_ran=True)
    # The interrupted request was asked again by the worker that stayed; the tool ran once, there.
    assert [cluster.count(conversation, f"model:turn:{step}") for step in (0, 1)] == [2, 1]
    assert cluster.count(conversation, "tool:done") == 1
    run = cluster.run(conversation)
    assert run is not None and run[2] == staying.worker_key
    assert cluster.workflow(conversation, run[0]) == ("SUCCESS", staying.executor)
    assert ("tool:start", staying.executor) in cluster.effects(conversation)


async def until_drained(worker: Worker) -> tuple[int, dict[str, str]]:
    """`GET /ready` once the worker has taken its SIGTERM (handled on its loop, a moment later)."""

    async def answered() -> tuple[int, dict[str, str]]:
        while (found := await readiness(worker))[0] == 200:
            await asyncio.sleep(0.02)
        return found

    return await asyncio.wait_for(answered(), 10)
