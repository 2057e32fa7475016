"""One turn's life after its claim, the same for every caller: prepare, stream, finish, settle.

`TurnLifecycle` takes a claimed run (or none: the inbox's bot turn stores nothing) and opens the turn:
the agent's context, its prepared session and its stream. Whoever reads the stream then finishes the
run with the reply and settles the turn once: the run's status saved, what the turn held released,
its session closed. A failure before the stream settles the run as failed, with no reply.

- The chat route (`bastion.chat.endpoint`) streams the opened turn over HTTP and finishes and settles
  it from the stream response's callbacks; a durable take-over (`bastion.chat.durable_turns`) goes
  through the route's `open_turn` and reads the same response without a client.
- `run_agent` (`bastion.chat.headless_turn`) and the inbox's reply job (`bastion.inbox.bot_turn`) `collect`
  it into one message, as the AI SDK client would assemble it.

The claim before it is each caller's (a chat request, a new conversation, an adopted run, none).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_ai.models import KnownModelName, Model
from pydantic_ai.settings import ModelSettings

from bastion._ui_assembly import UIMessageAssembler, to_client_json
from bastion._ui_chunks import UIMessage
from bastion.agent import Agent, AgentSession
from bastion.persistence import AgentRun, RunStatus

if TYPE_CHECKING:
    from bastion._loop import AgentStreamResult
    from bastion._turn_plan import ExecuteToolHook, ModelSteps

__all__ = ["CollectedReply", "TurnLifecycle", "message_text"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectedReply:
    """A turn read to its end without a client: how it ended and the reply as the client would hold it."""

    status: RunStatus
    message: UIMessage
    finish_reason: str | None


def message_text(message: UIMessage) -> str:
    """A UI message's text parts, joined."""
    return "".join(part.get("text", "") for part in message.get("parts", []) if part.get("type") == "text")


class TurnLifecycle:
    """One claimed turn from its open to its settlement. `run` is None for a turn that stores nothing;
    `release` frees what the caller holds for the turn (a drain's hold, a stop signal) when it settles."""

    def __init__(
        self, run: AgentRun[Any, Any] | None, *, release: Callable[[], object] | None = None
    ) -> None:
        self.run = run
        self._release = release
        self.context: Any = None
        self.session: AgentSession[Any] | None = None
        self._settled = False

    async def open(
        self,
        agent: Agent[Any],
        *,
        context: Callable[[], Awaitable[Any]],
        model: Model | KnownModelName | str,
        messages: Sequence[dict[str, Any]],
        cancel: asyncio.Event | None = None,
        execute_tool: ExecuteToolHook | None = None,
        steps: ModelSteps | None = None,
        model_settings: ModelSettings | None = None,
    ) -> AgentStreamResult:
        """Build the turn's context (`context()`), prepare `agent` for it and open the turn's stream over
        `messages`; the model runs as the stream is read. A failure here settles the turn as failed."""
        try:
            self.context = await context()
            self.session = await agent.prepare(context=self.context, cancel=cancel, execute_tool=execute_tool)
            return await self.session.stream(
                model=model, messages=messages, model_settings=model_settings, steps=steps
            )
        except BaseException:
            await self.settle(status="failed")
            raise

    async def finish(self, *, response_message: dict[str, Any] | None = None, status: RunStatus) -> None:
        """Save the turn's outcome (once: `AgentRun.finish`)."""
        if self.run is not None:
            await self.run.finish(response_message=response_message, status=status)

    async def settle(self, *, status: RunStatus, response_message: dict[str, Any] | None = None) -> None:
        """Finish the run (nothing more when it is saved already), then release what the turn held and
        close its session, whatever the save did. Only the first call does anything."""
        if self._settled:
            return
        self._settled = True
        try:
            await self.finish(response_message=response_message, status=status)
        finally:
            if self._release is not None:
                self._release()
            if self.session is not None:
                await self.session.close()

    async def collect(self, result: AgentStreamResult) -> CollectedReply:
        """Read the opened stream to its end, assembling the reply as the AI SDK client would, and settle
        the turn with it. A failure saves what streamed so far as failed, then is raised."""
        assembler = UIMessageAssembler({"id": secrets.token_hex(8), "role": "assistant", "parts": []})
        try:
            async for chunk in result:
                assembler.apply(to_client_json(chunk)[1])
        except BaseException:
            partial = assembler.assembled_message()
            await self.settle(status="failed", response_message=partial if partial["parts"] else None)
            raise
        status: RunStatus = "cancelled" if result.cancelled else "completed"
        reply = assembler.assembled_message()
        await self.settle(status=status, response_message=reply)
        return CollectedReply(status=status, message=reply, finish_reason=result.finish_reason)
