"""A scripted model for tests: each model request plays the next step of a script.

A step is a list of items: a string is a streamed text delta, a `Call` is a streamed tool call.
The model records every request it received (messages and the request's tool and instruction view).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel


@dataclass(frozen=True)
class Call:
    """A tool call the scripted model makes; `args` may be a dict or raw (possibly invalid) JSON text."""

    name: str
    args: Any = field(default_factory=dict)
    call_id: str | None = None


@dataclass
class Request:
    messages: list[ModelMessage]
    info: AgentInfo


class ScriptedModel(FunctionModel):
    def __init__(self, *steps: Sequence[str | Call]) -> None:
        self.steps = list(steps)
        self.requests: list[Request] = []
        super().__init__(stream_function=self._stream)

    async def _stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        self.requests.append(Request(messages=list(messages), info=info))
        if len(self.requests) > len(self.steps):
            raise AssertionError("The scripted model was called more often than scripted.")
        step = self.steps[len(self.requests) - 1]
        call_index = 0
        for item in step:
            if isinstance(item, str):
                yield item
                continue
            args = item.args if isinstance(item.args, str) else json.dumps(item.args)
            call_id = item.call_id or f"call-{len(self.requests)}-{call_index}"
            half = len(args) // 2
            yield {call_index: DeltaToolCall(name=item.name, json_args=args[:half], tool_call_id=call_id)}
            yield {call_index: DeltaToolCall(json_args=args[half:])}
            call_index += 1

    @property
    def calls(self) -> int:
        return len(self.requests)


def user(text: str, message_id: str = "u1") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


async def collect(result: Any) -> list[dict[str, Any]]:
    return [chunk async for chunk in result]


def types(chunks: Sequence[dict[str, Any]]) -> list[str]:
    return [chunk["type"] for chunk in chunks]


def text_of(chunks: Sequence[dict[str, Any]]) -> str:
    return "".join(chunk["delta"] for chunk in chunks if chunk["type"] == "text-delta")


def everything_the_model_saw(model: ScriptedModel) -> str:
    """All messages, instructions and tool definitions the model received, as one string."""
    seen = []
    for request in model.requests:
        seen.append(repr(request.messages))
        seen.append(repr(request.info.instructions))
        seen.append(repr(request.info.function_tools))
    return "\n".join(seen)
