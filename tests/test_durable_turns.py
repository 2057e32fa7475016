"""Durable turns across real worker processes: a worker killed with SIGKILL at any point of a turn,
and another worker finishes the turn from its last completed model request.

Each worker is `tests.durable_chat_worker` (uvicorn, DBOS, a Postgres store) on the test database;
the module shares one cluster, and a killed worker is started again (a new process) when a test
needs it. The scripted model and the tools record every request and every side effect outside the
turn's transaction, so the tests count what ran twice.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from bastion import assemble_ui_messages
from tests.conftest import MigratedDatabase
from tests.durable_chat_worker import step_text
from tests.durable_cluster import Cluster, Worker, cluster_of, post_turn, resumed_stream, until, user_message

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Where a turn is when its worker is killed: the effect it waits for, then how many model deltas more.
KILL_POINTS = {
    "model": ("model:turn:0", 0),  # the model was asked and has not answered yet
    "stream": ("model:turn:0", 5),  # mid-stream of the first request
    "tool": ("tool:start", 1),  # the tool is running
    "second-stream": ("model:turn:1", 5),  # mid-stream of the request after the tool
}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(migrated_database: MigratedDatabase) -> AsyncIterator[Cluster]:
    async with cluster_of(migrated_database) as cluster:
        await asyncio.gather(cluster.worker("first"), cluster.worker("second"))
        yield cluster


def text_of(message: dict[str, Any]) -> str:
    return "".join(part["text"] for part in message["parts"] if part["type"] == "text")


def tool_part(message: dict[str, Any]) -> dict[str, Any]:
    [part] = [part for part in message["parts"] if part["type"].startswith("tool-")]
    return part


async def kill_at(cluster: Cluster, worker: Worker, conversation: str, kind: str, deltas: int) -> float:
    """Wait until the turn recorded `kind` and streamed `deltas` more, then SIGKILL its worker."""
    await until(lambda: cluster.count(conversation, kind) > 0)
    await asyncio.sleep(cluster.delay * deltas)
    return await cluster.kill(worker)


async def taken_over(cluster: Cluster, conversation: str, dead: Worker, killed_at: float) -> float:
    """Seconds from the kill until a live worker adopted the run of the `dead` one."""

    def adopted() -> bool:
        run = cluster.run(conversation)
        live = {worker.worker_key for worker in cluster.workers if worker.alive and worker is not dead}
        return run is not None and run[2] in live

    try:
        await until(adopted, 30)
    except AssertionError:
        run = cluster.run(conversation)
        state = run and cluster.workflow(conversation, run[0])
        raise AssertionError(f"The turn was not taken over: run {run}, workflow {state}.") from None
    return time.monotonic() - killed_at


async def settled(cluster: Cluster, conversation: str) -> str:
    try:
        return str(
            await until(lambda: (run := cluster.run(conversation)) and run[1] != "running" and run[1], 60)
        )
    except AssertionError:
        run = cluster.run(conversation)
        state = run and cluster.workflow(conversation, run[0])
        raise AssertionError(f"The turn never settled: run {run}, workflow {state}.") from None


async def check_turn(
    cluster: Cluster,
    conversation: str,
    resumed: list[dict[str, Any]] | None,
    *,
    tool_ran: bool,
    kind: str = "turn",
    history: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One complete assistant message, equal to what the resumed stream and the log assemble to."""
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
    effect = "tool" if kind == "turn" else "approved"
    assert cluster.count(conversation, f"{effect}:start") == 1
    history = history if history is not None else stored[:1]
    if resumed is not None:
        assert assemble_ui_messages(resumed, history)[-1] == reply
    run = cluster.run(conversation)
    assert run is not None
    assert assemble_ui_messages(cluster.logged_stream(run[0]), history)[-1] == reply
    return reply


