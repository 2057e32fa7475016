"""pydantic-ai on DBOS (`DBOSDurability`, the capability that replaced `DBOSAgent`): one workflow per turn.

`pydantic-ai-adapter` made durable the way pydantic-ai documents it: the agent carries the
`DBOSDurability` capability, and each turn is a `@DBOS.workflow` that calls `agent.run`, so every model
request is a DBOS step and every tool event an event-handler step (`lookup`, a plain function tool, is
not a step). The events are streamed live through the capability's `event_stream_handler` (the only
live stream a durable run has; it is not itself durable), turned into UI chunks by pydantic-ai's
`VercelAIEventStream`. DBOS's system tables are in the system's own database; pydantic-ai keeps no
history (the client sends it every turn, as to `pydantic-ai-adapter`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from dbos import DBOS
from pydantic_ai import Agent, RunContext
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.messages import AgentStreamEvent
from pydantic_ai.ui.vercel_ai import VercelAIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.client import HttpRequest
from bench.protocol import CHAT_PATH, chat_request, verify_turn
from bench.script import lookup_result
from bench.systems import ClientConfig, ServerConfig
from bench.systems._dbos import launch_dbos
from bench.systems._pydantic_ai_model import scripted_model

ROLE = "peer"
NEEDS_POSTGRES = True

# The live streams of this process's turns, by turn id (the run's deps).
_STREAMS: dict[str, asyncio.Queue[AgentStreamEvent | None]] = {}


async def _forward(context: RunContext[str], events: AsyncIterable[AgentStreamEvent]) -> None:
    stream = _STREAMS.get(context.deps)
    async for event in events:
        if stream is not None:
            stream.put_nowait(event)


def _declare() -> tuple[Agent[str, str], Callable[[str, str], Awaitable[str]]]:
    """The durable agent and the turn's workflow, declared in the server process only (DBOS registers
    them process-wide, before it launches)."""
    agent: Agent[str, str] = Agent(
        scripted_model(),
        name="bench",
        instructions="Answer.",
        deps_type=str,
        capabilities=[DBOSDurability(event_stream_handler=_forward)],
    )

    @agent.tool_plain
    async def lookup(key: str) -> dict[str, Any]:
        """Look a key up."""
        return lookup_result(key)

    @DBOS.workflow(name="bench.pydantic_ai.turn")
    async def agent_turn(turn_id: str, body: str) -> str:
        """One turn: the history the client sent, run to the end; its events go to the turn's stream."""
        try:
            adapter = VercelAIAdapter(agent=agent, run_input=VercelAIAdapter.build_run_input(body.encode()))
            result = await agent.run(message_history=adapter.messages, deps=turn_id)
            return result.output
        finally:
            stream = _STREAMS.get(turn_id)
            if stream is not None:
                stream.put_nowait(None)

    return agent, agent_turn


def create_app(config: ServerConfig) -> Starlette:
    assert config.database_url is not None
    database_url = config.database_url
    agent, agent_turn = _declare()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        launch_dbos("bench-pydantic-ai", database_url)
        try:
            yield
        finally:
            DBOS.destroy()

    async def chat(request: Request) -> Response:
        body = await request.body()
        adapter = VercelAIAdapter(agent=agent, run_input=VercelAIAdapter.build_run_input(body), sdk_version=6)
        turn_id = uuid.uuid4().hex
        stream: asyncio.Queue[AgentStreamEvent | None] = asyncio.Queue()
        _STREAMS[turn_id] = stream
        workflow = asyncio.ensure_future(agent_turn(turn_id, body.decode()))

        async def events() -> AsyncIterator[AgentStreamEvent]:
            try:
                while (event := await stream.get()) is not None:
                    yield event
                await workflow
            finally:
                _STREAMS.pop(turn_id, None)

        event_stream = adapter.build_event_stream()
        return event_stream.streaming_response(event_stream.transform_stream(events()))

    return Starlette(routes=[Route(CHAT_PATH, chat, methods=["POST"])], lifespan=lifespan)


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    return chat_request(chat_id, messages)


verify_stream = verify_turn
