"""The OpenAI Agents SDK on DBOS (`dbos-openai-agents`' `DBOSRunner`): one DBOS workflow per turn.

`agents-sdk-pg` made durable the way `dbos-openai-agents` documents it: the turn is a `@DBOS.workflow`
that calls `DBOSRunner.run`, which records each model response as a DBOS step (`get_response`; the
runner refuses `stream_response` in durable mode) and orders tool calls; `lookup` is a DBOS step too,
as the package tells tools with side effects to be. The history stays in the SQLAlchemy session on
Postgres (asyncpg, pool of 16), as in `agents-sdk-pg`; DBOS's system tables are in the same database.

Not streamed: the turn's events are sent once the workflow returns, the text as one delta per word,
so the client sees the same chunks as from every other system (its time to the first delta is the
whole turn).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from agents import Agent, function_tool, set_tracing_disabled
from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
from dbos import DBOS
from dbos_openai_agents import DBOSRunner
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from bench.client import HttpRequest
from bench.protocol import CHAT_PATH, chat_request, verify_turn
from bench.script import lookup_result
from bench.systems import ClientConfig, ServerConfig
from bench.systems._dbos import launch_dbos
from bench.systems.agents_sdk_pg import POOL_SIZE, ScriptedModel, _event
from bench.systems.limit import HEADERS

ROLE = "peer"
NEEDS_POSTGRES = True
_WORDS = re.compile(r"\S+\s*")
_ENGINES: list[AsyncEngine] = []


def _declare() -> Callable[[str, str], Awaitable[dict[str, Any]]]:
    """The turn's workflow (and `lookup` as a step), declared in the server process only (DBOS
    registers them process-wide, before it launches)."""

    @function_tool
    @DBOS.step(name="bench.agents_sdk.lookup")
    async def lookup(key: str) -> dict[str, Any]:
        """Look a key up."""
        return lookup_result(key)

    agent = Agent(name="bench", instructions="Answer.", model=ScriptedModel(), tools=[lookup])

    @DBOS.workflow(name="bench.agents_sdk.turn")
    async def agent_turn(chat_id: str, text: str) -> dict[str, Any]:
        """One turn: the runner's steps, the session's reads and writes; what the client is sent."""
        session = SQLAlchemySession(chat_id, engine=_ENGINES[0])
        result = await DBOSRunner.run(agent, text, session=session)
        calls: list[dict[str, Any]] = []
        for item in result.new_items:
            if item.type == "tool_call_item":
                raw: Any = item.raw_item
                calls.append({"id": raw.call_id, "name": raw.name, "input": json.loads(raw.arguments)})
            elif item.type == "tool_call_output_item":
                output: Any = item.raw_item
                for call in calls:
                    if call["id"] == output["call_id"]:
                        call["output"] = item.output
        return {"calls": calls, "text": str(result.final_output)}

    return agent_turn


def create_app(config: ServerConfig) -> Starlette:
    assert config.database_url is not None
    set_tracing_disabled(True)
    url = config.database_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    database_url = config.database_url
    agent_turn = _declare()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine = create_async_engine(url, pool_size=POOL_SIZE, max_overflow=0)
        await SQLAlchemySession("setup", engine=engine, create_tables=True).get_items()
        _ENGINES.append(engine)
        launch_dbos("bench-agents-sdk", database_url)
        try:
            yield
        finally:
            DBOS.destroy()
            await engine.dispose()

    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        text = body["messages"][-1]["parts"][0]["text"]
        outcome = await agent_turn(body["id"], text)
        return StreamingResponse(_events(outcome), media_type="text/event-stream", headers=HEADERS)

    return Starlette(routes=[Route(CHAT_PATH, chat, methods=["POST"])], lifespan=lifespan)


async def _events(outcome: dict[str, Any]) -> AsyncIterator[bytes]:
    yield _event({"type": "start", "messageId": uuid.uuid4().hex})
    yield _event({"type": "start-step"})
    for call in outcome["calls"]:
        start = {"type": "tool-input-start", "toolCallId": call["id"], "toolName": call["name"]}
        yield _event(start)
        yield _event({**start, "type": "tool-input-available", "input": call["input"]})
        yield _event({"type": "tool-output-available", "toolCallId": call["id"], "output": call["output"]})
        yield _event({"type": "finish-step"})
    yield _event({"type": "start-step"})
    yield _event({"type": "text-start", "id": "text-1"})
    for word in _WORDS.findall(outcome["text"]):
        yield _event({"type": "text-delta", "id": "text-1", "delta": word})
    yield _event({"type": "text-end", "id": "text-1"})
    yield _event({"type": "finish-step"})
    yield _event({"type": "finish", "finishReason": "stop"})
    yield b"data: [DONE]\n\n"


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    return chat_request(chat_id, messages)


verify_stream = verify_turn
