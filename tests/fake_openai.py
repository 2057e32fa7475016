"""A local fake of an OpenAI-compatible chat completions server that, like many local servers, names
every tool call `call_0`.

It streams one step per request: after a tool result it answers with text; otherwise it calls the
tool the latest user message asks for (`remember that ...` saves a note, `show my notes` lists them).
A message `hold on` is answered only once `FakeProvider.release` is set, so a turn stays running.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
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


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content or [])


def _step(messages: list[dict[str, Any]]) -> list[str]:
    last = messages[-1]
    if last.get("role") == "tool" or _text(last) == "hold on":
        return [_chunk({"role": "assistant", "content": "Done."}), _chunk({}, "stop")]
    text = _text(last)
    remember = re.match(r"remember that (.+)", text)
    name, arguments = ("save_note", {"text": remember[1]}) if remember else ("list_notes", {})
    call = {"index": 0, "id": REUSED_ID, "type": "function", "function": {"name": name, "arguments": ""}}
    return [
        _chunk({"role": "assistant", "tool_calls": [call]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps(arguments)}}]}),
        _chunk({}, "tool_calls"),
    ]


@dataclass
class FakeProvider:
    """The fake's controls, shared with the server thread."""

    holding: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    async def completions(self, request: Request) -> StreamingResponse:
        body = await request.json()
        if _text(body["messages"][-1]) == "hold on":
            self.holding.set()
            while not self.release.is_set():
                await asyncio.sleep(0.01)

        async def events() -> AsyncIterator[str]:
            for event in _step(body["messages"]):
                yield event
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def fake_openai(provider: FakeProvider | None = None) -> Starlette:
    completions = (provider or FakeProvider()).completions
    return Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"])])
