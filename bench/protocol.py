"""The wire every system speaks: an AI SDK chat request in, the UI message stream (SSE) out.

`chat_request` builds what `useChat` posts (the whole history, every turn). `verify_turn` accepts a
response only if it is a complete, correct turn of the script: status 200, an event stream, a `start`,
the `lookup` call with its exact result before any text, exactly the requested words as separate
deltas in order, a `finish` and the closing `[DONE]`, and no `error` chunk. It returns the assistant
message the client would assemble, so 5-turn conversations send back a history that grows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.client import HttpRequest, HttpResponse
from bench.script import TOOL_ARGS, TOOL_NAME, lookup_result, prompt, word

CHAT_PATH = "/chat"
_DONE = "[DONE]"


class TurnVerificationError(Exception):
    """The response was not a complete, correct turn; the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class VerifiedTurn:
    """A turn that passed verification: the assistant message and how many text deltas it streamed."""

    message: dict[str, Any]
    deltas: int


@dataclass(frozen=True, slots=True)
class ExpectedTool:
    """The one tool call a turn makes, and what its result must satisfy (the script's `lookup`, unless a
    system's agent has its own tools)."""

    name: str = TOOL_NAME
    input: Any = field(default_factory=lambda: dict(TOOL_ARGS))
    output_ok: Callable[[Any], bool] = lambda output: output == lookup_result(TOOL_ARGS["key"])


LOOKUP = ExpectedTool()


def user_message(words: int) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": prompt(words)}]}


def chat_request(
    chat_id: str,
    messages: list[dict[str, Any]],
    *,
    headers: dict[str, str] | None = None,
    path: str = CHAT_PATH,
) -> HttpRequest:
    """The request `useChat` sends for a new user message: the chat id and the whole history."""
    body = {"id": chat_id, "messages": messages, "trigger": "submit-message"}
    return HttpRequest(path=path, body=json.dumps(body).encode(), headers=dict(headers or {}))


def sse_events(body: bytes) -> list[str]:
    """The `data:` payloads of an event stream, in order; anything else in the stream is an error."""
    text = body.decode("utf-8")
    if not text.endswith("\n\n"):
        raise TurnVerificationError("the stream does not end with a complete event")
    events = []
    for block in text[:-2].split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        if len(lines) != 1 or not lines[0].startswith("data:"):
            raise TurnVerificationError(f"not a single-line data event: {block[:80]!r}")
        events.append(lines[0][5:].lstrip(" "))
    return events


def verify_turn(response: HttpResponse, *, words: int, tool: ExpectedTool = LOOKUP) -> VerifiedTurn:
    """The verified assistant message of `response`; `TurnVerificationError` for anything short of it."""
    if response.status != 200:
        raise TurnVerificationError(f"status {response.status}: {response.body[:200]!r}")
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        raise TurnVerificationError(f"content-type {response.headers.get('content-type')!r}")
    events = sse_events(response.body)
    if not events or events[-1] != _DONE:
        raise TurnVerificationError("the stream does not end with [DONE]")
    chunks = [_chunk(event) for event in events[:-1]]
    return _Turn(words, tool).read(chunks)


def _chunk(event: str) -> dict[str, Any]:
    try:
        chunk = json.loads(event)
    except ValueError as exc:
        raise TurnVerificationError(f"not JSON: {event[:80]!r}") from exc
    if not isinstance(chunk, dict) or not isinstance(chunk.get("type"), str):
        raise TurnVerificationError(f"not a UI message chunk: {event[:80]!r}")
    return chunk


class _Turn:
    """Walks a turn's chunks once, checking the order the script demands."""

    def __init__(self, words: int, tool: ExpectedTool) -> None:
        self._words = words
        self._tool = tool
        self._inputs: dict[str, dict[str, Any]] = {}
        self._tool_part: dict[str, Any] | None = None
        self._text: list[str] = []
        self._finished = False

    def read(self, chunks: list[dict[str, Any]]) -> VerifiedTurn:
        if not chunks or chunks[0]["type"] != "start":
            raise TurnVerificationError("the stream does not begin with a start chunk")
        message_id = chunks[0].get("messageId") or uuid.uuid4().hex
        for chunk in chunks[1:]:
            self._apply(chunk)
        if self._tool_part is None:
            raise TurnVerificationError(f"the {self._tool.name} tool result is missing")
        if len(self._text) != self._words:
            raise TurnVerificationError(f"{len(self._text)} text deltas, expected {self._words}")
        if not self._finished:
            raise TurnVerificationError("the stream has no finish chunk")
        parts = [
            {"type": "step-start"},
            self._tool_part,
            {"type": "step-start"},
            {"type": "text", "text": "".join(self._text), "state": "done"},
        ]
        return VerifiedTurn(
            message={"id": message_id, "role": "assistant", "parts": parts}, deltas=self._words
        )

    def _apply(self, chunk: dict[str, Any]) -> None:
        kind = chunk["type"]
        if self._finished:
            raise TurnVerificationError(f"a {kind} chunk after finish")
        if kind == "error":
            raise TurnVerificationError(f"an error chunk: {chunk.get('errorText')!r}")
        if kind == "tool-input-available":
            if chunk.get("toolName") != self._tool.name or chunk.get("input") != self._tool.input:
                raise TurnVerificationError(f"an unexpected tool call: {chunk!r}")
            self._inputs[str(chunk.get("toolCallId"))] = chunk
        elif kind == "tool-output-available":
            self._tool_output(chunk)
        elif kind == "text-delta":
            self._delta(chunk)
        elif kind == "finish":
            self._finished = True

    def _tool_output(self, chunk: dict[str, Any]) -> None:
        call_id = str(chunk.get("toolCallId"))
        if self._tool_part is not None:
            raise TurnVerificationError("more than one tool result")
        if call_id not in self._inputs:
            raise TurnVerificationError("a tool result for a call that was never made")
        if not self._tool.output_ok(chunk.get("output")):
            raise TurnVerificationError(f"a wrong tool result: {chunk.get('output')!r}")
        self._tool_part = {
            "type": f"tool-{self._tool.name}",
            "toolCallId": call_id,
            "state": "output-available",
            "input": self._inputs[call_id]["input"],
            "output": chunk["output"],
        }

    def _delta(self, chunk: dict[str, Any]) -> None:
        if self._tool_part is None:
            raise TurnVerificationError("text before the tool result")
        expected = word(len(self._text))
        if chunk.get("delta") != expected:
            raise TurnVerificationError(
                f"delta {len(self._text)} is {chunk.get('delta')!r}, expected {expected!r}"
            )
        self._text.append(expected)
