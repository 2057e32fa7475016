"""Durable turns across real worker processes: a worker killed with SIGKILL at any point of a turn,
and another worker finishes the turn from its last completed model request.

Each worker is `tests.durable_chat_worker` (uvicorn, DBOS, a Postgres store) on the test database.
The scripted model and the tool record every request and every side effect outside the turn's
transaction, so the tests count what ran twice.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from bastion import assemble_ui_messages
from tests.conftest import MigratedDatabase
from tests.durable_chat_worker import step_text
from tests.durable_cluster import Cluster, Worker, cluster_of, post_turn, resumed_stream, until, user_message

# Where a turn is when its worker is killed: the effect it waits for, then how many model deltas more.
KILL_POINTS = {
    "model": ("model:turn:0", 0),  # the model was asked and has not answered yet
    "stream": ("model:turn:0", 5),  # mid-stream of the first request
    "tool": ("tool:start", 1),  # the tool is running
    "second-stream": ("model:turn:1", 5),  # mid-stream of the request after the tool
}


def text_of(message: dict[str, Any]) -> str:
    return "".join(part["text"] for part in message["parts"] if part["type"] == "text")


def tool_part(message: dict[str, Any]) -> dict[str, Any]:
    [part] = [part for part in message["parts"] if part["type"].startswith("tool-")]
    return part


async def kill_at(cluster: Cluster, worker: Worker, conversation: str, point: str) -> float:
    """Wait until the turn reached `point`, then SIGKILL its worker; the moment it died."""
    kind, deltas = KILL_POINTS[point]
    await until(lambda: cluster.count(conversation, kind) > 0)
    await asyncio.sleep(cluster.delay * deltas)
    return await cluster.kill(worker)


async def taken_over(cluster: Cluster, conversation: str, by: Worker, killed_at: float) -> float:
    """Seconds from the kill until `by` adopted the run."""
    await until(
        lambda: (run := cluster.run(conversation)) is not None and run[2] == by.worker_key, timeout=30
    )
    return time.monotonic() - killed_at


async def settled(cluster: Cluster, conversation: str) -> str:
    return str(await until(lambda: (run := cluster.run(conversation)) and run[1] != "running" and run[1], 60))


async def check_turn(
    cluster: Cluster,
    conversation: str,
    resumed: list[dict[str, Any]] | None,
    *,
    tool_ran: bool,
    kind: str = "turn",
) -> dict[str, Any]:
    """One complete assistant message, equal to what the resumed stream assembles to."""
    assert await settled(cluster, conversation) == "completed"
    stored = cluster.messages(conversation)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    reply = stored[1]
    # The text of each model request's last attempt, nothing of the attempts a kill cut short.
    asked = [cluster.count(conversation, f"model:{kind}:{step}") for step in (0, 1)]
    assert text_of(reply) == step_text(0, asked[0] - 1) + step_text(1, asked[1] - 1)
    part = tool_part(reply)
    if tool_ran:
        assert (part["state"], part["output"]) == ("output-available", {"done": conversation})
    else:
        # Killed while the tool ran: its outcome is unknown, so it fails closed and never runs again.
        assert part["state"] == "output-error"
    assert cluster.count(conversation, f"{'tool' if kind == 'turn' else 'approved'}:start") == 1
    if resumed is not None:
        assert assemble_ui_messages(resumed, stored[:1])[-1] == reply
    return reply


async def next_turn(cluster: Cluster, worker: Worker, user: str, conversation: str) -> None:
    history = cluster.messages(conversation)
    posted = await post_turn(
        cluster, worker, user, conversation, [*history, user_message(f"next {conversation}")]
    )
    status, chunks = await posted
    assert status == 200 and chunks[-1]["type"] == "finish"
    assert [m["role"] for m in cluster.messages(conversation)] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("point", list(KILL_POINTS))
async def test_a_turn_whose_worker_is_killed_is_finished_by_another_from_its_last_completed_step(
    migrated_database: MigratedDatabase, point: str
) -> None:
    async with cluster_of(migrated_database) as cluster:
        first, second = await asyncio.gather(cluster.start("first"), cluster.start("second"))
        user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
        posted = await post_turn(cluster, first, user, conversation, [user_message(f"turn {conversation}")])
        killed_at = await kill_at(cluster, first, conversation, point)
        resuming = asyncio.ensure_future(resumed_stream(cluster, second, user, conversation))
        seconds = await taken_over(cluster, conversation, second, killed_at)
        print(f"take-over after a kill at {point}: {seconds:.2f} s")
        await posted  # the client's stream broke with its worker
        reply = await check_turn(cluster, conversation, await resuming, tool_ran=point != "tool")
        # A completed model request is never asked again; the interrupted one is asked once more.
        first_request, second_request = {
            "model": (2, 1), "stream": (2, 1), "tool": (1, 1), "second-stream": (1, 2),
        }[point]  # fmt: skip
        assert cluster.count(conversation, "model:turn:0") == first_request
        assert cluster.count(conversation, "model:turn:1") == second_request
        assert cluster.count(conversation, "tool:done") == (0 if point == "tool" else 1)
        assert reply["id"]
        await next_turn(cluster, second, user, conversation)
