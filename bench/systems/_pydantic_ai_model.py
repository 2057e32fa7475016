"""The script as a pydantic-ai `FunctionModel`, shared by bastion and the pydantic-ai adapter."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bench.script import TOOL_ARGS, TOOL_NAME, requested_words, tool_call_id, word


async def _script(
    messages: list[ModelMessage], info: AgentInfo, *, tool_name: str = TOOL_NAME, tool_args: Any = None
) -> AsyncIterator[str | DeltaToolCalls]:
    prompts = [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart) and isinstance(part.content, str)
    ]
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(part, ToolReturnPart) for part in last.parts):
        for index in range(requested_words(prompts[-1])):
            yield word(index)
        return
    arguments = json.dumps(TOOL_ARGS if tool_args is None else tool_args)
    call = DeltaToolCall(name=tool_name, json_args=arguments, tool_call_id=tool_call_id(len(prompts)))
    yield {0: call}


def scripted_model(*, tool_name: str = TOOL_NAME, tool_args: dict[str, Any] | None = None) -> FunctionModel:
    """The script; `tool_name` and `tool_args` name another tool for an agent that has no `lookup`."""
    if tool_name == TOOL_NAME and tool_args is None:
        return FunctionModel(stream_function=_script)

    async def script(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        async for item in _script(messages, info, tool_name=tool_name, tool_args=tool_args):
            yield item

    return FunctionModel(stream_function=script)