async def next_turn(cluster: Cluster, worker: Worker, user: str, conversation: str) -> None:
    """The conversation takes its next turn (waiting, as `Retry-After` says, while a turn runs)."""
    deadline = time.monotonic() + 30
    while True:
        history = cluster.messages(conversation)
        messages = [*history, user_message(f"next {conversation}")]
        status, chunks = await (await post_turn(cluster, worker, user, conversation, messages))
        if status != 409 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert status == 200 and chunks[-1]["type"] == "finish"
    assert [m["role"] for m in cluster.messages(conversation)][-2:] == ["user", "assistant"]


@pytest.mark.parametrize("point", list(KILL_POINTS))
async def test_a_turn_whose_worker_is_killed_is_finished_by_another_from_its_last_completed_step(
    cluster: Cluster, point: str
) -> None:
    first, second = await cluster.worker("first"), await cluster.worker("second")
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    posted = await post_turn(cluster, first, user, conversation, [user_message(f"turn {conversation}")])
    killed_at = await kill_at(cluster, first, conversation, *KILL_POINTS[point])
    cluster.restart_soon("first")
    resuming = asyncio.ensure_future(resumed_stream(cluster, second, user, conversation))
    seconds = await taken_over(cluster, conversation, first, killed_at)
    print(f"take-over after a kill at {point}: {seconds:.2f} s")
    await posted  # the client's stream broke with its worker
    await check_turn(cluster, conversation, await resuming, tool_ran=point != "tool")
    # A completed model request is never asked again; the interrupted one is asked once more.
    asked = {"model": (2, 1), "stream": (2, 1), "tool": (1, 1), "second-stream": (1, 2)}[point]
    assert (cluster.count(conversation, "model:turn:0"), cluster.count(conversation, "model:turn:1")) == asked
    assert cluster.count(conversation, "tool:done") == (0 if point == "tool" else 1)
    await next_turn(cluster, second, user, conversation)


@pytest.mark.parametrize("point", ["before-save", "after-save"])
async def test_a_turn_whose_worker_dies_while_saving_is_saved_once(cluster: Cluster, point: str) -> None:
    dying, second = await cluster.worker(point, die=point), await cluster.worker("second")
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    posted = await post_turn(cluster, dying, user, conversation, [user_message(f"turn {conversation}")])
    await dying.process.wait()  # it killed itself at the save
    await posted
    run = cluster.run(conversation)
    assert run is not None
    if point == "before-save":
        await taken_over(cluster, conversation, dying, time.monotonic())
    await check_turn(cluster, conversation, None, tool_ran=True)
    # Nothing before the last request was asked or run again: the new worker replayed it from its steps
    # and claims. The last request is stored by the save itself (no write of its own before it), so a
    # worker dying before its save leaves it to be asked once more; after the save, nothing is.
    assert (cluster.count(conversation, "model:turn:0"), cluster.count(conversation, "model:turn:1")) == (
        1,
        2 if point == "before-save" else 1,
    )
    assert cluster.count(conversation, "tool:done") == 1
    # Before the save, the workflow ends on the live worker that took the turn over. The save itself
    # ends it (these routes have no after_turn to run after it), so after the save nothing is taken over.
    live = {worker.executor for worker in cluster.workers if worker.alive}
    await until(lambda: (found := cluster.workflow(conversation, run[0])) and found[0] == "SUCCESS", 30)
    ended_by = live if point == "before-save" else {dying.executor}
    assert cluster.workflow(conversation, run[0]) in {("SUCCESS", executor) for executor in ended_by}
    await next_turn(cluster, second, user, conversation)


