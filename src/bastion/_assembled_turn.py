"""One agent turn run to its end without a client: prepared, streamed, assembled into one message.

`run_agent` (`bastion.chat.headless_turn`) and the inbox's reply job (`bastion.inbox.turns`) run a
turn with nobody reading its stream; both assemble its chunks into the reply exactly as the AI SDK
client would (`UIMessageAssembler`), here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai.models import KnownModelName, Model
from pydantic_ai.settings import ModelSettings

from bastion._loop import AgentStreamResult
from bastion._turn_plan import ExecuteToolHook
from bastion._ui_assembly import UIMessageAssembler, to_client_json
from bastion.agent import Agent

__all__ = ["stream_into"]


async def stream_into(
    assembler: UIMessageAssembler,
    agent: Agent[Any],
    *,
    context: Any,
    model: Model | KnownModelName | str,
    messages: Sequence[dict[str, Any]],
    execute_tool: ExecuteToolHook | None = None,
    model_settings: ModelSettings | None = None,
) -> AgentStreamResult:
    """Prepare `agent` for `context`, stream one turn over `messages` into `assembler`, close the session;
    how the turn ended. On a failure what streamed so far stays in `assembler`, then the error is raised."""
    session = await agent.prepare(context=context, execute_tool=execute_tool)
    try:
        result = await session.stream(model=model, messages=list(messages), model_settings=model_settings)
        async for chunk in result:
            assembler.apply(to_client_json(chunk)[1])
    finally:
        await session.close()
    return result
