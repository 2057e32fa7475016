"""A durable chat worker process for the take-over tests: `python -m tests.durable_chat_worker PORT`.

It serves `chat_routes(durable=engine)` over uvicorn on the test database, with a scripted model that
streams slowly and a tool that takes a while. Every model request and every tool execution is
recorded in `public.durable_turn_effects` through the owner's connection, outside any turn's
transaction, so a request or a side effect that happens twice shows twice. The user's text says
what to do: `turn <id>` (a text step, a tool call, then a text step), `approve …` (the same with a
tool that needs approval), anything else one short text step.

`BASTION_TEST_DIE` makes the process SIGKILL itself at a point a timer cannot hit reliably:
`before-save` (just before the turn's save) or `after-save` (just after it, before `after_turn` and,
with memory on, before the workflow records its end). `BASTION_TEST_START_DELAY` (seconds) delays
building the routes after the engine launched, as a process that registers slowly would: DBOS may
hand it recovered turns meanwhile.
SIGTERM drains the worker (`bastion.draining_server`) for `BASTION_TEST_DRAIN_SECONDS` (default 5).

`BASTION_TEST_MEMORY=1` adds memory with extraction as a durable job (the database needs memory's
migrations): a turn whose text is `fact <id>` (or `turn <id>`) keeps one fact, slowly, recording
`extract:start` and `extract:done` around the wait, so a test can kill the worker with the job in
flight.

`BASTION_TEST_RETENTION=1` starts retention (`bastion.retention`, no hooks, imported only then) once the
routes are built, keeping finished turns an hour, on a schedule that never fires during a test: the test
triggers it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import uvicorn
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bastion import AgentTools, define_agent, tool
from bastion.auth import SupabaseEnv
from bastion.chat.endpoint import chat_routes
from bastion.chat.turn import ChatTurn
from bastion.drain import Drain
from bastion.draining_server import DrainingServer
from bastion.durable import DurableEngine
from bastion.memory import AgentMemory, HashingEmbedder, PostgresMemoryStore, define_memory
from bastion.stores import PostgresStore
from bastion.stores.postgres import PostgresAgentPersistence
from bastion.worker import create_agent_worker

PROJECT_URL = "https://project-ref.supabase.co"
EFFECTS_TABLE = """
create table if not exists public.durable_turn_effects (
  conversation text not null, kind text not null, executor text not null,
  at timestamptz not null default clock_timestamp()
);
"""
DELTAS = 6
EXECUTOR = os.environ.get("BASTION_EXECUTOR_ID", "worker")


def delay() -> float:
    return float(os.environ.get("BASTION_TEST_DELAY", "0.08"))


async def record(conversation: str, kind: str) -> int:
    """Record one effect; how many of its kind the conversation had before. While the database is
    down (a test restarting it), the record waits for it, as a model or a tool would not notice."""
    for _ in range(300):
        try:
            return await _record(conversation, kind)
        except psycopg.OperationalError:
            await asyncio.sleep(0.1)
    return await _record(conversation, kind)


async def _record(conversation: str, kind: str) -> int:
    async with await psycopg.AsyncConnection.connect(os.environ["BASTION_TEST_DSN"], autocommit=True) as conn:
        cursor = await conn.execute(
            "select count(*) from public.durable_turn_effects where conversation = %s and kind = %s",
            (conversation, kind),
        )
        row = await cursor.fetchone()
        await conn.execute(
            "insert into public.durable_turn_effects (conversation, kind, executor) values (%s, %s, %s)",
            (conversation, kind, EXECUTOR),
        )
    return int(row[0]) if row else 0


def step_text(step: int, attempt: int) -> str:
    """What a request streams: a request asked again streams other text (one `*` per earlier ask),
    so what a dead attempt showed can be told from what the turn kept."""
    return "".join(f"{'ab'[min(step, 1)]}{index}{'*' * attempt} " for index in range(DELTAS))


def latest_prompt(messages: list[ModelMessage]) -> tuple[str, int]:
    """The latest user text and how many model responses this turn already has (its step)."""
    for position in range(len(messages) - 1, -1, -1):
        message = messages[position]
        if isinstance(message, ModelRequest):
            texts = [p.content for p in message.parts if isinstance(p, UserPromptPart)]
            if texts and isinstance(texts[-1], str):
                step = sum(isinstance(m, ModelResponse) for m in messages[position + 1 :])
                return texts[-1], step
    raise AssertionError("No user prompt.")


async def scripted(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    text, step = latest_prompt(messages)
    kind, _, conversation = text.partition(" ")
    attempt = await record(conversation, f"model:{kind}:{step}")
    if kind not in ("turn", "approve"):
        yield "ok"
        return
    await asyncio.sleep(delay() * 2)
    for delta in step_text(step, attempt).split(" ")[:-1]:
        yield delta + " "
        await asyncio.sleep(delay())
    if step == 0:
        name = "count_effect" if kind == "turn" else "approved_effect"
        yield {
            0: DeltaToolCall(name=name, json_args=json.dumps({"label": conversation}), tool_call_id="call_0")
        }


def tools(turn: ChatTurn) -> AgentTools:
    async def effect(name: str, label: str) -> dict[str, Any]:
        await record(label, f"{name}:start")
        await asyncio.sleep(delay() * 6)
        await record(label, f"{name}:done")
        return {"done": label}

    @tool
    async def count_effect(label: str) -> dict[str, Any]:
        """Does something once."""
        return await effect("tool", label)

    @tool(needs_approval=True)
    async def approved_effect(label: str) -> dict[str, Any]:
        """Does something once, when the user approves."""
        return await effect("approved", label)

    return AgentTools(tools=[count_effect, approved_effect])


def fact_of(messages: list[dict[str, Any]]) -> str:
    """The conversation id a `fact <id>` or `turn <id>` turn names, else ''."""
    [*_, latest] = [message for message in messages if message["role"] == "user"]
    text = "".join(part.get("text", "") for part in latest["parts"] if part["type"] == "text")
    kind, _, conversation = text.partition(" ")
    return conversation if kind in ("fact", "turn") else ""


async def extract(messages: list[dict[str, Any]], context: Any) -> list[str]:
    conversation = fact_of(messages)
    if not conversation:
        return []
    await record(conversation, "extract:start")
    await asyncio.sleep(delay() * 20)
    await record(conversation, "extract:done")
    return [f"The code word is {conversation}."]


async def durable_memory(store: PostgresStore, engine: DurableEngine) -> AgentMemory[Any]:
    memory: AgentMemory[Any] = define_memory(
        store=PostgresMemoryStore(store, embedder=HashingEmbedder(64)),
        identity=lambda turn: turn.identity,
        operation_id=lambda turn: turn.run_id,
        tools=False,
        extract=extract,
        extract_retry_delay=0.05,
    )
    await memory.start(engine, context=lambda job: job)
    return memory


async def start_retention(store: PostgresStore, engine: DurableEngine, dsn: str) -> None:
    # Imported only now, long after the engine launched: its run's workflow is declared with the engine.
    from bastion.retention import Retention, RetentionPolicy

    policy = RetentionPolicy(finished_turns=timedelta(hours=1), schedule="0 0 0 1 1 *")
    await Retention(store, conninfo=dsn, policy=policy, hooks=False).start(engine)


def die_while_saving(point: str) -> None:
    """SIGKILL this process just before or just after a turn's save (not of a short reply)."""
    finish_run = PostgresAgentPersistence.finish_run

    async def dying(self: Any, context: Any, state: Any, outcome: Any) -> None:
        message = outcome.response_message or {}
        long_reply = any(
            part.get("type") == "text" and "a0" in part.get("text", "") for part in message.get("parts", [])
        )
        if long_reply and point == "before-save":
            os.kill(os.getpid(), signal.SIGKILL)
        await finish_run(self, context, state, outcome)
        if long_reply and point == "after-save":
            os.kill(os.getpid(), signal.SIGKILL)

    PostgresAgentPersistence.finish_run = dying  # type: ignore[method-assign]