async def test_an_approval_paused_turn_survives_a_restart_and_its_continuation_is_durable(
    cluster: Cluster,
) -> None:
    first = await cluster.worker("first")
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    posted = await post_turn(cluster, first, user, conversation, [user_message(f"approve {conversation}")])
    status, chunks = await posted
    assert status == 200 and "tool-approval-request" in [c["type"] for c in chunks]
    assert await settled(cluster, conversation) == "waiting_for_approval"
    await cluster.kill(first)  # a restart (or a deploy) while the user decides
    first, second = await cluster.worker("first"), await cluster.worker("second")
    answered = cluster.messages(conversation)
    pending = tool_part(answered[1])
    assert pending["state"] == "approval-requested"
    pending["state"] = "approval-responded"
    pending["approval"]["approved"] = True
    posted = await post_turn(cluster, first, user, conversation, answered)
    killed_at = await kill_at(cluster, first, conversation, "model:approve:1", 4)
    cluster.restart_soon("first")
    resuming = asyncio.ensure_future(resumed_stream(cluster, second, user, conversation))
    await taken_over(cluster, conversation, first, killed_at)
    await posted
    reply = await check_turn(
        cluster, conversation, await resuming, tool_ran=True, kind="approve", history=answered
    )
    assert reply["id"] == answered[1]["id"]
    assert cluster.count(conversation, "approved:done") == 1
    assert (
        cluster.count(conversation, "model:approve:0"),
        cluster.count(conversation, "model:approve:1"),
    ) == (1, 2)
    await next_turn(cluster, second, user, conversation)


async def chaos(cluster: Cluster, kills: int, seed: int) -> None:
    """`kills` SIGKILLs at random points of turns in flight on two workers, each killed worker started
    again. Afterwards every turn whose client saw it start is finished (none lost), no side effect ran
    twice, every stored reply equals its logged stream, and every conversation takes its next turn
    (one whose request died before its turn started included: nothing holds it)."""
    print(f"chaos seed {seed}")  # shown with a failure, to replay it
    rng = random.Random(seed)
    user = str(uuid.uuid4())
    turn_seconds = cluster.delay * 22  # two requests of 2 + 6 delays, and a tool of 6
    posted: dict[str, asyncio.Task[tuple[int, list[dict[str, Any]]]]] = {}
    for round_ in range(kills):
        target = await cluster.worker(("first", "second")[round_ % 2])
        for conversation in (str(uuid.uuid4()) for _ in range(2)):
            message = user_message(f"turn {conversation}")
            posted[conversation] = await post_turn(cluster, target, user, conversation, [message])
        await asyncio.sleep(rng.uniform(0, turn_seconds))
        await cluster.kill(target)
        cluster.restart_soon(target.name)
    survivor = await cluster.worker("first")
    started = 0
    for conversation, task in posted.items():
        _, chunks = await task
        if not chunks:
            continue  # its request died before the turn started: the client saw it fail
        started += 1
        assert await settled(cluster, conversation) == "completed", "a turn was lost"
        stored = cluster.messages(conversation)
        assert [m["role"] for m in stored] == ["user", "assistant"]
        reply = stored[1]
        asked = [cluster.count(conversation, f"model:turn:{step}") for step in (0, 1)]
        assert text_of(reply) == step_text(0, asked[0] - 1) + step_text(1, asked[1] - 1)
        # At most once: a kill between the claim and the side effect leaves it uncertain, never rerun.
        assert cluster.count(conversation, "tool:start") <= 1, "a side effect ran twice"
        if tool_part(reply)["state"] == "output-available":
            assert cluster.count(conversation, "tool:start") == cluster.count(conversation, "tool:done") == 1
        run = cluster.run(conversation)
        assert run is not None
        assert assemble_ui_messages(cluster.logged_stream(run[0]), stored[:1])[-1] == reply
    print(f"chaos: {kills} kills, {started} of {len(posted)} turns started, all finished")
    assert started >= kills  # most turns started before their kill
    await asyncio.gather(*(next_turn(cluster, survivor, user, c) for c in posted))


async def test_turns_survive_kills_at_random_points(cluster: Cluster) -> None:
    await chaos(cluster, kills=3, seed=11)


@pytest.mark.chaos
@pytest.mark.timeout(1800)
async def test_turns_survive_many_kills_at_random_points(cluster: Cluster) -> None:
    await chaos(cluster, kills=int(os.environ.get("BASTION_CHAOS_KILLS", "24")), seed=int(time.time()))
