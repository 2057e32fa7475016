"""Durable runs in one process: the store's take-over rules (a durable run stays live while its
dead worker's turn waits to be taken over, is adopted only from a dead worker and only while it
still runs, and leaves its in-flight operations uncertain), the durable chat route's fast path and
its stop, retention, and the SQLite store's refusal."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import httpx2
import psycopg
import pytest

from bastion import define_agent
from bastion.chat.durable_turns import DurableTurnError, prune_finished_turns, turn_workflow_id
from bastion.chat.endpoint import ChatEndpoint, chat_routes
from bastion.durable import DURABLE_APPLICATION_VERSION, DurableEngine
from bastion.persistence import AgentRunInactiveError, RunInput, RunOutcome, ToolOperation
from bastion.stores import (
    ConversationBusyError,
    PostgresStore,
    SqliteStore,
    StoreIdentity,
    ToolOperationUncertainError,
    TurnContext,
)
from bastion.stores.postgres import PostgresAgentPersistence
from bastion.stores.turn_workflows import TurnWorkflowRow
from bastion.worker import create_agent_worker
from tests.conftest import MigratedDatabase
from tests.durable_cluster import until, user_message
from tests.live_server import served_here
from tests.scripted import ScriptedModel
from tests.test_chat_routes import Project
from tests.test_guide_entities import guide_example
from tests.test_live_turns import GatedModel


def message(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


async def claim(store: PostgresStore, who: StoreIdentity, conversation: str, **options: Any) -> Any:
    persistence = store.persistence(**options)
    context = TurnContext(identity=who, conversation_id=conversation, request_id=uuid.uuid4().hex)
    start = await persistence.start_run(context, RunInput(messages=[message("hi")], trigger="submit-message"))
    return persistence, context, start.state


def operation(
    key: str, ran: list[str], *, idempotent: bool = False, wait: asyncio.Event | None = None
) -> Any:
    async def send() -> str:
        ran.append(key)
        if wait is not None:
            await wait.wait()
        return "sent"

    return ToolOperation(
        name="send", tool_call_id="call_0", input={}, execute=send, key=key, idempotent=idempotent
    )


async def test_a_durable_run_of_a_dead_worker_waits_to_be_adopted_and_only_a_dead_workers_run_is(
    migrated_database: MigratedDatabase,
) -> None:
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    dead = await PostgresStore.open(migrated_database.app_dsn, max_size=2)
    live = await PostgresStore.open(migrated_database.app_dsn, max_size=2)
    other = await PostgresStore.open(migrated_database.app_dsn, max_size=2)
    try:
        conversation = (await live.create_conversation(who)).id
        persistence, context, state = await claim(dead, who, conversation)
        assert await persistence.mark_durable(context, state) is True
        ran: list[str] = []
        forever = asyncio.Event()
        running = [
            asyncio.ensure_future(persistence.execute_tool(context, state, operation(key, ran, wait=forever)))
            for key in ("op/send", "op/save")
        ]
        while len(ran) < 2:
            await asyncio.sleep(0.01)
        # While its worker lives, nobody else adopts the run.
        adopter = live.persistence()
        assert await adopter.adopt_run(context, state) is False
        await dead.close()  # the worker lock goes with the process
        for task in running:
            task.cancel()
        # Its worker is dead, yet a newer turn does not replace it: it waits to be taken over.
        with pytest.raises(ConversationBusyError) as busy:
            await claim(live, who, conversation)
        assert busy.value.retry_after > 0
        assert await adopter.adopt_run(context, state) is True
        # What the dead worker left in flight is uncertain: refused, unless the tool is idempotent.
        with pytest.raises(ToolOperationUncertainError):
            await adopter.execute_tool(context, state, operation("op/send", ran))
        assert (
            await adopter.execute_tool(context, state, operation("op/save", ran, idempotent=True)) == "sent"
        )
        assert ran == ["op/send", "op/save", "op/save"]
        # A live adopter keeps it; a settled run is adopted by nobody.
        assert await other.persistence().adopt_run(context, state) is False
        await adopter.finish_run(context, state, RunOutcome(status="completed"))
        await other.close()
        assert await adopter.adopt_run(context, state) is False
    finally:
        for store in (dead, live, other):
            await store.close()


async def test_a_durable_run_whose_every_worker_died_frees_its_conversation_when_its_lease_ends(
    migrated_database: MigratedDatabase,
) -> None:
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    dead = await PostgresStore.open(migrated_database.app_dsn, max_size=2)
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=2) as live:
        conversation = (await live.create_conversation(who)).id
        persistence, context, state = await claim(dead, who, conversation, lease_seconds=0.5)
        await persistence.mark_durable(context, state)
        await dead.close()
        for _ in range(200):
            try:
                await claim(live, who, conversation)
                break
            except ConversationBusyError:
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("The conversation never freed itself.")
        # Replaced: a take-over that comes now finds nothing to adopt.
        assert await live.persistence().adopt_run(context, state) is False
        events = [(e.type, e.run_id) for e in await live.list_events(who, conversation)]
        assert ("run.interrupted", state.run_id) in events


def workflow_row(executor_id: str) -> TurnWorkflowRow:
    return TurnWorkflowRow(
        executor_id=executor_id,
        application_version=DURABLE_APPLICATION_VERSION,
        application_name="bastion",
        input={"endpoint": "unused: nobody takes it over"},
    )


async def test_a_dead_workers_run_waits_while_its_workflow_waits_and_is_replaced_at_once_without_one(
    migrated_database: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    # No write marks these runs durable: the row of the run's turn workflow is what keeps it.
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    dead = await PostgresStore.open(migrated_database.app_dsn, max_size=2)
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=2) as live:
        waiting, without = (await live.create_conversation(who)).id, (await live.create_conversation(who)).id
        persistence, context, state = await claim(dead, who, waiting)
        await claim(dead, who, without)  # its process dies before its workflow exists
        executor = f"dead-{uuid.uuid4().hex[:8]}"
        assert await persistence.turn_workflows.begin(context, state, workflow_row(executor)) is True
        assert workflow(migrated_database, waiting, state.run_id) == ("PENDING", executor)
        await dead.close()  # the worker lock goes with the process
        await claim(live, who, without)
        with pytest.raises(ConversationBusyError):
            await claim(live, who, waiting)
        # Only the caller's own row ends (and only once).
        stranger = dataclasses.replace(context, identity=StoreIdentity(user_id=str(uuid.uuid4())))
        assert await live.persistence().turn_workflows.end(stranger, state, executor) is False
        assert await live.persistence().turn_workflows.end(context, state, executor) is True
        assert workflow(migrated_database, waiting, state.run_id) == ("SUCCESS", executor)
        assert await live.persistence().turn_workflows.end(context, state, executor) is False
        await claim(live, who, waiting)  # its workflow ended: nothing will take the run over
        assert await live.persistence().adopt_run(context, state) is False


async def test_a_turns_workflow_row_is_written_only_for_the_callers_running_run_of_this_process(
    migrated_database: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    async with (
        await PostgresStore.open(migrated_database.app_dsn, max_size=2) as store,
        await PostgresStore.open(migrated_database.app_dsn, max_size=2) as other,
    ):
        conversation = (await store.create_conversation(who)).id
        persistence, context, state = await claim(store, who, conversation)
        stranger = dataclasses.replace(context, identity=StoreIdentity(user_id=str(uuid.uuid4())))
        assert await persistence.turn_workflows.begin(stranger, state, workflow_row("x")) is False
        # Another process does not run this run.
        assert await other.persistence().turn_workflows.begin(context, state, workflow_row("x")) is False
        await persistence.finish_run(context, state, RunOutcome(status="completed"))
        # A settled run gets none either: a close that comes first leaves no row behind.
        assert await persistence.turn_workflows.begin(context, state, workflow_row("x")) is False
        assert workflow(migrated_database, conversation, state.run_id) is None

        # The close of a turn that names its workflow's executor ends the row in its transaction.
        persistence, context, state = await claim(store, who, conversation)
        executor = f"here-{uuid.uuid4().hex[:8]}"
        persistence.checkpoint(state).workflow_executor = executor
        assert await persistence.turn_workflows.begin(context, state, workflow_row(executor)) is True
        await persistence.finish_run(context, state, RunOutcome(status="completed"))
        assert state.checkpoints is not None and state.checkpoints.workflow_ended
        assert workflow(migrated_database, conversation, state.run_id) == ("SUCCESS", executor)


async def test_the_sqlite_store_refuses_durable_turns(
    sqlite_store: SqliteStore, durable_engine: DurableEngine
) -> None:
    agent = define_agent(name="durable", instructions="Answer.")
    with pytest.raises(DurableTurnError, match="Postgres store"):
        ChatEndpoint(
            agent=agent,
            store=sqlite_store,
            model=ScriptedModel(["hi"]),
            context=lambda t: t,
            durable=durable_engine,
        )


@contextlib.asynccontextmanager
async def serve(
    store: PostgresStore, model: Any, engine: DurableEngine, project: Project, **options: Any
) -> AsyncIterator[str]:
    agent = define_agent(name=f"durable-{uuid.uuid4().hex[:6]}", instructions="Answer.")
    routes = chat_routes(
        agent=agent, store=store, model=model, context=lambda t: t, durable=engine, **options
    )
    app = create_agent_worker(env=project.env, routes=routes)
    async with served_here(app) as url:
        yield url


def chunks_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def workflow(database: MigratedDatabase, conversation: str, run_id: str) -> tuple[str, str] | None:
    with psycopg.connect(database.admin_dsn) as conn:
        row = conn.execute(
            "select status, executor_id from dbos.workflow_status where workflow_uuid = %s",
            (turn_workflow_id(conversation, run_id),),
        ).fetchone()
    return (row[0], row[1]) if row else None


async def finished(database: MigratedDatabase, conversation: str, run_id: str) -> tuple[str, str] | None:
    """The workflow's status once it ended (it records its end just after the response's last byte)."""
    for _ in range(200):
        found = workflow(database, conversation, run_id)
        if found is not None and found[0] != "PENDING":
            return found
        await asyncio.sleep(0.02)
    return workflow(database, conversation, run_id)


def stored_steps(database: MigratedDatabase, run_id: str) -> list[int]:
    """The steps of the run's stored model requests."""
    with psycopg.connect(database.admin_dsn) as conn:
        rows = conn.execute(
            "select step from bastion.run_steps where run_id = %s order by step", (run_id,)
        ).fetchall()
    return [row[0] for row in rows]


