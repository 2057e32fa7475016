"""The agent runtime end to end: define_agent, sessions, and the loop driven by a scripted model."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, NativeToolCallPart, NativeToolReturnPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.native_tools import WebSearchTool

from bastion import (
    AgentCancelledError,
    AgentSessionClosedError,
    AgentTools,
    CallOrigin,
    DuplicateToolNameError,
    Skill,
    Tool,
    ToolCall,
    ToolError,
    ToolPolicy,
    define_agent,
    tool,
)
from tests.scripted import Call, ScriptedModel, collect, everything_the_model_saw, text_of, types, user

SECRET = "s3cr3t-service-key"


@dataclass(frozen=True)
class Ctx:
    user_id: str
    api_key: str = SECRET


class Recorder:
    """Counts executions and closes; builds the tools a factory returns."""

    def __init__(self) -> None:
        self.executed: list[dict[str, Any]] = []
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1

    def factory(self, *extra: Tool) -> Any:
        def build(ctx: Ctx) -> AgentTools:
            @tool
            async def lookup(q: str) -> dict[str, Any]:
                """Look a word up."""
                self.executed.append({"q": q, "user": ctx.user_id})
                return {"q": q, "user": ctx.user_id, "internal": "full-detail"}

            return AgentTools(tools=[lookup, *extra], close=self.close)

        return build


def tool_returns(model: ScriptedModel, request: int) -> list[Any]:
    return [
        part
        for message in model.requests[request].messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


async def run_turn(agent: Any, model: ScriptedModel, messages: list[dict[str, Any]], **prepare: Any) -> Any:
    session = await agent.prepare(context=prepare.pop("context", Ctx("u1")), **prepare)
    result = await session.stream(model=model, messages=messages)
    chunks = await collect(result)
    return session, result, chunks


# Streaming


async def test_streams_text_deltas_as_one_text_part_per_step() -> None:
    agent = define_agent(name="a", instructions="Be brief.")
    model = ScriptedModel(["Hel", "lo ", "there"])
    _, result, chunks = await run_turn(agent, model, [user("hi")])
    assert types(chunks) == [
        "start-step",
        "text-start",
        "text-delta",
        "text-delta",
        "text-delta",
        "text-end",
        "finish-step",
    ]
    assert text_of(chunks) == "Hello there"
    assert result.finish_reason == "stop"
    assert not result.cancelled


async def test_a_tool_call_streams_its_input_runs_and_the_model_sees_the_result() -> None:
    recorder = Recorder()
    agent = define_agent(name="a", instructions="", tools=recorder.factory())
    model = ScriptedModel([Call("lookup", {"q": "bastion"}, "c1")], ["Found it."])
    _, result, chunks = await run_turn(agent, model, [user("look it up")])
    assert types(chunks) == [
        "start-step",
        "tool-input-start",
        "tool-input-delta",
        "tool-input-delta",
        "tool-input-available",
        "tool-output-available",
        "finish-step",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
    ]
    available = chunks[4]
    assert available == {
        "type": "tool-input-available",
        "toolCallId": "c1",
        "toolName": "lookup",
        "input": {"q": "bastion"},
    }
    assert chunks[5]["output"] == {"q": "bastion", "user": "u1", "internal": "full-detail"}
    assert recorder.executed == [{"q": "bastion", "user": "u1"}]
    [returned] = tool_returns(model, 1)
    assert returned.content == {"q": "bastion", "user": "u1", "internal": "full-detail"}
    assert result.finish_reason == "stop"


async def test_tool_calls_of_one_step_run_concurrently_and_keep_their_order() -> None:
    started: list[str] = []
    both_started = asyncio.Event()

    async def slow(call: ToolCall) -> str:
        started.append(call.tool_call_id)
        if len(started) == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), timeout=5)
        return call.tool_call_id

    slow_tool = Tool(name="slow", execute=slow)
    agent = define_agent(name="a", instructions="", tools=lambda ctx: [slow_tool])
    model = ScriptedModel([Call("slow", {}, "first"), Call("slow", {}, "second")], ["done"])
    _, _, chunks = await run_turn(agent, model, [user("go")])
    outputs = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert outputs == ["first", "second"]


# The context never reaches the model


async def test_the_context_never_reaches_the_model() -> None:
    recorder = Recorder()
    agent = define_agent(name="a", instructions="Help.", tools=recorder.factory())
    model = ScriptedModel([Call("lookup", {"q": "x"})], ["ok"])
    await run_turn(agent, model, [user("hi")], context=Ctx("u1"))
    seen = everything_the_model_saw(model)
    assert SECRET not in seen
    assert "Ctx(" not in seen


# max_steps


async def test_max_steps_bounds_the_model_calls() -> None:
    recorder = Recorder()
    agent = define_agent(name="a", instructions="", tools=recorder.factory(), max_steps=2)
    model = ScriptedModel(*[[Call("lookup", {"q": str(n)})] for n in range(5)])
    _, result, chunks = await run_turn(agent, model, [user("loop")])
    assert model.calls == 2
    assert types(chunks).count("start-step") == 2
    assert result.finish_reason == "tool-calls"


@pytest.mark.parametrize("value", [0, -1, 1.5, math.inf, math.nan, True, "3", None])
def test_max_steps_must_be_a_positive_whole_number(value: Any) -> None:
    with pytest.raises(ValueError, match="max_steps must be a positive whole number"):
        define_agent(name="a", instructions="", max_steps=value)


# Invalid input, unknown and hidden tools


async def test_invalid_arguments_go_back_to_the_model_and_the_executor_never_runs() -> None:
    recorder = Recorder()
    agent = define_agent(name="a", instructions="", tools=recorder.factory())
    model = ScriptedModel(
        [Call("lookup", {"q": 42}, "bad")], [Call("lookup", {"q": "fixed"}, "good")], ["done"]
    )
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-input-error"]
    assert error["toolCallId"] == "bad"
    assert error["input"] == {"q": 42}
    assert error["errorText"].startswith("Invalid input:")
    [retry] = tool_returns(model, 1)
    assert retry.outcome == "retried"
    assert retry.tool_call_id == "bad"
    assert recorder.executed == [{"q": "fixed", "user": "u1"}]


async def test_arguments_that_are_not_json_are_refused_as_a_retry() -> None:
    recorder = Recorder()
    agent = define_agent(name="a", instructions="", tools=recorder.factory())
    model = ScriptedModel([Call("lookup", '{"q": "unterminated', "bad")], ["sorry"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    assert [chunk["toolCallId"] for chunk in chunks if chunk["type"] == "tool-input-error"] == ["bad"]
    assert tool_returns(model, 1)[0].outcome == "retried"
    assert recorder.executed == []


async def test_invalid_argument_retries_are_bounded_per_tool() -> None:
    recorder = Recorder()
    agent = define_agent(name="a", instructions="", tools=recorder.factory(), tool_retries=1, max_steps=10)
    model = ScriptedModel(*[[Call("lookup", {"q": n})] for n in range(10)])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    assert model.calls == 2
    assert types(chunks).count("tool-input-error") == 2
    assert recorder.executed == []


@pytest.mark.parametrize("tool_retries", [-1, 1.5, True])
def test_tool_retries_must_be_a_non_negative_integer(tool_retries: Any) -> None:
    with pytest.raises(ValueError, match="tool_retries"):
        define_agent(name="a", instructions="", tool_retries=tool_retries)


async def test_an_unknown_tool_is_a_retry_not_an_execution() -> None:
    recorder = Recorder()
    agent = define_agent(name="a", instructions="", tools=recorder.factory())
    model = ScriptedModel([Call("drop_tables", {}, "x")], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-input-error"]
    assert error["dynamic"] is True
    [retry] = tool_returns(model, 1)
    assert retry.outcome == "retried"
    assert "Unknown tool name" in str(retry.content)


async def test_a_hidden_tool_is_not_offered_and_a_call_to_it_is_not_executed() -> None:
    recorder = Recorder()
    agent = define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(),
        permissions={"lookup": ToolPolicy(visible=lambda ctx: ctx.user_id == "admin")},
    )
    model = ScriptedModel([Call("lookup", {"q": "x"})], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    assert model.requests[0].info.function_tools == []
    assert "tool-input-error" in types(chunks)
    assert recorder.executed == []


async def test_with_a_permission_map_only_listed_tools_are_offered() -> None:
    extra = Tool(name="unlisted", execute=lambda call: "x")
    agent = define_agent(
        name="a", instructions="", tools=Recorder().factory(extra), permissions={"lookup": ToolPolicy()}
    )
    session = await agent.prepare(context=Ctx("u1"))
    assert session.tool_names == ["lookup"]


async def test_without_a_permission_map_the_provided_tools_are_kept() -> None:
    extra = Tool(name="unlisted", execute=lambda call: "x")
    agent = define_agent(name="a", instructions="", tools=Recorder().factory(extra))
    session = await agent.prepare(context=Ctx("u1"))
    assert session.tool_names == ["lookup", "unlisted"]


# Tool failures


async def test_a_tool_exception_becomes_a_generic_tool_error_and_the_turn_goes_on() -> None:
    async def explode(call: ToolCall) -> None:
        raise RuntimeError(f"database password is {SECRET}")

    agent = define_agent(name="a", instructions="", tools=lambda ctx: [Tool(name="explode", execute=explode)])
    model = ScriptedModel([Call("explode", {})], ["It failed."])
    _, result, chunks = await run_turn(agent, model, [user("hi")])
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-output-error"]
    assert error["errorText"] == "Tool execution failed."
    assert SECRET not in repr(chunks)
    assert SECRET not in everything_the_model_saw(model)
    [returned] = tool_returns(model, 1)
    assert returned.outcome == "failed"
    assert text_of(chunks) == "It failed."
    assert result.finish_reason == "stop"


async def test_a_tool_error_keeps_the_message_the_tool_chose() -> None:
    async def refuse(call: ToolCall) -> None:
        raise ToolError("The note is too long.")

    agent = define_agent(name="a", instructions="", tools=lambda ctx: [Tool(name="refuse", execute=refuse)])
    model = ScriptedModel([Call("refuse", {})], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-output-error"]
    assert error["errorText"] == "The note is too long."
    assert tool_returns(model, 1)[0].content == "The note is too long."


async def test_model_error_redacts_the_error_for_the_model_and_the_ui() -> None:
    async def refuse(call: ToolCall) -> None:
        raise ToolError("row 17 of customers.csv is invalid")

    agent = define_agent(
        name="a",
        instructions="",
        tools=lambda ctx: [Tool(name="refuse", execute=refuse)],
        permissions={"refuse": ToolPolicy(model_error=lambda text, ctx, call: "The import failed.")},
    )
    model = ScriptedModel([Call("refuse", {})], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-output-error"]
    assert error["errorText"] == "The import failed."
    assert "customers.csv" not in everything_the_model_saw(model)


async def test_an_executor_returning_an_async_iterable_reduces_to_its_last_value() -> None:
    async def progress(call: ToolCall) -> AsyncIterator[dict[str, int]]:
        for percent in (10, 50, 100):
            yield {"percent": percent}

    agent = define_agent(
        name="a", instructions="", tools=lambda ctx: [Tool(name="progress", execute=progress)]
    )
    model = ScriptedModel([Call("progress", {})], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"percent": 100}


# Execution policy and projection


@pytest.mark.parametrize(
    "can_execute",
    [
        lambda ctx, call: False,
        lambda ctx, call: 1 / 0,
        lambda ctx, call: "yes",
    ],
    ids=["false", "raises", "truthy-non-bool"],
)
async def test_a_refused_execution_never_runs_and_the_model_gets_the_denial(can_execute: Any) -> None:
    recorder = Recorder()
    agent = define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(),
        permissions={"lookup": ToolPolicy(can_execute=can_execute, denied_output={"error": "not yours"})},
    )
    model = ScriptedModel([Call("lookup", {"q": "x"})], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    assert recorder.executed == []
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"error": "not yours"}
    [returned] = tool_returns(model, 1)
    assert returned.content == {"error": "not yours"}
    assert returned.outcome == "denied"


async def test_an_async_execution_check_is_awaited() -> None:
    recorder = Recorder()

    async def only_alice(ctx: Ctx, call: ToolCall) -> bool:
        await asyncio.sleep(0)
        return ctx.user_id == "alice"

    agent = define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(),
        permissions={"lookup": ToolPolicy(can_execute=only_alice)},
    )
    await run_turn(
        agent, ScriptedModel([Call("lookup", {"q": "x"})], ["ok"]), [user("hi")], context=Ctx("bob")
    )
    assert recorder.executed == []
    await run_turn(
        agent, ScriptedModel([Call("lookup", {"q": "y"})], ["ok"]), [user("hi")], context=Ctx("alice")
    )
    assert recorder.executed == [{"q": "y", "user": "alice"}]


async def test_a_permission_revoked_while_the_tool_ran_withholds_the_result_from_the_model() -> None:
    granted = {"lookup": True}

    async def revoking(q: str) -> dict[str, str]:
        granted["lookup"] = False
        return {"q": q, "internal": "full-detail"}

    agent = define_agent(
        name="a",
        instructions="",
        tools=lambda ctx: [tool(name="lookup")(revoking)],
        permissions={
            "lookup": ToolPolicy(
                can_execute=lambda ctx, call: granted["lookup"], denied_output={"error": "revoked"}
            )
        },
    )
    model = ScriptedModel([Call("lookup", {"q": "x"})], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"q": "x", "internal": "full-detail"}
    [returned] = tool_returns(model, 1)
    assert (returned.content, returned.outcome) == ({"error": "revoked"}, "denied")
    assert "full-detail" not in everything_the_model_saw(model)


async def test_a_permission_still_held_after_the_tool_ran_gives_the_model_the_result() -> None:
    checks: list[str] = []

    def can_execute(ctx: Ctx, call: ToolCall) -> bool:
        checks.append(call.tool_call_id)
        return True

    recorder = Recorder()
    agent = define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(),
        permissions={"lookup": ToolPolicy(can_execute=can_execute)},
    )
    model = ScriptedModel([Call("lookup", {"q": "x"}, "c1")], ["ok"])
    await run_turn(agent, model, [user("hi")])
    assert checks == ["c1", "c1"]
    [returned] = tool_returns(model, 1)
    assert (returned.content["internal"], returned.outcome) == ("full-detail", "success")


class Unserializable:
    def __repr__(self) -> str:
        return "Unserializable(password=hunter2)"


def converter_failing(output: Any) -> Any:
    raise ValueError("conversion failed: password=hunter2")


@pytest.mark.parametrize(
    "fields",
    [
        {"execute": lambda call: {"rows": 1}, "to_model_output": converter_failing},
        {"execute": lambda call: Unserializable()},
    ],
    ids=["converter-raises", "output-not-json"],
)
async def test_a_failed_output_conversion_is_a_generic_tool_error_that_reveals_nothing(
    fields: dict[str, Any],
) -> None:
    agent = define_agent(name="a", instructions="", tools=lambda ctx: [Tool(name="rows", **fields)])
    model = ScriptedModel([Call("rows", {}, "c1")], ["It failed."])
    _, result, chunks = await run_turn(agent, model, [user("hi")])
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-output-error"]
    assert error == {"type": "tool-output-error", "toolCallId": "c1", "errorText": "Tool execution failed."}
    assert "tool-output-available" not in types(chunks)
    assert "hunter2" not in repr(chunks)
    assert "hunter2" not in everything_the_model_saw(model)
    [returned] = tool_returns(model, 1)
    assert (returned.content, returned.outcome) == ("Tool execution failed.", "failed")
    assert result.finish_reason == "stop"


async def test_a_failed_conversion_of_a_stored_result_reveals_nothing_to_the_model() -> None:
    agent = define_agent(
        name="a",
        instructions="",
        tools=lambda ctx: [Tool(name="rows", execute=lambda call: 1, to_model_output=converter_failing)],
    )
    model = ScriptedModel(["ok"])
    history = [
        user("hi"),
        {
            "id": "a1",
            "role": "assistant",
            "parts": [
                {
                    "type": "tool-rows",
                    "toolCallId": "c1",
                    "state": "output-available",
                    "input": {},
                    "output": {"rows": 1},
                },
                {"type": "text", "text": "Done."},
            ],
        },
        user("again", "u2"),
    ]
    await run_turn(agent, model, history)
    [returned] = tool_returns(model, 0)
    assert returned.content == "Tool execution failed."
    assert "hunter2" not in everything_the_model_saw(model)


async def test_the_model_sees_the_projection_and_the_ui_the_full_result() -> None:
    recorder = Recorder()
    agent = define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(),
        permissions={"lookup": ToolPolicy(model_output=lambda output, ctx, call: {"q": output["q"]})},
    )
    model = ScriptedModel([Call("lookup", {"q": "x"})], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output["internal"] == "full-detail"
    assert tool_returns(model, 1)[0].content == {"q": "x"}
    assert "full-detail" not in everything_the_model_saw(model)


# Approvals


def approval_agent(recorder: Recorder, **policy: Any) -> Any:
    return define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(),
        permissions={"lookup": ToolPolicy(needs_approval=True, **policy)},
    )


async def test_an_approval_request_pauses_and_ends_the_turn() -> None:
    recorder = Recorder()
    model = ScriptedModel([Call("lookup", {"q": "x"}, "c1")])
    _, result, chunks = await run_turn(approval_agent(recorder), model, [user("hi")])
    assert types(chunks)[-3:] == ["tool-input-available", "tool-approval-request", "finish-step"]
    request = chunks[-2]
    assert request["toolCallId"] == "c1"
    assert isinstance(request["approvalId"], str) and request["approvalId"]
    assert recorder.executed == []
    assert model.calls == 1
    assert result.finish_reason == "tool-calls"


def paused_history(approved: Any, reason: str | None = None) -> list[dict[str, Any]]:
    approval: dict[str, Any] = {"id": "ap1", "approved": approved}
    if reason is not None:
        approval["reason"] = reason
    return [
        user("hi"),
        {
            "id": "a1",
            "role": "assistant",
            "parts": [
                {"type": "step-start"},
                {
                    "type": "tool-lookup",
                    "toolCallId": "c1",
                    "state": "approval-responded",
                    "input": {"q": "x"},
                    "approval": approval,
                },
            ],
        },
    ]


async def test_an_approved_call_runs_before_the_model_continues() -> None:
    recorder = Recorder()
    model = ScriptedModel(["Done."])
    _, _, chunks = await run_turn(approval_agent(recorder), model, paused_history(approved=True))
    assert types(chunks)[0] == "tool-output-available"
    assert chunks[0]["toolCallId"] == "c1"
    assert recorder.executed == [{"q": "x", "user": "u1"}]
    [returned] = tool_returns(model, 0)
    assert returned.tool_call_id == "c1"
    assert returned.content["q"] == "x"


@pytest.mark.parametrize(("approval_id", "origin_id"), [("ap1", "ap1"), (7, None)], ids=["id", "not-text"])
async def test_an_approved_call_reaches_the_execute_hook_named_by_its_approval(
    approval_id: Any, origin_id: str | None
) -> None:
    recorder = Recorder()
    seen: list[tuple[str, str, Any, CallOrigin]] = []

    async def hook(
        *, name: str, tool_call_id: str, input: Any, execute: Any, origin: CallOrigin, **_: Any
    ) -> Any:
        seen.append((name, tool_call_id, input, origin))
        return await execute("key-1")

    history = paused_history(approved=True)
    history[1]["parts"][1]["approval"]["id"] = approval_id
    await run_turn(approval_agent(recorder), ScriptedModel(["Done."]), history, execute_tool=hook)
    assert seen == [("lookup", "c1", {"q": "x"}, CallOrigin(approval_id=origin_id))]
    assert recorder.executed == [{"q": "x", "user": "u1"}]


async def test_a_denied_call_never_runs_and_the_model_gets_the_reason() -> None:
    recorder = Recorder()
    model = ScriptedModel(["Understood."])
    _, _, chunks = await run_turn(approval_agent(recorder), model, paused_history(False, "Not today"))
    assert chunks[0] == {"type": "tool-output-denied", "toolCallId": "c1"}
    assert recorder.executed == []
    [returned] = tool_returns(model, 0)
    assert returned.outcome == "denied"
    assert "Not today" in str(returned.content)


@pytest.mark.parametrize("approved", [1, "true", "yes", [True], {"value": True}, None, 1.0])
async def test_an_approval_answer_that_is_not_the_boolean_true_is_a_denial(approved: Any) -> None:
    recorder = Recorder()
    model = ScriptedModel(["Understood."])
    _, result, chunks = await run_turn(approval_agent(recorder), model, paused_history(approved))
    assert chunks[0] == {"type": "tool-output-denied", "toolCallId": "c1"}
    assert recorder.executed == []
    [returned] = tool_returns(model, 0)
    assert (returned.content, returned.outcome) == ("The user denied this tool call.", "denied")
    assert result.finish_reason == "stop"


@pytest.mark.parametrize(
    "approval", ["approved", ["approved", True], True, 1], ids=["text", "list", "true", "one"]
)
async def test_an_approval_that_is_not_an_object_is_a_denial_not_a_failed_turn(approval: Any) -> None:
    recorder = Recorder()
    history = paused_history(approved=True)
    history[1]["parts"][1]["approval"] = approval
    model = ScriptedModel(["Understood."])
    _, _, chunks = await run_turn(approval_agent(recorder), model, history)
    assert chunks[0] == {"type": "tool-output-denied", "toolCallId": "c1"}
    assert recorder.executed == []
    assert tool_returns(model, 0)[0].outcome == "denied"


async def test_every_answer_of_a_step_is_applied_and_a_tool_that_is_gone_fails_its_approved_call() -> None:
    recorder = Recorder()
    history = paused_history(approved=False)
    parts = history[1]["parts"]
    parts.insert(
        1,
        {
            "type": "tool-retired",
            "toolCallId": "c0",
            "state": "approval-responded",
            "input": {},
            "approval": {"id": "ap0", "approved": True},
        },
    )
    parts.append(
        {
            "type": "tool-lookup",
            "toolCallId": "c2",
            "state": "approval-responded",
            "input": {"q": "y"},
            "approval": {"id": "ap2", "approved": True},
        }
    )
    model = ScriptedModel(["Done."])
    _, _, chunks = await run_turn(approval_agent(recorder), model, history)
    assert chunks[:3] == [
        {"type": "tool-output-error", "toolCallId": "c0", "errorText": "This tool is no longer available."},
        {"type": "tool-output-denied", "toolCallId": "c1"},
        {**chunks[2], "type": "tool-output-available", "toolCallId": "c2"},
    ]
    assert recorder.executed == [{"q": "y", "user": "u1"}]
    returned = {part.tool_call_id: part for part in tool_returns(model, 0)}
    assert (returned["c0"].tool_name, returned["c0"].content, returned["c0"].outcome) == (
        "retired",
        "This tool is no longer available.",
        "failed",
    )
    assert (returned["c1"].tool_name, returned["c1"].outcome) == ("lookup", "denied")
    assert (returned["c2"].tool_name, returned["c2"].outcome) == ("lookup", "success")


async def test_answered_calls_run_but_the_model_waits_while_another_approval_is_open() -> None:
    recorder = Recorder()
    history = paused_history(approved=True)
    history[1]["parts"].append(
        {
            "type": "tool-lookup",
            "toolCallId": "c2",
            "state": "approval-requested",
            "input": {"q": "y"},
            "approval": {"id": "ap2"},
        }
    )
    model = ScriptedModel(["never"])
    _, result, chunks = await run_turn(approval_agent(recorder), model, history)
    assert types(chunks) == ["tool-output-available"]
    assert recorder.executed == [{"q": "x", "user": "u1"}]
    assert model.calls == 0
    assert result.finish_reason == "tool-calls"


async def test_execution_is_checked_again_after_an_approval() -> None:
    recorder = Recorder()
    agent = approval_agent(recorder, can_execute=lambda ctx, call: False)
    model = ScriptedModel(["ok"])
    _, _, chunks = await run_turn(agent, model, paused_history(approved=True))
    assert recorder.executed == []
    assert chunks[0]["type"] == "tool-output-available"
    assert tool_returns(model, 0)[0].outcome == "denied"


async def test_a_failing_approval_predicate_requires_approval() -> None:
    recorder = Recorder()
    model = ScriptedModel([Call("lookup", {"q": "x"})])
    agent = define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(),
        permissions={"lookup": ToolPolicy(needs_approval=lambda ctx, call: 1 / 0)},
    )
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    assert "tool-approval-request" in types(chunks)
    assert recorder.executed == []


async def test_a_policy_cannot_remove_a_tools_own_approval() -> None:
    executed: list[str] = []

    def factory(ctx: Ctx) -> list[Tool]:
        @tool(needs_approval=True)
        async def send_email(to: str) -> str:
            """Send an email."""
            executed.append(to)
            return "sent"

        return [send_email]

    agent = define_agent(
        name="a", instructions="", tools=factory, permissions={"send_email": ToolPolicy(needs_approval=False)}
    )
    model = ScriptedModel([Call("send_email", {"to": "a@example.com"})])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    assert "tool-approval-request" in types(chunks)
    assert executed == []


# The execution hook (persistence claims)


async def test_every_execution_goes_through_the_execute_tool_hook() -> None:
    recorder = Recorder()
    seen: list[tuple[str, str, Any, CallOrigin, bool]] = []

    async def claim(
        *, name: str, tool_call_id: str, input: Any, execute: Any, origin: CallOrigin, idempotent: bool
    ) -> Any:
        seen.append((name, tool_call_id, input, origin, idempotent))
        if tool_call_id == "stored":
            return {"from": "storage"}
        return await execute("the-key")

    agent = define_agent(name="a", instructions="", tools=recorder.factory())
    model = ScriptedModel([Call("lookup", {"q": "a"}, "stored"), Call("lookup", {"q": "b"}, "fresh")], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")], execute_tool=claim)
    assert seen == [
        ("lookup", "stored", {"q": "a"}, CallOrigin(step=0, index=0), False),
        ("lookup", "fresh", {"q": "b"}, CallOrigin(step=0, index=1), False),
    ]
    assert recorder.executed == [{"q": "b", "user": "u1"}]
    outputs = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert outputs[0] == {"from": "storage"}


async def test_a_tool_gets_the_operation_key_the_hook_chose_even_behind_a_policy() -> None:
    keys: list[str | None] = []

    @tool(idempotent=True)
    async def save(text: str, call: ToolCall) -> str:
        """Save."""
        keys.append(call.operation_key)
        return "saved"

    origins: list[tuple[CallOrigin, bool]] = []

    async def claim(*, execute: Any, origin: CallOrigin, idempotent: bool, **_: Any) -> Any:
        origins.append((origin, idempotent))
        return await execute(f"key-{origin.step}")

    agent = define_agent(
        name="a",
        instructions="",
        tools=lambda ctx: [save],
        permissions={"save": ToolPolicy(can_execute=lambda c, call: True)},
    )
    model = ScriptedModel(
        [Call("save", {"text": "a"}, "call_0")], [Call("save", {"text": "b"}, "call_0")], ["ok"]
    )
    await run_turn(agent, model, [user("hi")], execute_tool=claim)
    assert keys == ["key-0", "key-1"]
    assert origins == [(CallOrigin(step=0, index=0), True), (CallOrigin(step=1, index=0), True)]


async def test_without_a_hook_each_call_of_a_turn_still_gets_its_own_operation_key() -> None:
    keys: list[str | None] = []

    @tool
    async def save(text: str, call: ToolCall) -> str:
        """Save."""
        keys.append(call.operation_key)
        return "saved"

    agent = define_agent(name="a", instructions="", tools=lambda ctx: [save])
    script = (
        [Call("save", {"text": "a"}, "call_0"), Call("save", {"text": "b"}, "call_0")],
        [Call("save", {"text": "c"}, "call_0")],
    )
    await run_turn(agent, ScriptedModel(*script, ["ok"]), [user("hi")])
    await run_turn(agent, ScriptedModel(*script, ["ok"]), [user("hi")])
    assert len(keys) == 6
    assert all(key is not None for key in keys)
    assert len(set(keys)) == 6


# Session lifecycle and resources


async def test_close_releases_resources_exactly_once() -> None:
    recorder = Recorder()
    agent = define_agent(name="a", instructions="", tools=recorder.factory())
    session = await agent.prepare(context=Ctx("u1"))
    await asyncio.gather(session.close(), session.close())
    await session.close()
    assert recorder.closed == 1


async def test_stream_after_close_asks_for_a_new_session_and_never_calls_the_model() -> None:
    agent = define_agent(name="a", instructions="")
    session = await agent.prepare(context=Ctx("u1"))
    await session.close()
    model = ScriptedModel(["never"])
    with pytest.raises(AgentSessionClosedError, match="Prepare a new session"):
        await session.stream(model=model, messages=[user("hi")])
    assert model.calls == 0


async def test_a_session_runs_one_turn() -> None:
    agent = define_agent(name="a", instructions="")
    session = await agent.prepare(context=Ctx("u1"))
    await collect(await session.stream(model=ScriptedModel(["one"]), messages=[user("hi")]))
    with pytest.raises(AgentSessionClosedError):
        await session.stream(model=ScriptedModel(["two"]), messages=[user("hi")])


async def test_a_tool_name_colliding_with_the_skill_loader_fails_and_closes_resources() -> None:
    recorder = Recorder()
    clash = Tool(name="load_skill", execute=lambda call: "mine")

    async def load() -> str:
        return "guide"

    agent = define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(clash),
        skills=[Skill(name="style", description="House style.", load=load)],
    )
    with pytest.raises(DuplicateToolNameError, match="Duplicate tool name"):
        await agent.prepare(context=Ctx("u1"))
    assert recorder.closed == 1


async def test_a_failing_prepare_messages_hook_propagates_and_closes_resources() -> None:
    recorder = Recorder()

    def broken(messages: list[dict[str, Any]], ctx: Ctx) -> list[dict[str, Any]]:
        raise LookupError("no history")

    agent = define_agent(name="a", instructions="", tools=recorder.factory(), prepare_messages=broken)
    session = await agent.prepare(context=Ctx("u1"))
    model = ScriptedModel(["never"])
    with pytest.raises(LookupError):
        await session.stream(model=model, messages=[user("hi")])
    assert recorder.closed == 1
    assert model.calls == 0


async def test_a_failing_context_messages_hook_propagates_and_closes_resources() -> None:
    recorder = Recorder()

    async def broken(messages: list[dict[str, Any]], ctx: Ctx) -> list[dict[str, Any]]:
        raise LookupError("no profile")

    agent = define_agent(name="a", instructions="", tools=recorder.factory(), context_messages=broken)
    session = await agent.prepare(context=Ctx("u1"))
    with pytest.raises(LookupError):
        await session.stream(model=ScriptedModel(["never"]), messages=[user("hi")])
    assert recorder.closed == 1


async def test_cancellation_while_preparing_the_history_closes_resources() -> None:
    recorder = Recorder()
    entered = asyncio.Event()

    async def slow(messages: list[dict[str, Any]], ctx: Ctx) -> list[dict[str, Any]]:
        entered.set()
        await asyncio.sleep(60)
        return messages

    agent = define_agent(name="a", instructions="", tools=recorder.factory(), prepare_messages=slow)
    session = await agent.prepare(context=Ctx("u1"))
    task = asyncio.ensure_future(session.stream(model=ScriptedModel(["never"]), messages=[user("hi")]))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorder.closed == 1


async def test_cancellation_during_tool_discovery_cancels_the_factory_and_raises() -> None:
    cancel = asyncio.Event()
    factory_cancelled = asyncio.Event()

    async def discover(ctx: Ctx) -> list[Tool]:
        cancel.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            factory_cancelled.set()
            raise
        return []

    agent = define_agent(name="a", instructions="", tools=discover)
    with pytest.raises(AgentCancelledError):
        await agent.prepare(context=Ctx("u1"), cancel=cancel)
    assert factory_cancelled.is_set()


async def test_a_cancellation_in_the_step_the_factory_finishes_fails_prepare_and_closes_its_tools() -> None:
    recorder = Recorder()
    cancel = asyncio.Event()
    build = recorder.factory()

    def factory(ctx: Ctx) -> AgentTools:
        cancel.set()
        return build(ctx)

    agent = define_agent(name="a", instructions="", tools=factory)
    with pytest.raises(AgentCancelledError):
        await agent.prepare(context=Ctx("u1"), cancel=cancel)
    assert recorder.closed == 1


async def test_a_factory_that_finishes_despite_the_cancellation_has_its_tools_closed() -> None:
    recorder = Recorder()
    cancel = asyncio.Event()
    build = recorder.factory()

    async def stubborn(ctx: Ctx) -> AgentTools:
        cancel.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)
        return build(ctx)

    agent = define_agent(name="a", instructions="", tools=stubborn)
    with pytest.raises(AgentCancelledError):
        await agent.prepare(context=Ctx("u1"), cancel=cancel)
    assert recorder.closed == 1


async def test_prepare_cancelled_from_outside_closes_what_the_factory_returned() -> None:
    recorder = Recorder()
    entered = asyncio.Event()
    build = recorder.factory()

    async def stubborn(ctx: Ctx) -> AgentTools:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)
        return build(ctx)

    agent = define_agent(name="a", instructions="", tools=stubborn)
    task = asyncio.ensure_future(agent.prepare(context=Ctx("u1"), cancel=asyncio.Event()))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert recorder.closed == 1


async def test_cancelling_a_prepared_session_that_has_not_streamed_closes_its_resources() -> None:
    closed = asyncio.Event()
    recorder = Recorder()
    cancel = asyncio.Event()

    async def close() -> None:
        await recorder.close()
        closed.set()

    def factory(ctx: Ctx) -> AgentTools:
        return AgentTools(tools=recorder.factory()(ctx).tools, close=close)

    session = await define_agent(name="a", instructions="", tools=factory).prepare(
        context=Ctx("u1"), cancel=cancel
    )
    cancel.set()
    await asyncio.wait_for(closed.wait(), timeout=30)
    assert recorder.closed == 1
    result = await session.stream(model=ScriptedModel(["never"]), messages=[user("hi")])
    assert await collect(result) == []
    assert result.cancelled
    await session.close()
    assert recorder.closed == 1


async def test_a_turn_cancelled_before_it_is_prepared_never_builds_tools() -> None:
    built: list[str] = []
    cancel = asyncio.Event()
    cancel.set()

    def factory(ctx: Ctx) -> list[Tool]:
        built.append(ctx.user_id)
        return []

    with pytest.raises(AgentCancelledError):
        await define_agent(name="a", instructions="", tools=factory).prepare(context=Ctx("u1"), cancel=cancel)
    assert built == []


async def test_a_tool_factory_may_be_async() -> None:
    async def factory(ctx: Ctx) -> list[Tool]:
        await asyncio.sleep(0)
        return [Tool(name="remote", execute=lambda call: "r")]

    session = await define_agent(name="a", instructions="", tools=factory).prepare(context=Ctx("u1"))
    assert session.tool_names == ["remote"]


# Messages and instructions


async def test_prepare_messages_redacts_history_before_the_model_sees_it() -> None:
    def redact(messages: list[dict[str, Any]], ctx: Ctx) -> list[dict[str, Any]]:
        return [message for message in messages if message["id"] != "old"]

    agent = define_agent(name="a", instructions="", prepare_messages=redact)
    model = ScriptedModel(["ok"])
    history = [user("my card number is 4111", "old"), user("hello", "new")]
    await run_turn(agent, model, history)
    assert "4111" not in everything_the_model_saw(model)
    assert history[0]["parts"][0]["text"] == "my card number is 4111"


async def test_context_messages_go_just_before_the_latest_user_message() -> None:
    def add_profile(messages: list[dict[str, Any]], ctx: Ctx) -> list[dict[str, Any]]:
        return [{"id": "ctx", "role": "system", "parts": [{"type": "text", "text": "Timezone: UTC"}]}]

    agent = define_agent(name="a", instructions="Static.", context_messages=add_profile)
    model = ScriptedModel(["ok"])
    await run_turn(agent, model, [user("first", "1"), user("second", "2")])
    messages = model.requests[0].messages
    contents = [part.content for message in messages for part in message.parts]  # type: ignore[union-attr]
    assert contents == ["first", "Timezone: UTC", "second"]
    assert model.requests[0].info.instructions == "Static."


async def test_static_instructions_and_the_skill_catalog_stay_separate_from_messages() -> None:
    loads: list[str] = []

    async def load() -> str:
        loads.append("style")
        return "Use short sentences."

    agent = define_agent(
        name="a",
        instructions="Be kind.",
        skills=[Skill(name="style", description="The house style.", load=load)],
    )
    model = ScriptedModel([Call("load_skill", {"name": "style"})], ["ok"])
    _, _, chunks = await run_turn(agent, model, [user("hi")])
    instructions = model.requests[0].info.model_request_parameters.instruction_parts
    assert instructions is not None
    assert instructions[0].content == "Be kind."
    assert "style: The house style." in instructions[1].content
    assert "Use short sentences." not in repr(model.requests[0])
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"name": "style", "content": "Use short sentences."}
    assert loads == ["style"]


async def test_instructions_a_tool_source_brings_follow_the_static_ones() -> None:
    def factory(ctx: Ctx) -> AgentTools:
        return AgentTools(tools=[], instructions="The docs server answers in French.")

    agent = define_agent(name="a", instructions="Be kind.", tools=factory)
    model = ScriptedModel(["ok"])
    await run_turn(agent, model, [user("hi")])
    instructions = model.requests[0].info.model_request_parameters.instruction_parts
    assert instructions is not None
    assert [part.content for part in instructions] == ["Be kind.", "The docs server answers in French."]
    assert instructions[1].dynamic


async def test_the_skill_loader_is_hidden_unless_the_permission_map_lists_it() -> None:
    async def load() -> str:
        return "x"

    skills = [Skill(name="style", description="The house style.", load=load)]
    hidden = define_agent(name="a", instructions="", skills=skills, permissions={})
    listed = define_agent(name="a", instructions="", skills=skills, permissions={"load_skill": ToolPolicy()})
    assert (await hidden.prepare(context=Ctx("u1"))).tool_names == []
    assert (await listed.prepare(context=Ctx("u1"))).tool_names == ["load_skill"]


def stored_history(*tool_parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        user("earlier", "u0"),
        {"id": "a0", "role": "assistant", "parts": [{"type": "step-start"}, *tool_parts]},
        user("now", "u1"),
    ]


def stored_output(name: str, call_id: str, output: Any) -> dict[str, Any]:
    return {
        "type": f"tool-{name}",
        "toolCallId": call_id,
        "state": "output-available",
        "input": {"q": "x"},
        "output": output,
    }


async def test_stored_results_are_projected_and_removed_tools_are_denied_without_touching_history() -> None:
    recorder = Recorder()
    agent = define_agent(
        name="a",
        instructions="",
        tools=recorder.factory(),
        permissions={"lookup": ToolPolicy(model_output=lambda output, ctx, call: {"q": output["q"]})},
    )
    history = stored_history(
        stored_output("lookup", "c1", {"q": "x", "internal": "full-detail"}),
        stored_output("retired", "c2", {"secret": "old-data"}),
    )
    before = copy.deepcopy(history)
    model = ScriptedModel(["ok"])
    await run_turn(agent, model, history)
    returns = {part.tool_call_id: part for part in tool_returns(model, 0)}
    assert returns["c1"].content == {"q": "x"}
    assert "old-data" not in repr(returns["c2"].content)
    assert "full-detail" not in everything_the_model_saw(model)
    assert history == before


async def test_stored_results_are_checked_again_against_todays_execution_policy() -> None:
    agent = define_agent(
        name="a",
        instructions="",
        tools=Recorder().factory(),
        permissions={"lookup": ToolPolicy(can_execute=lambda ctx, call: ctx.user_id == "owner")},
    )
    model = ScriptedModel(["ok"])
    history = stored_history(stored_output("lookup", "c1", {"balance": 1234}))
    await run_turn(agent, model, history, context=Ctx("someone-else"))
    assert "1234" not in everything_the_model_saw(model)


async def test_stored_errors_are_formatted_by_todays_error_policy() -> None:
    agent = define_agent(
        name="a",
        instructions="",
        tools=Recorder().factory(),
        permissions={"lookup": ToolPolicy(model_error=lambda text, ctx, call: "Lookup failed.")},
    )
    model = ScriptedModel(["ok"])
    failed = {
        "type": "tool-lookup",
        "toolCallId": "c1",
        "state": "output-error",
        "input": {"q": "x"},
        "errorText": "host db-7 down",
    }
    await run_turn(agent, model, stored_history(failed))
    assert "db-7" not in everything_the_model_saw(model)
    assert tool_returns(model, 0)[0].content == "Lookup failed."


# Cancellation


async def test_cancellation_during_streaming_stops_the_turn_and_closes_resources() -> None:
    recorder = Recorder()
    cancel = asyncio.Event()
    agent = define_agent(name="a", instructions="", tools=recorder.factory())
    model = ScriptedModel([f"w{n} " for n in range(100)])
    session = await agent.prepare(context=Ctx("u1"), cancel=cancel)
    result = await session.stream(model=model, messages=[user("hi")])
    chunks = []
    async for chunk in result:
        chunks.append(chunk)
        if chunk["type"] == "text-delta" and len(chunks) == 5:
            cancel.set()
    assert result.cancelled
    assert types(chunks)[-2:] == ["text-end", "finish-step"]
    assert text_of(chunks).count("w") < 10
    assert recorder.closed == 1


async def test_cancellation_during_a_tool_abandons_the_execution() -> None:
    cancel = asyncio.Event()
    abandoned = asyncio.Event()

    async def hang(call: ToolCall) -> None:
        cancel.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            abandoned.set()
            raise

    agent = define_agent(name="a", instructions="", tools=lambda ctx: [Tool(name="hang", execute=hang)])
    model = ScriptedModel([Call("hang", {})], ["never"])
    _, result, chunks = await run_turn(agent, model, [user("hi")], cancel=cancel)
    assert result.cancelled
    assert abandoned.is_set()
    assert model.calls == 1
    assert "tool-output-available" not in types(chunks)


async def test_a_provider_error_propagates_from_the_stream() -> None:
    class Broken(ScriptedModel):
        async def _stream(self, messages: Any, info: Any) -> AsyncIterator[str]:
            yield "partial"
            raise ConnectionError("provider down")

    agent = define_agent(name="a", instructions="")
    session = await agent.prepare(context=Ctx("u1"))
    result = await session.stream(model=Broken(), messages=[user("hi")])
    with pytest.raises(ConnectionError):
        await collect(result)


async def test_a_tool_whose_await_was_cancelled_elsewhere_fails_as_a_tool_error() -> None:
    elsewhere: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    elsewhere.cancel()

    async def waits(call: ToolCall) -> None:
        await elsewhere

    agent = define_agent(name="a", instructions="", tools=lambda ctx: [Tool(name="waits", execute=waits)])
    model = ScriptedModel([Call("waits", {})], ["It failed."])
    _, result, chunks = await run_turn(agent, model, [user("hi")])
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-output-error"]
    assert error["errorText"] == "Tool execution failed."
    assert text_of(chunks) == "It failed."
    assert not result.cancelled


async def test_a_stored_file_the_model_layer_cannot_read_is_left_out_instead_of_failing_the_turn() -> None:
    agent = define_agent(name="a", instructions="")
    model = ScriptedModel(["ok"])
    broken = {"type": "file", "mediaType": "text/plain", "url": "data:text/plain,not-base64"}
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "see file"}, broken]}
    await run_turn(agent, model, [message])
    assert "see file" in everything_the_model_saw(model)


async def test_a_provider_executed_tool_is_streamed_but_never_run_here() -> None:
    async def search_then_answer(messages: list[Any], info: AgentInfo) -> AsyncIterator[Any]:
        yield {
            0: NativeToolCallPart(tool_name="web_search", args={"query": "bastion"}, tool_call_id="ws1"),
            1: NativeToolReturnPart(tool_name="web_search", content={"results": ["a"]}, tool_call_id="ws1"),
        }

    search = Tool(name="web_search", native=WebSearchTool())
    agent = define_agent(name="a", instructions="", tools=lambda ctx: [search])
    session = await agent.prepare(context=Ctx("u1"))
    result = await session.stream(
        model=FunctionModel(stream_function=search_then_answer), messages=[user("hi")]
    )
    chunks = await collect(result)
    shown = [chunk for chunk in chunks if chunk.get("providerExecuted")]
    assert [chunk["type"] for chunk in shown] == ["tool-input-available", "tool-output-available"]
    assert shown[0]["input"] == {"query": "bastion"}
    assert shown[1]["output"] == {"results": ["a"]}
    assert result.finish_reason == "stop"


async def test_a_cancelled_turn_cancels_the_model_read_it_was_waiting_for() -> None:
    from bastion._cancel import until_cancelled as _until_cancelled

    waiting = asyncio.Event()
    read_cancelled = asyncio.Event()

    async def model_events() -> AsyncIterator[Any]:
        waiting.set()
        try:
            await asyncio.Event().wait()  # a model that sends nothing more
        except asyncio.CancelledError:
            read_cancelled.set()
            raise
        yield None

    async def read() -> None:
        async for _ in _until_cancelled(model_events(), asyncio.Event()):
            pass

    reader = asyncio.ensure_future(read())
    await waiting.wait()
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    for _ in range(3):
        await asyncio.sleep(0)
    assert read_cancelled.is_set()
