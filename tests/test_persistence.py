"""start_agent_run and AgentRun: the order in which a run's persistence callbacks may run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from bastion.persistence import (
    AgentPersistence,
    AgentRun,
    AgentRunInactiveError,
    RunInput,
    RunOutcome,
    RunStart,
    ToolExecutionNotConfiguredError,
    ToolOperation,
    start_agent_run,
)
from bastion.tools import CallOrigin, operation_key

INCOMING = [{"id": "u2", "role": "user", "parts": [{"type": "text", "text": "New"}]}]
CANONICAL = [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Stored"}]}, *INCOMING]
RESPONSE = {"id": "a2", "role": "assistant", "parts": [{"type": "text", "text": "Answer", "state": "done"}]}


@dataclass(frozen=True)
class Caller:
    user_id: str


@dataclass(frozen=True)
class Claim:
    revision: int


CONTEXT = Caller("user-1")
STATE = Claim(7)


@dataclass
class RecordingStore(AgentPersistence[Caller, Claim]):
    """A store that records its calls; `save_gate` holds finish_run open, `save_errors` fail saves."""

    start_error: Exception | None = None
    start_result: RunStart[Claim] | None = None
    save_gate: asyncio.Event | None = None
    save_errors: list[BaseException] = field(default_factory=list)
    starts: list[tuple[Caller, RunInput]] = field(default_factory=list)
    saves: list[RunOutcome] = field(default_factory=list)
    save_began: asyncio.Event = field(default_factory=asyncio.Event)

    async def start_run(self, context: Caller, input: RunInput) -> RunStart[Claim]:
        self.starts.append((context, input))
        if self.start_error is not None:
            raise self.start_error
        return self.start_result or RunStart(messages=CANONICAL, state=STATE)

    async def finish_run(self, context: Caller, state: Claim, outcome: RunOutcome) -> None:
        assert (context, state) == (CONTEXT, STATE)
        self.saves.append(outcome)
        self.save_began.set()
        if self.save_gate is not None:
            await self.save_gate.wait()
        if self.save_errors:
            raise self.save_errors.pop(0)


@dataclass
class ExecutingStore(RecordingStore):
    """A store with an execution callback that returns a stored result for known call ids."""

    stored_results: dict[str, Any] = field(default_factory=dict)
    operations: list[ToolOperation] = field(default_factory=list)

    async def execute_tool(self, context: Caller, state: Claim, operation: ToolOperation) -> Any:
        self.operations.append(operation)
        if operation.tool_call_id in self.stored_results:
            return self.stored_results[operation.tool_call_id]
        return await operation.execute()


class SideEffect:
    """A tool's side effect that counts how often it ran, and under which operation keys."""

    def __init__(self) -> None:
        self.runs = 0
        self.keys: list[str] = []

    async def __call__(self, key: str) -> str:
        self.runs += 1
        self.keys.append(key)
        return "fresh result"


async def start(store: RecordingStore) -> AgentRun[Caller, Claim]:
    return await start_agent_run(
        persistence=store, context=CONTEXT, messages=INCOMING, trigger="submit-message"
    )


async def run_tool(run: AgentRun[Caller, Claim], effect: SideEffect, call_id: str = "call-1") -> Any:
    return await run.execute_tool(
        name="change_plan", tool_call_id=call_id, input={"plan": "pro"}, execute=effect
    )


# --- starting -----------------------------------------------------------------------------------------


async def test_start_passes_context_messages_and_trigger_to_the_store() -> None:
    store = RecordingStore()
    await start(store)
    assert store.starts == [(CONTEXT, RunInput(messages=INCOMING, trigger="submit-message"))]
    assert store.starts[0][0] is CONTEXT


async def test_run_exposes_the_canonical_messages_and_state() -> None:
    run = await start(RecordingStore())
    assert run.messages is CANONICAL
    assert run.state is STATE


async def test_failed_start_propagates_and_nothing_else_runs() -> None:
    refusal = PermissionError("not your conversation")
    store = ExecutingStore(start_error=refusal)
    with pytest.raises(PermissionError) as caught:
        await start(store)
    assert caught.value is refusal
    assert store.saves == []
    assert store.operations == []


# --- executing tools ----------------------------------------------------------------------------------


