"""Scripted models for the inbox's bot: each answers the contact's latest message, in this process and in
the worker processes the crash test kills.

- "Re: <text>" for a message; a message starting "handoff" makes the model call `handoff_to_human`
  first; one starting "call <tool>" makes it call that tool first (and then report what came back).
- `gate`: every model request waits for it, so a test can hold a reply while it arrives at the queue.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pydantic_ai.messages import ModelMessage, ModelRequest, RetryPromptPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bastion import Agent, Tool, define_agent
from bastion.inbox import InboxTurn, handoff_to_human


@dataclass
class EchoModel:
    """A FunctionModel factory that remembers every request (the last user text, the tools offered)."""

    gate: asyncio.Event | None = None
    seen: list[tuple[str, list[str]]] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    started: int = 0

    def model(self) -> FunctionModel:
        return FunctionModel(stream_function=self._stream)

    async def _stream(
        self, messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        self.started += 1
        if self.gate is not None:
            await self.gate.wait()
        last = messages[-1]
        parts = last.parts if isinstance(last, ModelRequest) else []
        returned = [part for part in parts if isinstance(part, ToolReturnPart)]
        text = latest_user_text(messages)
        self.seen.append((text, [tool.name for tool in info.function_tools]))
        self.prompts.append(repr(messages))
        if returned:
            yield f"Done: {json.dumps(returned[-1].content, default=str)}"
            return
        if any(isinstance(part, RetryPromptPart) for part in parts):
            yield "That is not available here."
            return
        if text.startswith("handoff"):
            yield {0: DeltaToolCall(name="handoff_to_human", json_args='{"reason": "asked for a person"}')}
            return
        if text.startswith("call "):
            yield {0: DeltaToolCall(name=text.split()[1], json_args="{}")}
            return
        yield f"Re: {text}"


def latest_user_text(messages: list[ModelMessage]) -> str:
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                    return part.content
    return ""


def support_agent(*extra: Tool) -> Agent[InboxTurn]:
    """The bot: it may hand the conversation to a human, plus whatever tools a test adds."""
    return define_agent(
        name="support",
        instructions="You answer a company's support conversations.",
        tools=lambda turn: [handoff_to_human(turn), *extra],
        max_steps=4,
    )
