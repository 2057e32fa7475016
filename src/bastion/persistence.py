"""The persistence contract: how an application stores runs, and the run object the framework drives.

bastion defines no tables. An application (or a store from `bastion.stores`) implements
`AgentPersistence` and the framework calls it at three points of a turn:

- `start_run`: authorize the caller, claim the turn, reconcile the browser's messages with
  `reconcile_agent_messages` and return the canonical history, atomically (one transaction).
- `execute_tool`: persist an operation claim before running a tool's side effect, so it runs at most
  once; a completed operation returns its stored result without running again. An operation is
  named by its key (`ToolOperation.key`), never by the provider's call id alone: providers reuse
  ids (`call_0` in every response), so the key is the run's scope with the step and position of
  the call, or, for a call resumed after an approval, the approval's id.
- `finish_run`: save the response and status and release the claim, fenced against newer runs and
  idempotent.

`start_agent_run` wraps these in an `AgentRun`, which enforces the ordering rules: no tool runs
without the execution callback or after finishing has begun, and concurrent finishes share one save.
"""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Generic, Literal, TypeAlias, TypeVar, get_args

from bastion._telemetry import span
from bastion.errors import BastionError
from bastion.tools import CallOrigin, operation_key

__all__ = [
    "AgentPersistence",
    "AgentRun",
    "AgentRunInactiveError",
    "RunInput",
    "RunOutcome",
    "RunStart",
    "RunStatus",
    "ToolExecutionNotConfiguredError",
    "ToolOperation",
    "start_agent_run",
]

Context = TypeVar("Context")
State = TypeVar("State")

RunStatus: TypeAlias = Literal["completed", "failed", "cancelled"]
_STATUSES: Final = frozenset(get_args(RunStatus))


class ToolExecutionNotConfiguredError(Exception):
    """A persisted run was asked to execute a tool, but its persistence has no execution callback."""

    code: ClassVar[str] = "tool_execution_not_configured"

    def __init__(self) -> None:
        super().__init__("Tool execution persistence is not configured.")


class AgentRunInactiveError(BastionError):
    """A tool was asked to run after the run began finishing."""

    code: ClassVar[str] = "run_inactive"
    status: ClassVar[int] = 409

    def __init__(self) -> None:
        super().__init__("This agent run is no longer active.")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInput:
    """What the browser asked for: its messages (untrusted, any JSON) and the AI SDK trigger."""

    messages: Sequence[Any]
    trigger: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStart(Generic[State]):
    """A claimed turn: the canonical messages to run and the application's state for this run.

    `operation_scope` makes this run's operation keys unique: the run's id, stored with the run so
    that a replay of the run (a durable workflow recovering it) derives the same keys. Without one,
    each `AgentRun` takes a random scope.
    """

    messages: list[dict[str, Any]]
    state: State
    operation_scope: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """How a run ended: its status and the assembled assistant UI message, if there is one."""

    status: RunStatus
    response_message: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOperation:
    """One tool call to run at most once. `execute` performs the side effect; the callback decides.

    `key` names the operation (claim it under the key, not under `tool_call_id`, which the provider
    may reuse); `idempotent` says the tool declared that running it again under the same key is
    harmless, so an operation whose outcome is uncertain may run again instead of being refused.
    """

    name: str
    tool_call_id: str
    input: Any
    execute: Callable[[], Awaitable[Any]]
    key: str
    idempotent: bool = False


class AgentPersistence(ABC, Generic[Context, State]):
    """Application-owned storage of runs. Context and state are the application's; never sent to a model."""

    @abstractmethod
    async def start_run(self, context: Context, input: RunInput) -> RunStart[State]:
        """Authorize, claim the turn and reconcile the messages in one transaction; raise to refuse."""

    @abstractmethod
    async def finish_run(self, context: Context, state: State, outcome: RunOutcome) -> None:
        """Save the outcome and release the claim together, fenced against newer runs; idempotent."""

    async def execute_tool(self, context: Context, state: State, operation: ToolOperation) -> Any:
        """Claim `operation.key` durably, then call `operation.execute()`, or return the stored result.

        Validate a stored operation's tool name and input, and refuse a retry whose outcome is
        uncertain unless the operation is idempotent (then claim it again and run it). Not
        overriding this refuses every tool execution: the framework never runs an unclaimed
        operation.
        """
        raise ToolExecutionNotConfiguredError()


