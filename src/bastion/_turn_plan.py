"""What a turn of the agent loop is given: its plan, and the hooks its caller may put around it.

`ExecuteToolHook` is where every tool execution passes (`AgentRun.execute_tool` claims each exactly
once), `ModelSteps` runs each model request as a durable step, and `TurnPlan` is everything the
session prepared before the model is called.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic_ai.messages import ModelResponse

from bastion._ui_chunks import Chunk
from bastion._ui_messages import ConvertedHistory
from bastion.tools import CallOrigin, Tool

__all__ = ["ExecuteToolHook", "ModelSteps", "TurnPlan"]


class ExecuteToolHook(Protocol):
    """Where every execution passes, e.g. `AgentRun.execute_tool` for exactly-once claims.

    The hook decides the call's operation key from its `origin` and runs the side effect with
    `execute(key)`, or returns the stored result of that operation without running it.
    """

    def __call__(
        self,
        *,
        name: str,
        tool_call_id: str,
        input: Any,
        execute: Callable[[str], Awaitable[Any]],
        origin: CallOrigin,
        idempotent: bool,
    ) -> Awaitable[Any]: ...


class ModelSteps(Protocol):
    """Runs each model request of a turn as a durable step (`bastion.chat.durable_turns`).

    `request(step, produce, response)` yields the request's chunks: live from `produce()` when the
    step runs (which leaves the `ModelResponse` in `response`), or as recorded when a completed step
    is replayed (then it puts the recorded response there itself). `id_seed` makes the ids the loop
    generates (approval ids) the same in every execution of the turn.
    """

    id_seed: str

    def request(
        self,
        step: int,
        produce: Callable[[], AsyncIterator[Chunk]],
        response: list[ModelResponse],
    ) -> AsyncIterator[Chunk]: ...


@dataclass
class TurnPlan:
    """Everything one turn needs, prepared by the session before the model is called."""

    history: ConvertedHistory
    approvals: list[dict[str, Any]]
    approvals_outstanding: bool
    tools: dict[str, Tool]
    instructions: str
    skill_instructions: str | None
    tool_instructions: str | None
    max_steps: int
    tool_retries: int
    execute_tool: ExecuteToolHook | None