def runs(database: MigratedDatabase, conversation: str) -> Sequence[tuple[str, str, bool]]:
    with psycopg.connect(database.admin_dsn) as conn:
        return conn.execute(
            "select id::text, status, durable from bastion.runs where conversation_id = %s "
            "order by started_at",
            (conversation,),
        ).fetchall()


async def test_a_durable_turn_streams_in_its_workflow_can_be_stopped_and_is_pruned_when_old(
    migrated_database: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    project = Project()
    user = str(uuid.uuid4())
    headers = project.headers(user)
    conversation = str(uuid.uuid4())
    gated = GatedModel(["Part", "ial"], [" never."])
    model = ScriptedModel(["Hello", " there."], ["Again."])
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=4) as store:
        async with (
            serve(store, model, durable_engine, project) as url,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            body = {"id": conversation, "messages": [user_message("hi")], "trigger": "submit-message"}
            response = await http.post(f"{url}/api/chat", json=body, headers=headers)
            assert response.status_code == 200
            chunks = chunks_of(response.text)
            assert [c["type"] for c in chunks][-1] == "finish"
            assert "".join(c.get("delta", "") for c in chunks) == "Hello there."
            # (A turn this quick may end before its stream log marks the run durable: nothing needs it.)
            [(run_id, status, _)] = runs(migrated_database, conversation)
            assert status == "completed"
            # The response message's id derives from the run: a take-over streams the same one.
            assert (
                chunks[0]["messageId"]
                == uuid.uuid5(uuid.UUID("0f3c2d9a-41b7-4e0c-8a5e-6b1d7c2e9f48"), run_id).hex
            )
            assert await finished(migrated_database, conversation, run_id) == (
                "SUCCESS",
                durable_engine.executor_id,
            )
        async with (
            serve(store, gated, durable_engine, project) as url,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            stopped_conversation = str(uuid.uuid4())
            body = {
                "id": stopped_conversation,
                "messages": [user_message("hi")],
                "trigger": "submit-message",
            }
            posted = asyncio.ensure_future(http.post(f"{url}/api/chat", json=body, headers=headers))
            await gated.waiting.wait()
            # It streams once its workflow exists; no write marks its run durable (the workflow does).
            [(running_run, status, durable)] = runs(migrated_database, stopped_conversation)
            assert (status, durable) == ("running", False)
            assert workflow(migrated_database, stopped_conversation, running_run) == (
                "PENDING",
                durable_engine.executor_id,
            )
            stop = await http.post(f"{url}/api/chat/{stopped_conversation}/stop", headers=headers)
            assert stop.status_code == 200 and stop.json()["settled"] is True
            response = await posted
            assert [c["type"] for c in chunks_of(response.text)][-2:] == ["abort", "finish"]
            [(stopped_run, status, _)] = runs(migrated_database, stopped_conversation)
            assert status == "cancelled"
            assert await finished(migrated_database, stopped_conversation, stopped_run) == (
                "SUCCESS",
                durable_engine.executor_id,
            )
        with psycopg.connect(migrated_database.admin_dsn) as conn:
            kept = conn.execute(
                "select count(*), count(*) filter (where reset) from bastion.run_chunks where run_id = %s",
                (run_id,),
            ).fetchone()
        # A first execution has no earlier attempt to supersede: its log holds no reset.
        assert kept and kept[0] > 0 and kept[1] == 0
        # Its model request was stored (keyed by run and step), and is pruned with its log.
        assert stored_steps(migrated_database, run_id) == [0]
        assert (await prune_finished_turns(store, older_than=timedelta(days=1)))[0] == 0
        deleted, rows = await prune_finished_turns(store, older_than=timedelta(0))
        assert deleted >= 2 and rows >= 2
        assert workflow(migrated_database, conversation, run_id) is None
        with psycopg.connect(migrated_database.admin_dsn) as conn:
            left = conn.execute(
                "select count(*) from bastion.run_chunks where run_id = %s", (run_id,)
            ).fetchone()
        assert left == (0,)
        assert stored_steps(migrated_database, run_id) == []


async def test_the_guides_durable_example_builds_durable_chat_routes(
    migrated_database: MigratedDatabase,
) -> None:
    durable_chat = guide_example("durable_chat", page="durable.md")["durable_chat"]
    agent = define_agent(name="readme-durable", instructions="Answer.")
    routes, engine, store = await durable_chat(migrated_database.app_dsn, agent, ScriptedModel(["hi"]), None)
    try:
        assert ("POST", "/api/chat") in [(route.method, route.path) for route in routes]
        assert isinstance(engine, DurableEngine) and engine.executor_id
    finally:
        await engine.close()
        await store.close()


async def test_a_durable_turns_checkpoints_ride_its_writes_and_a_zombie_cannot_write_over_its_successor(
    migrated_database: MigratedDatabase,
) -> None:
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    zombie = await PostgresStore.open(migrated_database.app_dsn, max_size=2)
    successor = await PostgresStore.open(migrated_database.app_dsn, max_size=2)
    try:
        conversation = (await successor.create_conversation(who)).id
        persistence, context, state = await claim(zombie, who, conversation)
        await persistence.mark_durable(context, state)
        checkpoints = persistence.checkpoint(state)
        # A finished request's record is stored by the run's next write: here, its tool's claim.
        checkpoints.add(0, {"response": [], "chunks": [{"type": "text-delta", "id": "0-0", "delta": "a"}]})
        ran: list[str] = []
        assert await persistence.execute_tool(context, state, operation("op/first", ran)) == "sent"
        assert checkpoints.pending == {}
        # ... or a stream log batch, which also stores the tool results the next request sees.
        log_writes = zombie.live_turns().log(who, state.run_id, on_stop=lambda: None, checkpoints=checkpoints)
        checkpoints.add(1, {"response": [], "chunks": []})
        log_writes.add({"type": "text-delta", "id": "1-0", "delta": "b"})
        await log_writes.close()
        assert checkpoints.pending == {}
        # Its worker lock is lost (and not taken again while the run is adopted): to the others it is
        # dead, though it runs on.
        await zombie.leases.close()
        assert zombie._liveness is not None
        await zombie._liveness.close()
        stored = await successor.persistence().adopt_turn(context, state)
        assert stored is not None and [record["step"] for record in stored] == [0, 1]
        assert stored[0]["chunks"] == [{"type": "text-delta", "id": "0-0", "delta": "a"}]
        with psycopg.connect(migrated_database.admin_dsn) as conn:
            recorded = conn.execute(
                "select status, output from bastion.tool_executions where run_id = %s", (state.run_id,)
            ).fetchall()
        assert recorded == [("completed", "sent")]
        # The zombie lives on, but every write of its run is refused: no claim, no checkpoint, no
        # close, and its log stores nothing and tells it to stop.
        checkpoints.add(2, {"response": [], "chunks": []})
        with pytest.raises(AgentRunInactiveError):
            await persistence.execute_tool(context, state, operation("op/second", ran))
        stopped: list[bool] = []
        log_writes = zombie.live_turns().log(
            who, state.run_id, on_stop=lambda: stopped.append(True), checkpoints=checkpoints
        )
        log_writes.add({"type": "text-delta", "id": "2-0", "delta": "zombie"})
        await log_writes.close()
        assert stopped == [True]
        with pytest.raises(AgentRunInactiveError):
            await persistence.finish_run(context, state, RunOutcome(status="completed"))
        assert ran == ["op/first"]
        with psycopg.connect(migrated_database.admin_dsn) as conn:
            steps = conn.execute(
                "select step from bastion.run_steps where run_id = %s order by step", (state.run_id,)
            ).fetchall()
            logged = conn.execute(
                "select count(*) from bastion.run_chunks where run_id = %s and chunks::text like %s",
                (state.run_id, "%zombie%"),
            ).fetchone()
            status = conn.execute("select status from bastion.runs where id = %s", (state.run_id,)).fetchone()
        assert steps == [(0,), (1,)] and logged == (0,) and status == ("running",)
    finally:
        for store in (zombie, successor):
            await store.close()


async def test_a_durable_turns_model_request_no_tool_claim_stores_is_stored_when_the_next_one_starts(
    migrated_database: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    # The first request calls a tool the agent lacks, so pydantic-ai asks again with no tool claim
    # between (and no tool result for a step boundary to store): the second request's start stores
    # the first, so a process dying during the second does not have the first asked again.
    project = Project()
    conversation = str(uuid.uuid4())
    gated = GatedModel(["Still"], [" here."], tool_call="missing_tool")
    async with (
        await PostgresStore.open(migrated_database.app_dsn, max_size=4) as store,
        serve(store, gated, durable_engine, project) as url,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        body = {"id": conversation, "messages": [user_message("hi")], "trigger": "submit-message"}
        headers = project.headers(str(uuid.uuid4()))
        posted = asyncio.ensure_future(http.post(f"{url}/api/chat", json=body, headers=headers))
        try:
            await gated.waiting.wait()
            [(run_id, _, _)] = runs(migrated_database, conversation)
            stored = await until(lambda: stored_steps(migrated_database, run_id), 5)
        finally:
            gated.gate.set()
        assert stored == [0]
        response = await posted
        assert response.status_code == 200 and chunks_of(response.text)[-1]["type"] == "finish"
        # The last request rode the turn's close.
        assert stored_steps(migrated_database, run_id) == [0, 1]


class SaveRefused(PostgresAgentPersistence):
    """Postgres fails the turn's save (its completed outcome) once; settling it as failed works."""

    async def finish_run(self, context: TurnContext, state: Any, outcome: RunOutcome) -> None:
        if outcome.status == "completed":
            raise psycopg.OperationalError("the server closed the connection")
        await super().finish_run(context, state, outcome)


async def test_a_durable_turn_whose_save_the_database_fails_still_ends_its_workflow(
    migrated_database: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    project = Project()
    conversation = str(uuid.uuid4())
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=4) as store:
        async with (
            serve(
                store, ScriptedModel(["Hello."]), durable_engine, project, persistence=SaveRefused(store)
            ) as url,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            body = {"id": conversation, "messages": [user_message("hi")], "trigger": "submit-message"}
            response = await http.post(
                f"{url}/api/chat", json=body, headers=project.headers(str(uuid.uuid4()))
            )
        assert [c["type"] for c in chunks_of(response.text)][-2:] == ["error", "finish"]
        [(run_id, status, _)] = runs(migrated_database, conversation)
        assert status == "failed"
        # Its workflow (whose input holds the conversation) ends, so retention prunes it.
        assert await finished(migrated_database, conversation, run_id) == (
            "SUCCESS",
            durable_engine.executor_id,
        )


async def test_a_durable_turns_workflow_ends_after_its_after_turn_and_when_it_fails_before_streaming(
    migrated_database: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    """The close ends a turn's workflow row, unless the routes have an `after_turn`: then the row ends
    after it ran, so a worker dying between the save and `after_turn` leaves the workflow for a take-over
    that runs it. A turn that fails before it streams ends its row too: none stays pending while its
    worker lives."""
    project = Project()
    headers = project.headers(str(uuid.uuid4()))
    seen: list[tuple[str, str] | None] = []

    async def after_turn(turn: Any, messages: Any, context: Any) -> None:
        seen.append(workflow(migrated_database, turn.conversation_id, turn.run_id))

    async def broken_context(turn: Any) -> Any:
        # It fails once the turn's workflow row exists (the row is written while the turn is prepared).
        await until(lambda: workflow(migrated_database, turn.conversation_id, turn.run_id) is not None, 10)
        raise RuntimeError("the application's context failed")

    async with await PostgresStore.open(migrated_database.app_dsn, max_size=4) as store:
        async with (
            serve(store, ScriptedModel(["Hello."]), durable_engine, project, after_turn=after_turn) as url,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            conversation = str(uuid.uuid4())
            body = {"id": conversation, "messages": [user_message("hi")], "trigger": "submit-message"}
            response = await http.post(f"{url}/api/chat", json=body, headers=headers)
            assert response.status_code == 200
            [(run_id, status, _)] = runs(migrated_database, conversation)
            assert status == "completed"
            assert seen == [("PENDING", durable_engine.executor_id)]
            assert await finished(migrated_database, conversation, run_id) == (
                "SUCCESS",
                durable_engine.executor_id,
            )

        agent = define_agent(name=f"broken-{uuid.uuid4().hex[:6]}", instructions="Answer.")
        routes = chat_routes(
            agent=agent,
            store=store,
            model=ScriptedModel(["x"]),
            context=broken_context,
            durable=durable_engine,
            after_turn=after_turn,  # so that the close does not end the row
        )
        async with (
            served_here(create_agent_worker(env=project.env, routes=routes)) as url,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            conversation = str(uuid.uuid4())
            body = {"id": conversation, "messages": [user_message("hi")], "trigger": "submit-message"}
            response = await http.post(f"{url}/api/chat", json=body, headers=headers)
            assert response.status_code >= 400
            [(run_id, status, _)] = runs(migrated_database, conversation)
            assert status == "failed"
            assert workflow(migrated_database, conversation, run_id) == (
                "SUCCESS",
                durable_engine.executor_id,
            )
            assert len(seen) == 1  # no after_turn for a failed turn
