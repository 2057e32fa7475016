"""The limit: a plain Starlette SSE response of the script's chunks, precomputed. No framework, no model.

It still reads the request (the word count is in the latest user message), so what separates a system
from the limit is the system's own work: the agent loop, auth, persistence and encoding.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import lru_cache
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from bench.client import HttpRequest
from bench.protocol import CHAT_PATH, chat_request, verify_turn
from bench.script import TOOL_ARGS, TOOL_NAME, lookup_result, requested_words, tool_call_id, word
from bench.systems import ClientConfig, ServerConfig

ROLE = "limit"
NEEDS_POSTGRES = False
HEADERS = {"cache-control": "no-cache", "x-vercel-ai-ui-message-stream": "v1", "x-accel-buffering": "no"}


def create_app(config: ServerConfig) -> Starlette:
    return Starlette(routes=[Route(CHAT_PATH, chat, methods=["POST"])])


async def chat(request: Request) -> StreamingResponse:
    messages = (await request.json())["messages"]
    users = [m for m in messages if m["role"] == "user"]
    events = turn_events(requested_words(users[-1]["parts"][0]["text"]), len(users))
    return StreamingResponse(_each(events), media_type="text/event-stream", headers=HEADERS)


async def _each(events: tuple[bytes, ...]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


@lru_cache(maxsize=64)
def turn_events(words: int, user_turns: int) -> tuple[bytes, ...]:
    """The whole turn as encoded events, the same chunks bastion's loop produces for the script."""
    call_id = tool_call_id(user_turns)
    arguments = json.dumps(TOOL_ARGS)
    chunks: list[dict[str, Any]] = [
        {"type": "start", "messageId": f"limit-{user_turns}"},
        {"type": "start-step"},
        {"type": "tool-input-start", "toolCallId": call_id, "toolName": TOOL_NAME},
        {"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": arguments},
        {"type": "tool-input-available", "toolCallId": call_id, "toolName": TOOL_NAME, "input": TOOL_ARGS},
        {"type": "tool-output-available", "toolCallId": call_id, "output": lookup_result(TOOL_ARGS["key"])},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "text-1"},
        *({"type": "text-delta", "id": "text-1", "delta": word(index)} for index in range(words)),
        {"type": "text-end", "id": "text-1"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop"},
    ]
    encoded = [f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode() for chunk in chunks]
    return (*encoded, b"data: [DONE]\n\n")


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    return chat_request(chat_id, messages)


verify_stream = verify_turn