async def test_tool_execution_goes_through_the_store_callback() -> None:
    store = ExecutingStore()
    run = await start(store)
    effect = SideEffect()
    assert await run_tool(run, effect) == "fresh result"
    [operation] = store.operations
    assert (operation.name, operation.tool_call_id, operation.input) == (
        "change_plan",
        "call-1",
        {"plan": "pro"},
    )
    assert operation.key == f"{run.operation_scope}/call/call-1"
    assert operation.idempotent is False
    assert effect.runs == 1
    assert effect.keys == [operation.key]


async def test_operation_keys_name_the_run_step_and_position_or_the_approval_never_the_id_alone() -> None:
    store = ExecutingStore()
    run = await start(store)
    other_run = await start(store)
    effect = SideEffect()
    sites = [
        CallOrigin(step=0, index=0),
        CallOrigin(step=1, index=0),
        CallOrigin(step=1, index=1),
        CallOrigin(approval_id="approval-1"),
    ]
    for origin in sites:
        await run.execute_tool(
            name="change_plan",
            tool_call_id="call_0",
            input={},
            execute=effect,
            origin=origin,
            idempotent=True,
        )
    await other_run.execute_tool(
        name="change_plan", tool_call_id="call_0", input={}, execute=effect, origin=sites[0]
    )
    await other_run.execute_tool(
        name="change_plan", tool_call_id="call_0", input={}, execute=effect, origin=sites[3]
    )
    keys = [operation.key for operation in store.operations]
    assert keys[:3] == [f"{run.operation_scope}/{where}/call_0" for where in ("0.0", "1.0", "1.1")]
    assert keys[3] == keys[5] == "approval/approval-1"
    assert keys[4] == f"{other_run.operation_scope}/0.0/call_0" != keys[0]
    assert [operation.idempotent for operation in store.operations] == [True] * 4 + [False] * 2
    assert effect.keys == keys


async def test_a_run_takes_its_operation_scope_from_the_store_so_a_replay_derives_the_same_keys() -> None:
    store = ExecutingStore()
    store.start_result = RunStart(messages=CANONICAL, state=STATE, operation_scope="run-7")
    first, replayed = await start(store), await start(store)
    assert first.operation_scope == replayed.operation_scope == "run-7"
    without = ExecutingStore()
    assert (await start(without)).operation_scope != (await start(without)).operation_scope


def test_a_long_provider_id_or_approval_id_gives_a_bounded_key() -> None:
    long_id = "x" * 500
    step_key = operation_key("run-1", long_id, CallOrigin(step=3, index=2))
    approval_key = operation_key("run-1", "call_0", CallOrigin(approval_id=long_id))
    assert len(step_key) <= 200 and len(approval_key) <= 200
    assert step_key == operation_key("run-1", long_id, CallOrigin(step=3, index=2))
    assert step_key != operation_key("run-1", long_id[:-1] + "y", CallOrigin(step=3, index=2))


async def test_store_may_return_a_stored_result_without_running_the_side_effect() -> None:
    store = ExecutingStore(stored_results={"call-1": "stored result"})
    run = await start(store)
    effect = SideEffect()
    assert await run_tool(run, effect) == "stored result"
    assert effect.runs == 0


async def test_store_execution_error_propagates() -> None:
    class RefusingStore(RecordingStore):
        async def execute_tool(self, context: Caller, state: Claim, operation: ToolOperation) -> Any:
            raise LookupError("operation in flight")

    run = await start(RefusingStore())
    with pytest.raises(LookupError):
        await run_tool(run, SideEffect())


async def test_tool_execution_without_the_callback_is_refused() -> None:
    run = await start(RecordingStore())
    effect = SideEffect()
    with pytest.raises(ToolExecutionNotConfiguredError) as caught:
        await run_tool(run, effect)
    assert caught.value.code == "tool_execution_not_configured"
    assert str(caught.value) == "Tool execution persistence is not configured."
    assert effect.runs == 0


async def test_tool_execution_is_refused_while_finishing() -> None:
    store = ExecutingStore(save_gate=asyncio.Event())
    run = await start(store)
    finishing = asyncio.create_task(run.finish(status="completed"))
    await store.save_began.wait()
    effect = SideEffect()
    with pytest.raises(AgentRunInactiveError):
        await run_tool(run, effect)
    store.save_gate.set()  # type: ignore[union-attr]
    await finishing
    assert store.operations == []
    assert effect.runs == 0


async def test_tool_execution_is_refused_after_finishing() -> None:
    store = ExecutingStore()
    run = await start(store)
    await run.finish(status="completed")
    with pytest.raises(AgentRunInactiveError) as caught:
        await run_tool(run, SideEffect())
    assert caught.value.code == "run_inactive"
    assert str(caught.value) == "This agent run is no longer active."
    assert store.operations == []