class AgentRun(Generic[Context, State]):
    """One claimed turn. Created by `start_agent_run`; drives the persistence callbacks in order."""

    def __init__(
        self, *, persistence: AgentPersistence[Context, State], context: Context, start: RunStart[State]
    ) -> None:
        self._persistence = persistence
        self._context = context
        self.messages: Final = start.messages
        self.state: Final = start.state
        self.operation_scope: Final = start.operation_scope or uuid.uuid4().hex
        self._finishing_began = False
        self._saved = False
        self._save_failed = False
        self._saving: asyncio.Future[None] | None = None

    async def execute_tool(
        self,
        *,
        name: str,
        tool_call_id: str,
        input: Any,
        execute: Callable[[str], Awaitable[Any]],
        origin: CallOrigin | None = None,
        idempotent: bool = False,
    ) -> Any:
        """Run a tool's side effect through the application's execution callback, never around it.

        The operation's key comes from this run's scope and the call's `origin`; `execute` is given
        it, so the tool can key its side effect by it.
        """
        if self._finishing_began:
            raise AgentRunInactiveError()
        key = operation_key(self.operation_scope, tool_call_id, origin)
        operation = ToolOperation(
            name=name,
            tool_call_id=tool_call_id,
            input=input,
            execute=lambda: execute(key),
            key=key,
            idempotent=idempotent,
        )
        with span("bastion.store.execute_tool", {"bastion.tool.name": name}):
            return await self._persistence.execute_tool(self._context, self.state, operation)

    async def finish(self, *, response_message: dict[str, Any] | None = None, status: RunStatus) -> None:
        """Save the outcome once.

        Calls while a save is in flight wait for that save (and share its error); after a successful
        save, calls do nothing. After a failed save, a later call saves again, always as `failed`:
        the response the first save carried was not stored. The save runs as its own task, so a
        cancelled caller does not abort a save that others are waiting for.
        """
        if status not in _STATUSES:
            raise ValueError(f"Unknown run status: {status!r}")
        if self._saving is None and not self._saved:
            outcome = RunOutcome(
                status="failed" if self._save_failed else status, response_message=response_message
            )
            self._finishing_began = True
            self._saving = asyncio.create_task(self._save(outcome))
        if self._saving is not None:
            await asyncio.shield(self._saving)

    async def _save(self, outcome: RunOutcome) -> None:
        try:
            with span("bastion.store.finish_run", {"bastion.run.status": outcome.status}):
                await self._persistence.finish_run(self._context, self.state, outcome)
        except BaseException:
            self._save_failed = True
            raise
        else:
            self._saved = True
        finally:
            self._saving = None


async def start_agent_run(
    *,
    persistence: AgentPersistence[Context, State],
    context: Context,
    messages: Sequence[Any],
    trigger: str,
) -> AgentRun[Context, State]:
    """Claim a turn through `persistence.start_run`; its errors propagate and nothing else runs."""
    with span("bastion.store.start_run", {"bastion.run.trigger": str(trigger)}):
        start = await persistence.start_run(context, RunInput(messages=messages, trigger=trigger))
    return AgentRun(persistence=persistence, context=context, start=start)


async def start_new_conversation_run(
    *,
    persistence: AgentPersistence[Context, State],
    context: Context,
    messages: Sequence[Any],
    trigger: str,
    title: str | None,
    agent_name: str | None,
) -> AgentRun[Context, State] | None:
    """Create the conversation `messages` start and claim its turn at once, where `persistence` can
    (a `start_new_conversation_run` method: Postgres does both in one round trip). None when it
    cannot or the conversation's id is taken: nothing is written, and the caller creates and claims
    the usual way."""
    start_new = getattr(persistence, "start_new_conversation_run", None)
    if start_new is None:
        return None
    with span("bastion.store.start_run", {"bastion.run.trigger": str(trigger)}):
        start = await start_new(
            context, RunInput(messages=messages, trigger=trigger), title=title, agent_name=agent_name
        )
    if start is None:
        return None
    return AgentRun(persistence=persistence, context=context, start=start)
