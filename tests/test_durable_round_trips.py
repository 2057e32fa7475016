"""Round trips per durable turn against the same turn without durability: counted, not timed.

The store's connections go through a counting proxy (`tests.pg.RoundTripCounter`). DBOS talks to
Postgres from threads of its own and polls its queues all the time, so its round trips are counted
at its SQLAlchemy engine and only those of this test's turns' workflows are kept: every statement
whose parameters name one of their workflow ids, with its transaction's BEGIN and COMMIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import sqlalchemy as sa
from dbos._dbos import _get_dbos_instance
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo

from bastion import AgentTools, define_agent, tool
from bastion.chat import chat_routes
from bastion.chat.durable_turns import WORKFLOW_NAME
from bastion.durable import DurableEngine
from bastion.stores import PostgresStore
from bastion.stores.postgres_live import PostgresLiveTurns
from bastion.worker import create_agent_worker
from tests.conftest import MigratedDatabase
from tests.durable_cluster import user_message
from tests.live_server import served_here
from tests.pg import RoundTripCounter
from tests.scripted import Call, ScriptedModel
from tests.test_chat_routes import Project

TURNS = 4


def lookup_tools(turn: Any) -> AgentTools:
    @tool
    async def lookup(key: str) -> str:
        """Looks a key up."""
        return f"value of {key}"

    return AgentTools(tools=[lookup])


class WorkflowTrips:
    """The round trips DBOS's engine makes for the workflows of this test's turns: statements naming
    one of `conversations` in a turn's workflow id, and the BEGIN and COMMIT of the transactions they
    ran in (none in autocommit). Other tests' workflows left in the database are not counted."""

    def __init__(self, engine: sa.Engine, conversations: set[str]) -> None:
        self.round_trips = 0
        self._conversations = conversations
        self._engine = engine
        self._touched: set[int] = set()
        self._statements: dict[int, int] = {}
        sa.event.listen(engine, "before_cursor_execute", self._statement)
        sa.event.listen(engine, "commit", self._end)
        sa.event.listen(engine, "rollback", self._end)

    def _statement(self, conn: sa.Connection, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        key = id(conn)
        self._statements[key] = self._statements.get(key, 0) + 1
        named = repr(parameters)
        if any(f"{WORKFLOW_NAME}:{conversation}:" in named for conversation in self._conversations):
            self._touched.add(key)
        if conn.connection.dbapi_connection.autocommit:  # type: ignore[union-attr]
            self._end(conn)

    def _end(self, conn: sa.Connection) -> None:
        key = id(conn)
        statements = self._statements.pop(key, 0)
        if key in self._touched:
            self._touched.discard(key)
            in_transaction = not conn.connection.dbapi_connection.autocommit  # type: ignore[union-attr]
            self.round_trips += statements + (2 if in_transaction else 0)

    def close(self) -> None:
        sa.event.remove(self._engine, "before_cursor_execute", self._statement)
        sa.event.remove(self._engine, "commit", self._end)
        sa.event.remove(self._engine, "rollback", self._end)


@contextlib.contextmanager
def counting_proxy(database: MigratedDatabase) -> Iterator[RoundTripCounter]:
    """The store's round-trip counter, serving on a loop of its own thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    counter = RoundTripCounter(database.cluster)
    asyncio.run_coroutine_threadsafe(counter.start(), loop).result()
    try:
        yield counter
    finally:
        asyncio.run_coroutine_threadsafe(counter.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()


@contextlib.asynccontextmanager
async def serve(
    store: PostgresStore, engine: DurableEngine | None, model: Any, project: Project
) -> AsyncIterator[str]:
    agent = define_agent(name=f"trips-{uuid.uuid4().hex[:6]}", instructions="Answer.", tools=lookup_tools)
    routes = chat_routes(agent=agent, store=store, model=model, context=lambda t: t, durable=engine)
    app = create_agent_worker(env=project.env, routes=routes)
    async with served_here(app) as url:
        yield url


class ToolThenText(ScriptedModel):
    """One tool call, then text; each request takes a moment, as a model's does."""

    def __init__(self, turns: int) -> None:
        steps: list[Any] = []
        for index in range(turns):
            steps += [[Call("lookup", {"key": f"k{index}"})], ["The ", "answer ", "is ", "here."]]
        super().__init__(*steps)

    async def _stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        await asyncio.sleep(0.05)
        async for item in super()._stream(messages, info):
            yield item


async def round_trips_per_turn(database: MigratedDatabase, *, durable: bool) -> tuple[float, float]:
    """Round trips of one new conversation's turn (one tool call, then text), averaged over `TURNS`:
    the store's, and DBOS's for the turn's workflow."""
    project = Project()
    engine = await DurableEngine.launch(database.app_dsn, recovery_interval=60) if durable else None
    conversations: set[str] = set()
    workflows = WorkflowTrips(_get_dbos_instance()._sys_db.engine, conversations) if engine else None
    try:
        with counting_proxy(database) as counter:
            dsn = database.cluster.dsn(database.name, user="bastion_app", host=counter.socket_dir)
            async with await PostgresStore.open(dsn, max_size=2) as store:
                # The log writes only when a turn flushes it, so what is counted does not depend on time.
                store._live = PostgresLiveTurns(store, listen_conninfo=dsn, flush_interval=3600)
                async with (
                    serve(store, engine, ToolThenText(TURNS + 1), project) as url,
                    httpx2.AsyncClient(timeout=30) as http,
                ):
                    user = str(uuid.uuid4())

                    headers = project.headers(user)

                    async def turn() -> None:
                        messages = [user_message("hi")]
                        conversation = str(uuid.uuid4())
                        conversations.add(conversation)
                        body = {"id": conversation, "messages": messages, "trigger": "submit-message"}
                        response = await http.post(f"{url}/api/chat", json=body, headers=headers)
                        assert response.status_code == 200 and '"finish"' in response.text

                    await turn()  # connections, the worker lock and the listener are set up once
                    await asyncio.sleep(0.2)
                    store_before = counter.round_trips
                    workflows_before = workflows.round_trips if workflows is not None else 0
                    for _ in range(TURNS):
                        await turn()
                        # Its log's last write and its workflow's end follow the response.
                        await asyncio.sleep(0.2)
                    store_trips = counter.round_trips - store_before
                    workflow_trips = workflows.round_trips - workflows_before if workflows is not None else 0
                    return store_trips / TURNS, workflow_trips / TURNS
    finally:
        if workflows is not None:
            workflows.close()
        if engine is not None:
            await engine.close()


async def test_a_durable_turn_adds_two_round_trips_its_workflows_row_and_its_tool_results(
    migrated_database: MigratedDatabase,
) -> None:
    plain, _ = await round_trips_per_turn(migrated_database, durable=False)
    store, workflow = await round_trips_per_turn(migrated_database, durable=True)
    print(f"round trips per turn: {plain:g} without durability, {store:g} + {workflow:g} (DBOS) durable")
    # A new conversation's turn: its creation with its claim (one pipelined transaction), its tool's
    # claim and its close, which carry its stream log: no log write of its own.
    assert plain == 3
    # The first model request's checkpoint rides the tool's claim, the last one the close, and no
    # write marks the run durable (its workflow's row keeps it live). Durability adds two writes: the
    # workflow's row, and the tool step's end, which stores the tool's result before the next request
    # can be cut short. The close ends the workflow in its own transaction.
    assert store == plain + 2
    # DBOS itself writes nothing for a turn its process runs: it only finds the row if that process dies.
    assert workflow == 0