async def test_tool_execution_is_refused_after_a_failed_save() -> None:
    store = ExecutingStore(save_errors=[ConnectionError("database down")])
    run = await start(store)
    with pytest.raises(ConnectionError):
        await run.finish(status="completed")
    with pytest.raises(AgentRunInactiveError):
        await run_tool(run, SideEffect())
    assert store.operations == []


async def test_inactive_check_comes_before_the_missing_callback() -> None:
    run = await start(RecordingStore())
    await run.finish(status="cancelled")
    with pytest.raises(AgentRunInactiveError):
        await run_tool(run, SideEffect())


# --- finishing ----------------------------------------------------------------------------------------


async def test_finish_saves_the_response_and_status() -> None:
    store = RecordingStore()
    run = await start(store)
    await run.finish(response_message=RESPONSE, status="completed")
    assert store.saves == [RunOutcome(status="completed", response_message=RESPONSE)]


async def test_finish_without_a_response_saves_none() -> None:
    store = RecordingStore()
    run = await start(store)
    await run.finish(status="cancelled")
    assert store.saves == [RunOutcome(status="cancelled", response_message=None)]


async def test_concurrent_finishes_share_the_first_save() -> None:
    store = RecordingStore(save_gate=asyncio.Event())
    run = await start(store)
    first = asyncio.create_task(run.finish(response_message=RESPONSE, status="completed"))
    await store.save_began.wait()
    others = asyncio.gather(run.finish(status="failed"), run.finish(status="cancelled"))
    store.save_gate.set()  # type: ignore[union-attr]
    await asyncio.gather(first, others)
    assert store.saves == [RunOutcome(status="completed", response_message=RESPONSE)]


async def test_finishes_started_together_make_one_save() -> None:
    store = RecordingStore()
    run = await start(store)
    await asyncio.gather(*(run.finish(status="completed") for _ in range(5)))
    assert len(store.saves) == 1


async def test_concurrent_finishes_all_see_the_failed_save() -> None:
    store = RecordingStore(save_errors=[ConnectionError("database down")])
    run = await start(store)
    results = await asyncio.gather(
        run.finish(status="completed"), run.finish(status="completed"), return_exceptions=True
    )
    assert [type(result) for result in results] == [ConnectionError, ConnectionError]
    assert len(store.saves) == 1


async def test_finish_after_a_successful_save_does_nothing() -> None:
    store = RecordingStore()
    run = await start(store)
    await run.finish(response_message=RESPONSE, status="completed")
    await run.finish(status="failed")
    assert store.saves == [RunOutcome(status="completed", response_message=RESPONSE)]


async def test_finish_after_a_failed_save_settles_the_run_as_failed() -> None:
    store = RecordingStore(save_errors=[ConnectionError("database down")])
    run = await start(store)
    with pytest.raises(ConnectionError):
        await run.finish(response_message=RESPONSE, status="completed")
    await run.finish(status="completed")
    assert store.saves == [
        RunOutcome(status="completed", response_message=RESPONSE),
        RunOutcome(status="failed", response_message=None),
    ]


async def test_finish_after_a_settled_failure_does_nothing() -> None:
    store = RecordingStore(save_errors=[ConnectionError("database down")])
    run = await start(store)
    with pytest.raises(ConnectionError):
        await run.finish(status="completed")
    await run.finish(status="failed")
    await run.finish(status="failed")
    assert len(store.saves) == 2


async def test_cancelled_caller_does_not_abort_the_shared_save() -> None:
    store = RecordingStore(save_gate=asyncio.Event())
    run = await start(store)
    first = asyncio.create_task(run.finish(response_message=RESPONSE, status="completed"))
    await store.save_began.wait()
    second = asyncio.create_task(run.finish(status="completed"))
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    store.save_gate.set()  # type: ignore[union-attr]
    await second
    await run.finish(status="failed")
    assert store.saves == [RunOutcome(status="completed", response_message=RESPONSE)]


async def test_unknown_status_is_refused_before_finishing_begins() -> None:
    store = ExecutingStore()
    run = await start(store)
    with pytest.raises(ValueError):
        await run.finish(status="done")  # type: ignore[arg-type]
    assert store.saves == []
    assert await run_tool(run, SideEffect()) == "fresh result"
