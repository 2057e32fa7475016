"""A local fake of an OpenAI-compatible chat completions server that, like many local servers, names
every tool call `call_0`.

It streams one step per request: after a tool result it answers with text; otherwise it calls the
tool the latest user message asks for (`remember that ...` saves a note, `show my notes` lists them).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

REUSED_ID = "call_0"


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    return f"data: {json.dumps(body)}\n\n"


def _step(messages: list[dict[str, Any]]) -> list[str]:
    last = messages[-1]
    if last.get("role") == "tool":
        return [_chunk({"role": "assistant", "content": "Done."}), _chunk({}, "stop")]
    content = last.get("content")
    text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content or [])
    remember = re.match(r"remember that (.+)", text)
    name, arguments = ("save_note", {"text": remember[1]}) if remember else ("list_notes", {})
    call = {"index": 0, "id": REUSED_ID, "type": "function", "function": {"name": name, "arguments": ""}}
    return [
        _chunk({"role": "assistant", "tool_calls": [call]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(arguments)}}]}),
        _chunk({}, "tool_calls"),
    ]


async def _completions(request: Request) -> StreamingResponse:
    body = await request.json()

    async def events() -> AsyncIterator[str]:
        for event in _step(body["messages"]):
            yield event
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def fake_openai() -> Starlette:
    return Starlette(routes=[Route("/v1/chat/completions", _completions, methods=["POST"])])
