"""The OpenAI Agents SDK with its SQLAlchemy session on Postgres (asyncpg), one session per chat.

The scripted model is a custom `Model` that streams Responses API events: the `lookup` call, then the
words as separate `response.output_text.delta` events. The route sends only the new user message (the
session holds the history) and maps the run's events to the UI message stream, as an application would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from bench.client import HttpRequest
from bench.protocol import CHAT_PATH, chat_request, verify_turn
from bench.script import TOOL_ARGS, TOOL_NAME, lookup_result, requested_words, tool_call_id, word
from bench.systems import ClientConfig, ServerConfig
from bench.systems.limit import HEADERS

ROLE = "peer"
NEEDS_POSTGRES = True
POOL_SIZE = 16


def _item_type(item: Any) -> str | None:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


def _user_texts(items: list[Any]) -> list[str]:
    return [
        item["content"]
        for item in items
        if isinstance(item, dict) and item.get("role") == "user" and isinstance(item.get("content"), str)
    ]


def _response(output: list[Any]) -> Response:
    return Response.model_construct(
        id=f"resp-{uuid.uuid4().hex}",
        created_at=0,
        model="bench-script",
        object="response",
        output=output,
        parallel_tool_calls=False,
        tool_choice="auto",
        tools=[],
        status="completed",
        usage=None,
    )


class ScriptedModel(Model):
    """The script as a Responses API stream, zero latency."""

    def _plan(self, input: str | list[Any]) -> tuple[list[Any], list[str]]:
        items: list[Any] = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        texts = _user_texts(items)
        if _item_type(items[-1]) == "function_call_output":
            return [], [word(index) for index in range(requested_words(texts[-1]))]
        call = ResponseFunctionToolCall(
            type="function_call",
            call_id=tool_call_id(len(texts)),
            name=TOOL_NAME,
            arguments=json.dumps(TOOL_ARGS),
            id=f"fc-{uuid.uuid4().hex}",
            status="completed",
        )
        return [call], []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        calls, words = self._plan(input)
        output = calls or [_message("".join(words))]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    async def stream_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> AsyncIterator[Any]:
        calls, words = self._plan(input)
        if calls:
            yield ResponseCompletedEvent(
                type="response.completed", response=_response(calls), sequence_number=0
            )
            return
        item_id = f"msg-{uuid.uuid4().hex}"
        for index, delta in enumerate(words):
            yield ResponseTextDeltaEvent.model_construct(
                type="response.output_text.delta",
                item_id=item_id,
                output_index=0,
                content_index=0,
                delta=delta,
                logprobs=[],
                sequence_number=index + 1,
            )
        completed = _response([_message("".join(words), item_id)])
        yield ResponseCompletedEvent(
            type="response.completed", response=completed, sequence_number=len(words) + 1
        )


def _message(text: str, item_id: str | None = None) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=item_id or f"msg-{uuid.uuid4().hex}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


@function_tool
async def lookup(key: str) -> dict[str, Any]:
    """Look a key up."""
    return lookup_result(key)


def create_app(config: ServerConfig) -> Starlette:
    assert config.database_url is not None
    set_tracing_disabled(True)
    url = config.database_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    engines: list[AsyncEngine] = []
    agent = Agent(name="bench", instructions="Answer.", model=ScriptedModel(), tools=[lookup])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # asyncpg reads the socket directory from `host`, as libpq does, so the URI passes as it is.
        engine = create_async_engine(url, pool_size=POOL_SIZE, max_overflow=0)
        await SQLAlchemySession("setup", engine=engine, create_tables=True).get_items()
        engines.append(engine)
        yield
        await engine.dispose()

    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        text = body["messages"][-1]["parts"][0]["text"]
        session = SQLAlchemySession(body["id"], engine=engines[0])
        return StreamingResponse(
            _events(agent, session, text), media_type="text/event-stream", headers=HEADERS
        )

    return Starlette(routes=[Route(CHAT_PATH, chat, methods=["POST"])], lifespan=lifespan)


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def _events(agent: Agent[Any], session: SQLAlchemySession, text: str) -> AsyncIterator[bytes]:
    yield _event({"type": "start", "messageId": uuid.uuid4().hex})
    yield _event({"type": "start-step"})
    text_open = False
    result = Runner.run_streamed(agent, input=text, session=session)
    async for event in result.stream_events():
        if event.type == "raw_response_event":
            if isinstance(event.data, ResponseTextDeltaEvent):
                if not text_open:
                    text_open = True
                    yield _event({"type": "start-step"})
                    yield _event({"type": "text-start", "id": "text-1"})
                yield _event({"type": "text-delta", "id": "text-1", "delta": event.data.delta})
        elif event.type == "run_item_stream_event":
            if event.name == "tool_called":
                call = event.item.raw_item
                start = {"type": "tool-input-start", "toolCallId": call.call_id, "toolName": call.name}
                yield _event(start)
                yield _event({**start, "type": "tool-input-available", "input": json.loads(call.arguments)})
            elif event.name == "tool_output":
                call_id = event.item.raw_item["call_id"]
                yield _event(
                    {"type": "tool-output-available", "toolCallId": call_id, "output": event.item.output}
                )
                yield _event({"type": "finish-step"})
    if text_open:
        yield _event({"type": "text-end", "id": "text-1"})
    yield _event({"type": "finish-step"})
    yield _event({"type": "finish", "finishReason": "stop"})
    yield b"data: [DONE]\n\n"


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    return chat_request(chat_id, messages)


verify_stream = verify_turn
