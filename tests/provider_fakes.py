"""Local fakes of model providers' HTTP APIs, served on 127.0.0.1: OpenAI chat completions, OpenAI
responses and Anthropic messages, each streamed the way the real API streams.

Every fake plays the same script: when the last input is a user's text it calls the tool `shout` with
that text as `word`, always with the same tool-call id (as many OpenAI-compatible local servers do);
when the last input is the tool's result it answers `Done: <result>`. Requests are recorded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

USAGE_IN, USAGE_OUT = 11, 7


@dataclass
class Fake:
    """The fakes' shared state: the tool-call id they use and every request body they received."""

    call_id: str = "call_0"
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/messages", self._messages, methods=["POST"]),
            ]
        )

    async def _read(self, api: str, request: Request) -> dict[str, Any]:
        body: dict[str, Any] = await request.json()
        self.requests.append((api, body))
        return body

    async def _chat(self, request: Request) -> Response:
        body = await self._read("chat", request)
        last = body["messages"][-1]
        chunks = (
            _chat_text(f"Done: {last['content']}")
            if last["role"] == "tool"
            else _chat_call(self.call_id, _text_of(last["content"]))
        )
        return _sse(f"data: {text}\n\n" for text in [*map(json.dumps, chunks), "[DONE]"])

    async def _responses(self, request: Request) -> Response:
        body = await self._read("responses", request)
        last = body["input"][-1]
        if last.get("type") == "function_call_output":
            events = _responses_text(f"Done: {last['output']}")
        else:
            events = _responses_call(self.call_id, _text_of(last["content"]))
        return _sse(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events)

    async def _messages(self, request: Request) -> Response:
        body = await self._read("messages", request)
        content = body["messages"][-1]["content"]
        results = [block for block in content if isinstance(block, dict) and block["type"] == "tool_result"]
        if results:
            events = _anthropic_text(f"Done: {_text_of(results[0]['content'])}")
        else:
            events = _anthropic_call(self.call_id, _text_of(content))
        return _sse(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events)


def _sse(lines: Iterator[str]) -> Response:
    return StreamingResponse(lines, media_type="text/event-stream")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content if isinstance(block, dict))


# --- OpenAI chat completions ---


def _chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _chat_usage() -> dict[str, Any]:
    usage = {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT, "total_tokens": USAGE_IN + USAGE_OUT}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "fake",
        "choices": [],
    } | {"usage": usage}


def _chat_call(call_id: str, word: str) -> list[Any]:
    arguments = json.dumps({"word": word})
    function = {"name": "shout", "arguments": arguments[:5]}
    return [
        _chat_chunk(
            {
                "role": "assistant",
                "tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": function}],
            }
        ),
        _chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[5:]}}]}),
        _chat_chunk({}, "tool_calls"),
        _chat_usage(),
    ]


def _chat_text(text: str) -> list[Any]:
    return [
        _chat_chunk({"role": "assistant", "content": text[:3]}),
        _chat_chunk({"content": text[3:]}),
        _chat_chunk({}, "stop"),
        _chat_usage(),
    ]


# --- OpenAI responses ---


def _response(status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": "fake",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "usage": {
            "input_tokens": USAGE_IN,
            "output_tokens": USAGE_OUT,
            "total_tokens": USAGE_IN + USAGE_OUT,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        if status == "completed"
        else None,
    }


def _responses_call(call_id: str, word: str) -> list[dict[str, Any]]:
    arguments = json.dumps({"word": word})
    item = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": call_id,
        "name": "shout",
        "status": "in_progress",
    }
    done = {**item, "arguments": arguments, "status": "completed"}
    return [
        {"type": "response.created", "sequence_number": 0, "response": _response("in_progress", [])},
        {
            "type": "response.output_item.added",
            "sequence_number": 1,
            "output_index": 0,
            "item": {**item, "arguments": ""},
        },
        {
            "type": "response.function_call_arguments.delta",
            "sequence_number": 2,
            "item_id": "fc_1",
            "output_index": 0,
            "delta": arguments,
        },
        {
            "type": "response.function_call_arguments.done",
            "sequence_number": 3,
            "item_id": "fc_1",
            "output_index": 0,
            "name": "shout",
            "arguments": arguments,
        },
        {"type": "response.output_item.done", "sequence_number": 4, "output_index": 0, "item": done},
        {"type": "response.completed", "sequence_number": 5, "response": _response("completed", [done])},
    ]


def _responses_text(text: str) -> list[dict[str, Any]]:
    part = {"type": "output_text", "text": "", "annotations": []}
    item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
    done_item = {**item, "status": "completed", "content": [{**part, "text": text}]}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    return [
        {"type": "response.created", "sequence_number": 0, "response": _response("in_progress", [])},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item},
        {"type": "response.content_part.added", "sequence_number": 2, **where, "part": part},
        {"type": "response.output_text.delta", "sequence_number": 3, **where, "delta": text, "logprobs": []},
        {"type": "response.output_text.done", "sequence_number": 4, **where, "text": text, "logprobs": []},
        {"type": "response.output_item.done", "sequence_number": 5, "output_index": 0, "item": done_item},
        {"type": "response.completed", "sequence_number": 6, "response": _response("completed", [done_item])},
    ]


# --- Anthropic messages ---


def _anthropic_start() -> dict[str, Any]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "fake",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": USAGE_IN, "output_tokens": 1},
    }
    return {"type": "message_start", "message": message}


def _anthropic_end(reason: str) -> list[dict[str, Any]]:
    return [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": USAGE_OUT},
        },
        {"type": "message_stop"},
    ]


def _anthropic_call(call_id: str, word: str) -> list[dict[str, Any]]:
    arguments = json.dumps({"word": word})
    block = {"type": "tool_use", "id": call_id, "name": "shout", "input": {}}
    return [
        _anthropic_start(),
        {"type": "content_block_start", "index": 0, "content_block": block},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": arguments},
        },
        *_anthropic_end("tool_use"),
    ]


def _anthropic_text(text: str) -> list[dict[str, Any]]:
    return [
        _anthropic_start(),
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        *_anthropic_end("end_turn"),
    ]
