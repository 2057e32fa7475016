"""Define an agent once, run it one turn at a time: `define_agent`, `Agent`, `AgentSession`.

A session is one turn for one trusted context. It builds the turn's tools (with the permission map
and the skill loader), prepares the canonical UI history for the model, and hands the turn to the
loop (`bastion._loop`). The context reaches tool factories and message hooks only; it is never
serialized into instructions, messages or tool descriptions.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from pydantic_ai.models import KnownModelName, Model
from pydantic_ai.settings import ModelSettings

from bastion._cancel import AgentCancelledError
from bastion._extras import infer_model
from bastion._loop import AgentStreamResult
from bastion._turn_plan import ExecuteToolHook, ModelSteps, TurnPlan
from bastion._ui_chunks import UIMessage
from bastion._ui_messages import to_model_messages
from bastion.policies import (
    ToolPolicy,
    sanitize_tool_error_for_model,
    sanitize_tool_output_for_model,
    tool_part_name,
    with_tool_policy,
)
from bastion.skills import Skill, SkillCatalog, create_skill_catalog
from bastion.tools import Tool, compose_tools, index_tools

__all__ = [
    "Agent",
    "AgentSession",
    "AgentSessionClosedError",
    "AgentTools",
    "define_agent",
]

ContextT = TypeVar("ContextT")

logger = logging.getLogger("bastion.agent")

DEFAULT_MAX_STEPS = 8
DEFAULT_TOOL_RETRIES = 2


@dataclass(frozen=True)
class AgentTools:
    """The tools a factory built for one turn, and how to release what it opened for them.

    `instructions` are added to the turn's instructions after the static ones and the skill catalog,
    for tool sources that bring their own guidance (an MCP server's, when its definition asks).
    """

    tools: Sequence[Tool] = ()
    close: Callable[[], Awaitable[None]] | None = None
    instructions: str | None = None


ToolFactoryResult: TypeAlias = AgentTools | Sequence[Tool]
ToolFactory: TypeAlias = Callable[[ContextT], ToolFactoryResult | Awaitable[ToolFactoryResult]]
MessageHook: TypeAlias = Callable[
    [list[UIMessage], ContextT], Sequence[UIMessage] | Awaitable[Sequence[UIMessage]]
]


class AgentSessionClosedError(RuntimeError):
    """A session runs one turn; after `close()` or a finished turn, prepare a new one."""

    code = "session_closed"

    def __init__(self) -> None:
        super().__init__("This agent session is closed. Prepare a new session for the next turn.")


def define_agent(
    *,
    name: str,
    instructions: str,
    tools: ToolFactory[ContextT] | None = None,
    skills: SkillCatalog | Iterable[Skill] | None = None,
    permissions: Mapping[str, ToolPolicy[ContextT]] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    tool_retries: int = DEFAULT_TOOL_RETRIES,
    prepare_messages: MessageHook[ContextT] | None = None,
    context_messages: MessageHook[ContextT] | None = None,
) -> Agent[ContextT]:
    """Define an agent: its instructions, per-turn tool factory, skills, permissions and step bound.

    `max_steps` bounds the model calls of one turn. `tool_retries` bounds how often the model may send
    invalid arguments to one tool in a turn before the turn stops.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("An agent needs a non-blank name.")
    if not isinstance(instructions, str):
        raise TypeError("Agent instructions must be a string.")
    _require_positive_int("max_steps", max_steps)
    if isinstance(tool_retries, bool) or not isinstance(tool_retries, int) or tool_retries < 0:
        raise ValueError("tool_retries must be a non-negative integer.")
    catalog = skills if isinstance(skills, SkillCatalog) or skills is None else create_skill_catalog(skills)
    return Agent(
        name=name,
        instructions=instructions,
        tool_factory=tools,
        skills=catalog,
        permissions=dict(permissions) if permissions is not None else None,
        max_steps=max_steps,
        tool_retries=tool_retries,
        prepare_messages=prepare_messages,
        context_messages=context_messages,
    )


def _require_positive_int(label: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{label} must be a positive whole number of steps, got {value!r}.")


@dataclass(frozen=True, kw_only=True)
class Agent(Generic[ContextT]):
    """An agent definition. Immutable; `prepare()` makes one session per turn."""

    name: str
    instructions: str
    tool_factory: ToolFactory[ContextT] | None
    skills: SkillCatalog | None
    permissions: dict[str, ToolPolicy[ContextT]] | None
    max_steps: int
    tool_retries: int
    prepare_messages: MessageHook[ContextT] | None
    context_messages: MessageHook[ContextT] | None

    async def prepare(
        self,
        *,
        context: ContextT,
        cancel: asyncio.Event | None = None,
        execute_tool: ExecuteToolHook | None = None,
    ) -> AgentSession[ContextT]:
        """Build this turn's tools for a trusted context. Resources are closed if anything here fails.

        If `cancel` is set while the tools are being built, the factory is cancelled (it must release
        what it opened), whatever it returned is closed, and `AgentCancelledError` is raised. If it is
        set later, the session closes its resources, whether or not it has streamed.

        `cancel` stops the turn when set. `execute_tool` receives every execution (for example
        `AgentRun.execute_tool`, so each one goes through the persistence claim).
        """
        built = AgentTools()
        try:
            built = await self._build_tools_unless_cancelled(context, cancel)
            tools = list(built.tools)
            if self.skills is not None:
                tools = compose_tools(tools, [self.skills.loader()])
            if self.permissions is not None:
                tools = with_tool_policy(tools, context=context, policies=self.permissions)
            by_name = index_tools(tools)
        except BaseException:
            await _close_quietly(built.close)
            raise
        return AgentSession(
            agent=self,
            context=context,
            tools=by_name,
            tool_instructions=built.instructions,
            close_tools=built.close,
            cancel=cancel,
            execute_tool=execute_tool,
        )

    async def _build_tools_unless_cancelled(
        self, context: ContextT, cancel: asyncio.Event | None
    ) -> AgentTools:
        """The factory's tools, unless `cancel` is set meanwhile: then whatever it returned is closed.

        A cancellation in the same step as the factory finishing still cancels: the turn was stopped,
        and the resources just opened would otherwise belong to nobody.
        """
        if cancel is None:
            return await self._build_tools(context)
        if cancel.is_set():
            raise AgentCancelledError
        building = asyncio.ensure_future(self._build_tools(context))
        waiter = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({building, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await _discard(building)
            raise
        finally:
            waiter.cancel()
        if cancel.is_set():
            await _discard(building)
            raise AgentCancelledError
        return building.result()

    async def _build_tools(self, context: ContextT) -> AgentTools:
        if self.tool_factory is None:
            return AgentTools()
        produced = self.tool_factory(context)
        if inspect.isawaitable(produced):
            produced = await produced
        if isinstance(produced, AgentTools):
            return produced
        return AgentTools(tools=tuple(produced))


async def _discard(building: asyncio.Future[AgentTools]) -> None:
    """Stop a factory that is no longer wanted and close what it returned, if it returned anything."""
    building.cancel()
    await asyncio.gather(building, return_exceptions=True)
    if not building.cancelled() and building.exception() is None:
        await _close_quietly(building.result().close)


async def _close_quietly(close: Callable[[], Awaitable[None]] | None) -> None:
    if close is None:
        return
    try:
        await close()
    except Exception:
        logger.warning("Closing tool resources failed.", exc_info=True)


class AgentSession(Generic[ContextT]):
    """One turn of an agent for one trusted context."""

    def __init__(
        self,
        *,
        agent: Agent[ContextT],
        context: ContextT,
        tools: dict[str, Tool],
        tool_instructions: str | None,
        close_tools: Callable[[], Awaitable[None]] | None,
        cancel: asyncio.Event | None,
        execute_tool: ExecuteToolHook | None,
    ) -> None:
        self._agent = agent
        self._context = context
        self._tools = tools
        self._tool_instructions = tool_instructions
        self._close_tools = close_tools
        self._cancel = cancel
        self._execute_tool = execute_tool
        self._closed = False
        self._streamed = False
        self._closing: asyncio.Task[None] | None = None
        self._watcher = asyncio.ensure_future(self._close_on(cancel)) if cancel is not None else None

    async def _close_on(self, cancel: asyncio.Event) -> None:
        """A cancelled turn releases its resources even if it never streams (or the stream is never read).

        The session stays usable for `stream()`, which then reports the turn as cancelled at once.
        """
        await cancel.wait()
        await self._close_resources()

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools the model is offered in this turn."""
        return list(self._tools)

    async def stream(
        self,
        *,
        model: Model | KnownModelName | str,
        messages: Sequence[Mapping[str, Any]],
        model_settings: ModelSettings | None = None,
        steps: ModelSteps | None = None,
    ) -> AgentStreamResult:
        """Prepare the canonical UI history and return the turn's stream; the model runs as it is read.

        `steps` runs each model request as a durable step (a durable turn passes it). A failure
        while preparing the history closes the session's resources and propagates.
        """
        if self._closed or self._streamed:
            raise AgentSessionClosedError()
        self._streamed = True
        try:
            resolved_model = infer_model(model) if isinstance(model, str) else model
            plan = await self._plan(messages)
        except BaseException:
            await self.close()
            raise
        return AgentStreamResult(
            plan=plan,
            model=resolved_model,
            model_settings=model_settings,
            cancel=self._cancel,
            on_cancel=self.close,
            steps=steps,
        )

    async def _plan(self, messages: Sequence[Mapping[str, Any]]) -> TurnPlan:
        agent = self._agent
        history = [copy.deepcopy(dict(message)) for message in messages]
        pending = _answered_approvals(history)
        history = await self._sanitize_history(history, exclude=frozenset(pending))
        if agent.prepare_messages is not None:
            history = list(await _call_hook(agent.prepare_messages, history, self._context))
        if agent.context_messages is not None:
            extra = list(await _call_hook(agent.context_messages, list(history), self._context))
            history = _insert_before_latest_user_message(history, extra)
        converted = to_model_messages(
            history, convert_output=self._historical_output, awaiting_call_ids=frozenset(pending)
        )
        return TurnPlan(
            history=converted,
            approvals=list(pending.values()),
            approvals_outstanding=_approvals_outstanding(history),
            tools=self._tools,
            instructions=agent.instructions,
            skill_instructions=agent.skills.instructions if agent.skills is not None else None,
            tool_instructions=self._tool_instructions,
            max_steps=agent.max_steps,
            tool_retries=agent.tool_retries,
            execute_tool=self._execute_tool,
        )

    async def _sanitize_history(
        self, history: list[UIMessage], *, exclude: frozenset[str]
    ) -> list[UIMessage]:
        """Apply today's permissions to stored tool results before the model sees them."""
        policies = self._agent.permissions
        if policies is None:
            return history
        for message in history:
            if message.get("role") != "assistant":
                continue
            parts = message.get("parts") or []
            for index, part in enumerate(parts):
                if tool_part_name(part) is None or part.get("toolCallId") in exclude:
                    continue
                if part.get("state") == "output-error":
                    parts[index] = await sanitize_tool_error_for_model(
                        part, context=self._context, policies=policies
                    )
                else:
                    parts[index] = await sanitize_tool_output_for_model(
                        part, context=self._context, policies=policies
                    )
        return history

    def _historical_output(self, tool_name: str, output: Any) -> Any:
        """The tool's own conversion for a stored result, when the tool still exists."""
        item = self._tools.get(tool_name)
        if item is None or item.to_model_output is None:
            return output
        try:
            return item.to_model_output(output)
        except Exception:
            logger.warning("Converting a stored result of %s failed.", tool_name, exc_info=True)
            return "Tool execution failed."

    async def close(self) -> None:
        """Release the turn's tool resources, exactly once however often it is called."""
        self._closed = True
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
        await self._close_resources()

    async def _close_resources(self) -> None:
        if self._closing is None:
            self._closing = asyncio.ensure_future(_close_quietly(self._close_tools))
        await asyncio.shield(self._closing)


async def _call_hook(
    hook: MessageHook[ContextT], history: list[UIMessage], context: ContextT
) -> Sequence[UIMessage]:
    result = hook(history, context)
    if inspect.isawaitable(result):
        result = await result
    if not isinstance(result, Sequence) or isinstance(result, str | bytes):
        raise TypeError("A message hook must return a list of UI messages.")
    return result


def _insert_before_latest_user_message(history: list[UIMessage], extra: list[UIMessage]) -> list[UIMessage]:
    """Context goes just before the user's latest message, so that message stays the last word."""
    for index in range(len(history) - 1, -1, -1):
        if history[index].get("role") == "user":
            return [*history[:index], *extra, *history[index:]]
    return [*history, *extra]


def _latest_assistant_tool_parts(history: list[UIMessage], state: str) -> list[dict[str, Any]]:
    if not history or history[-1].get("role") != "assistant":
        return []
    return [
        part
        for part in history[-1].get("parts") or []
        if part.get("state") == state and tool_part_name(part) is not None
    ]


def _answered_approvals(history: list[UIMessage]) -> dict[str, dict[str, Any]]:
    """Tool parts answered by the user in the latest assistant message, by call id."""
    return {
        str(part["toolCallId"]): part for part in _latest_assistant_tool_parts(history, "approval-responded")
    }


def _approvals_outstanding(history: list[UIMessage]) -> bool:
    """Whether the latest assistant message still waits for an answer; then the model is not called."""
    return bool(_latest_assistant_tool_parts(history, "approval-requested"))