async def main(port: int) -> None:
    if os.environ.get("BASTION_TEST_DIE"):
        die_while_saving(os.environ["BASTION_TEST_DIE"])
    dsn = os.environ["BASTION_TEST_APP_DSN"]
    store = await PostgresStore.open(
        dsn, max_size=4, pool_timeout=float(os.environ.get("BASTION_TEST_POOL_TIMEOUT", "30"))
    )
    engine = await DurableEngine.launch(dsn, recovery_interval=0.25)
    await asyncio.sleep(float(os.environ.get("BASTION_TEST_START_DELAY", "0")))
    agent = define_agent(name="durable-test", instructions="Answer.", tools=tools)
    model = FunctionModel(stream_function=scripted)
    drain = Drain()
    memory = await durable_memory(store, engine) if os.environ.get("BASTION_TEST_MEMORY") else None
    routes = chat_routes(
        agent=agent,
        store=store,
        model=model,
        context=lambda turn: turn,
        durable=engine,
        stop_wait_seconds=5,
        drain=drain,
        after_turn=memory.after_chat_turn if memory is not None else None,
    )
    if os.environ.get("BASTION_TEST_RETENTION"):
        await start_retention(store, engine, dsn)
    env = SupabaseEnv(url=PROJECT_URL, jwks=json.loads(os.environ["BASTION_TEST_JWKS"]))
    app = create_agent_worker(env=env, routes=[*routes, drain.ready_route()])
    server = DrainingServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"),
        drain=drain,
        seconds=float(os.environ.get("BASTION_TEST_DRAIN_SECONDS", "5")),
    )
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    print("ready", engine.executor_id, store.worker_key, flush=True)
    try:
        await serving
    finally:
        await engine.close()
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
