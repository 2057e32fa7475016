"""The script as a pydantic-ai `FunctionModel`, shared by bastion and the pydantic-ai adapter."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from bench.script import TOOL_ARGS, TOOL_NAME, requested_words, tool_call_id, word


async def _script(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
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
    call = DeltaToolCall(
        name=TOOL_NAME, json_args=json.dumps(TOOL_ARGS), tool_call_id=tool_call_id(len(prompts))
    )
    yield {0: call}


def scripted_model() -> FunctionModel:
    return FunctionModel(stream_function=_script)
