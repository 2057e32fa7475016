"""The loop's exact wire: every chunk a turn yields (reasoning, text, tool inputs and outputs, provider
tools, input errors) with its ids and flags, what the model is sent (tool definitions, settings,
instructions), what the model hears back on a bad call, and what the logs name when a tool fails."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, NativeToolCallPart, NativeToolReturnPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaThinkingPart, DeltaToolCall, FunctionModel
from pydantic_ai.native_tools import WebSearchTool
from pydantic_ai.tools import ToolDefinition

from bastion import Skill, Tool, ToolCall, ToolError, ToolPolicy, define_agent, tool
from tests.scripted import Call, ScriptedModel, collect, user


@tool
async def lookup(word: str) -> dict[str, str]:
    """Look a word up."""
    return {"word": word}


async def turn(agent: Any, model: Any, **stream: Any) -> tuple[Any, list[dict[str, Any]]]:
    session = await agent.prepare(context=None)
    try:
        result = await session.stream(model=model, messages=[user("hi")], **stream)
        return result, await collect(result)
    finally:
        await session.close()


def plain(**tools: Any) -> Any:
    return define_agent(name="a", instructions="", tools=lambda _: list(tools.values()))


# Chunks


async def test_reasoning_and_text_stream_as_parts_with_step_and_position_ids() -> None:
    async def think_then_answer(messages: list[Any], info: AgentInfo) -> AsyncIterator[Any]:
        yield {0: DeltaThinkingPart(content="Let me")}
        yield {0: DeltaThinkingPart(content=" think.")}
        yield {0: DeltaThinkingPart(content="")}
        yield "Answer."

    _, chunks = await turn(plain(), FunctionModel(stream_function=think_then_answer))
    assert chunks == [
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "0-0"},
        {"type": "reasoning-delta", "id": "0-0", "delta": "Let me"},
        {"type": "reasoning-delta", "id": "0-0", "delta": " think."},
        {"type": "reasoning-end", "id": "0-0"},
        {"type": "text-start", "id": "0-1"},
        {"type": "text-delta", "id": "0-1", "delta": "Answer."},
        {"type": "text-end", "id": "0-1"},
        {"type": "finish-step"},
    ]


async def test_a_tool_call_streams_its_name_id_input_and_output_and_the_next_step_has_its_own_ids() -> None:
    model = ScriptedModel([Call("lookup", {"word": "owl"}, "c1")], ["Done."])
    result, chunks = await turn(plain(lookup=lookup), model)
    assert chunks == [
        {"type": "start-step"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "lookup"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"word"'},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": ': "owl"}'},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "lookup", "input": {"word": "owl"}},
        {"type": "tool-output-available", "toolCallId": "c1", "output": {"word": "owl"}},
        {"type": "finish-step"},
        {"type": "start-step"},
        {"type": "text-start", "id": "1-0"},
        {"type": "text-delta", "id": "1-0", "delta": "Done."},
        {"type": "text-end", "id": "1-0"},
        {"type": "finish-step"},
    ]
    assert result.finish_reason == "stop"


async def test_a_dynamic_tool_and_an_unknown_tool_are_flagged_dynamic_on_every_chunk() -> None:
    async def echo(call: ToolCall) -> Any:
        return call.input

    remote = Tool(name="remote", execute=echo, dynamic=True)
    model = ScriptedModel([Call("remote", {"a": 1}, "c1"), Call("missing", {"b": 2}, "c2")], ["ok"])
    _, chunks = await turn(plain(remote=remote), model)
    flagged = [chunk for chunk in chunks if chunk["type"].startswith("tool-")]
    assert [(chunk["type"], chunk.get("dynamic")) for chunk in flagged] == [
        ("tool-input-start", True),
        ("tool-input-delta", None),
        ("tool-input-delta", None),
        ("tool-input-start", True),
        ("tool-input-delta", None),
        ("tool-input-delta", None),
        ("tool-input-available", True),
        ("tool-input-error", True),
        ("tool-output-available", None),
    ]
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-input-error"]
    assert error == {
        "type": "tool-input-error",
        "toolCallId": "c2",
        "toolName": "missing",
        "input": {"b": 2},
        "errorText": "Unknown tool: missing",
        "dynamic": True,
    }


async def test_a_local_tool_is_never_flagged_dynamic() -> None:
    model = ScriptedModel([Call("lookup", {"word": 5}, "c1")], [Call("lookup", {"word": "ok"}, "c2")], ["ok"])
    _, chunks = await turn(plain(lookup=lookup), model)
    assert all("dynamic" not in chunk for chunk in chunks)


async def test_arguments_that_are_not_an_object_are_an_input_error_and_the_model_is_told_so() -> None:
    model = ScriptedModel([Call("lookup", "[1, 2]", "c1"), Call("lookup", {"word": "owl"}, "c2")], ["ok"])
    result, chunks = await turn(plain(lookup=lookup), model)
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-input-error"]
    assert error == {
        "type": "tool-input-error",
        "toolCallId": "c1",
        "toolName": "lookup",
        "input": {},
        "errorText": "Invalid input: the arguments are not a JSON object.",
    }
    # The next call of the same step still runs.
    assert [chunk["toolCallId"] for chunk in chunks if chunk["type"] == "tool-output-available"] == ["c2"]
    returns = [
        part
        for message in model.requests[1].messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    assert [(r.tool_name, r.tool_call_id, r.content, r.outcome) for r in returns] == [
        ("lookup", "c1", "The arguments must be a JSON object.", "retried"),
        ("lookup", "c2", {"word": "owl"}, "success"),
    ]
    assert result.finish_reason == "stop"


async def test_every_bad_call_of_a_step_is_answered_and_the_good_ones_still_run() -> None:
    model = ScriptedModel(
        [Call("missing", {}, "c1"), Call("lookup", {"word": 5}, "c2"), Call("lookup", {"word": "owl"}, "c3")],
        ["ok"],
    )
    _, chunks = await turn(plain(lookup=lookup), model)
    errors = [chunk["toolCallId"] for chunk in chunks if chunk["type"] == "tool-input-error"]
    assert errors == ["c1", "c2"]
    assert [chunk["toolCallId"] for chunk in chunks if chunk["type"] == "tool-output-available"] == ["c3"]
    returns = [
        (part.tool_name, part.content)
        for message in model.requests[1].messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    assert returns[0] == ("missing", "Unknown tool name: 'missing'.")
    assert returns[1][0] == "lookup" and str(returns[1][1]).startswith("Invalid arguments: ")
    assert returns[2] == ("lookup", {"word": "owl"})


async def test_a_provider_executed_tool_streams_its_call_and_result_as_the_provider_sent_them() -> None:
    async def search(messages: list[Any], info: AgentInfo) -> AsyncIterator[Any]:
        yield {
            0: NativeToolCallPart(tool_name="web_search", args={"query": "owl"}, tool_call_id="ws1"),
            1: NativeToolReturnPart(tool_name="web_search", content={"hits": 1}, tool_call_id="ws1"),
        }

    search_tool = Tool(name="web_search", native=WebSearchTool())
    _, chunks = await turn(plain(web_search=search_tool), FunctionModel(stream_function=search))
    assert chunks == [
        {"type": "start-step"},
        {
            "type": "tool-input-available",
            "toolCallId": "ws1",
            "toolName": "web_search",
            "input": {"query": "owl"},
            "providerExecuted": True,
        },
        {
            "type": "tool-output-available",
            "toolCallId": "ws1",
            "output": {"hits": 1},
            "providerExecuted": True,
        },
        {"type": "finish-step"},
    ]


async def test_an_agent_stream_can_be_read_only_once() -> None:
    session = await plain().prepare(context=None)
    result = await session.stream(model=ScriptedModel(["hi"]), messages=[user("hi")])
    await collect(result)
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"^An agent stream can be read once\.$"):
            await collect(result)
    await session.close()


# What the model is sent


async def test_the_model_gets_each_function_tools_definition_and_the_provider_tools_apart() -> None:
    seen: list[AgentInfo] = []

    async def record(messages: list[Any], info: AgentInfo) -> AsyncIterator[str]:
        seen.append(info)
        yield "ok"

    async def run(call: ToolCall) -> str:
        return "x"

    bare = Tool(name="bare", execute=run, input_schema={"type": "object", "properties": {}}, strict=True)
    agent = plain(lookup=lookup, bare=bare, web_search=Tool(name="web_search", native=WebSearchTool()))
    await turn(agent, FunctionModel(stream_function=record), model_settings={"temperature": 0.25})
    [info] = seen
    assert info.function_tools == [
        ToolDefinition(
            name="lookup",
            description="Look a word up.",
            parameters_json_schema=dict(lookup.input_schema),
            strict=None,
        ),
        ToolDefinition(
            name="bare",
            description=None,
            parameters_json_schema={"type": "object", "properties": {}},
            strict=True,
        ),
    ]
    assert [type(native) for native in info.model_request_parameters.native_tools] == [WebSearchTool]
    assert info.allow_text_output is True
    assert info.model_settings is not None and info.model_settings.get("temperature") == 0.25


async def test_without_instructions_the_model_gets_none_and_with_them_each_request_records_them() -> None:
    seen: list[AgentInfo] = []

    async def record(messages: list[Any], info: AgentInfo) -> AsyncIterator[str]:
        seen.append(info)
        yield "ok"

    await turn(plain(), FunctionModel(stream_function=record))
    assert seen[-1].instructions is None

    async def load() -> str:
        return "Write short notes."

    skill = Skill(name="notes", description="Keep notes.", load=load)
    agent = define_agent(name="a", instructions="Be brief.", skills=[skill])
    result, _ = await turn(agent, FunctionModel(stream_function=record))
    [request] = [message for message in result.messages if isinstance(message, ModelRequest)]
    assert request.instructions == seen[-1].instructions
    assert request.instructions is not None and request.instructions.startswith("Be brief.\n\nSkills are")


# Logs name the tool, never its error


async def test_a_failing_tool_is_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    async def explode(call: ToolCall) -> Any:
        raise RuntimeError("secret detail")

    async def unconvertible(call: ToolCall) -> Any:
        return object()

    async def refuses(call: ToolCall) -> Any:
        raise ToolError("Not today.")

    elsewhere: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    elsewhere.cancel()

    async def waits(call: ToolCall) -> None:
        await elsewhere

    tools = {
        "explode": Tool(name="explode", execute=explode),
        "odd": Tool(name="odd", execute=unconvertible),
        "refuses": Tool(name="refuses", execute=refuses),
        "waits": Tool(name="waits", execute=waits),
        "empty": Tool(name="empty"),
    }
    model = ScriptedModel([Call(name, {}, f"c-{name}") for name in tools], ["ok"])
    with caplog.at_level(logging.ERROR, logger="bastion.loop"):
        _, chunks = await turn(plain(**tools), model)
    assert sorted(record.getMessage() for record in caplog.records) == [
        "Converting the result of odd failed.",
        "Tool empty failed.",
        "Tool explode failed.",
        "Tool waits was cancelled from elsewhere.",
    ]
    [no_executor] = [record for record in caplog.records if record.getMessage() == "Tool empty failed."]
    assert (
        no_executor.exc_info is not None and str(no_executor.exc_info[1]) == "Tool 'empty' has no executor."
    )
    errors = {
        chunk["toolCallId"]: chunk["errorText"] for chunk in chunks if chunk["type"] == "tool-output-error"
    }
    assert errors == {f"c-{name}": "Tool execution failed." for name in tools} | {"c-refuses": "Not today."}
    returns = [
        (part.tool_name, part.tool_call_id, part.outcome)
        for message in model.requests[1].messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    assert returns == [(name, f"c-{name}", "failed") for name in tools]


# Cancellation


async def test_a_cancel_mid_answer_closes_the_open_text_and_the_unfinished_tool_input() -> None:
    cancel = asyncio.Event()

    async def cut_off(messages: list[Any], info: AgentInfo) -> AsyncIterator[Any]:
        yield "Partial"
        yield {1: DeltaToolCall(name="lookup", json_args='{"wo', tool_call_id="c1")}
        cancel.set()
        await asyncio.Event().wait()  # the model goes quiet
        yield "never"

    session = await plain(lookup=lookup).prepare(context=None, cancel=cancel)
    result = await session.stream(model=FunctionModel(stream_function=cut_off), messages=[user("hi")])
    chunks = await collect(result)
    assert chunks == [
        {"type": "start-step"},
        {"type": "text-start", "id": "0-0"},
        {"type": "text-delta", "id": "0-0", "delta": "Partial"},
        {"type": "text-end", "id": "0-0"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "lookup"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"wo'},
        {"type": "finish-step"},
    ]
    assert result.cancelled is True and result.finish_reason == "other"


async def test_a_cancel_while_the_model_is_silent_never_runs_the_call_it_already_streamed() -> None:
    cancel = asyncio.Event()
    ran: list[str] = []

    async def record(call: ToolCall) -> str:
        ran.append(call.tool_call_id)
        return "ran"

    async def call_then_stall(messages: list[Any], info: AgentInfo) -> AsyncIterator[Any]:
        yield {0: DeltaToolCall(name="act", json_args="{}", tool_call_id="c1")}
        cancel.set()
        await asyncio.Event().wait()
        yield "never"

    session = await plain(act=Tool(name="act", execute=record)).prepare(context=None, cancel=cancel)
    result = await session.stream(model=FunctionModel(stream_function=call_then_stall), messages=[user("hi")])
    chunks = await collect(result)
    assert ran == []
    assert chunks[-1] == {"type": "finish-step"}
    assert not any(chunk["type"].startswith("tool-output") for chunk in chunks)
    assert result.cancelled is True


async def test_a_cancel_set_as_the_last_step_ends_makes_the_turn_cancelled() -> None:
    cancel = asyncio.Event()

    async def answer_then_cancel(messages: list[Any], info: AgentInfo) -> AsyncIterator[Any]:
        yield "Done."
        cancel.set()

    session = await plain().prepare(context=None, cancel=cancel)
    result = await session.stream(
        model=FunctionModel(stream_function=answer_then_cancel), messages=[user("hi")]
    )
    await collect(result)
    assert result.cancelled is True and result.finish_reason == "other"


async def test_watching_a_cancel_signal_reads_a_models_events_in_one_task_not_one_per_event() -> None:
    from bastion._cancel import until_cancelled as _until_cancelled

    readers: list[asyncio.Task[Any] | None] = []

    async def events() -> AsyncIterator[Any]:
        for index in range(50):
            readers.append(asyncio.current_task())
            yield index

    cancel = asyncio.Event()
    assert [event async for event in _until_cancelled(events(), cancel)] == list(range(50))  # type: ignore[arg-type]
    assert len(set(readers)) == 1


async def test_watching_a_cancel_signal_reads_the_models_events_in_the_task_that_iterates() -> None:
    from bastion._cancel import until_cancelled as _until_cancelled

    readers: list[asyncio.Task[Any] | None] = []

    async def events() -> AsyncIterator[Any]:
        for index in range(3):
            readers.append(asyncio.current_task())
            yield index

    cancel = asyncio.Event()
    assert [event async for event in _until_cancelled(events(), cancel)] == [0, 1, 2]  # type: ignore[arg-type]
    assert readers == [asyncio.current_task()] * 3


async def test_a_cancel_signal_that_interrupts_a_silent_model_leaves_the_reading_task_uncancelled() -> None:
    from bastion._cancel import until_cancelled as _until_cancelled

    waiting = asyncio.Event()
    interrupted: list[bool] = []

    async def events() -> AsyncIterator[Any]:
        yield "first"
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            interrupted.append(True)
            raise
        yield "never"

    cancel = asyncio.Event()

    async def read() -> tuple[list[Any], int]:
        seen = [event async for event in _until_cancelled(events(), cancel)]  # type: ignore[arg-type]
        await asyncio.sleep(0)  # a cancellation left pending would raise here
        task = asyncio.current_task()
        assert task is not None
        return seen, task.cancelling()

    reader = asyncio.ensure_future(read())
    await waiting.wait()
    cancel.set()
    assert await reader == (["first", None], 0)
    assert interrupted == [True]


async def test_a_cancel_signal_set_while_the_reader_was_busy_elsewhere_ends_the_next_read_at_once() -> None:
    from bastion._cancel import until_cancelled as _until_cancelled

    async def events() -> AsyncIterator[Any]:
        yield "first"
        await asyncio.Event().wait()  # then silent
        yield "never"

    cancel = asyncio.Event()

    async def read() -> list[Any]:
        seen = []
        async for event in _until_cancelled(events(), cancel):  # type: ignore[arg-type]
            seen.append(event)
            if event == "first":
                cancel.set()
                for _ in range(5):  # busy with something else while the signal is delivered
                    await asyncio.sleep(0)
        return seen

    assert await asyncio.wait_for(read(), 10) == ["first", None]


async def test_a_set_cancel_signal_ends_the_models_events_without_reading_them() -> None:
    from bastion._cancel import until_cancelled as _until_cancelled

    read: list[int] = []

    async def events() -> AsyncIterator[Any]:
        read.append(1)
        yield "event"

    cancel = asyncio.Event()
    cancel.set()
    assert [event async for event in _until_cancelled(events(), cancel)] == [None]  # type: ignore[arg-type]
    assert read == []


async def test_cancelling_the_task_that_reads_the_turn_cancels_it_instead_of_failing_the_tool() -> None:
    started = asyncio.Event()

    async def slow(call: ToolCall) -> str:
        started.set()
        await asyncio.sleep(60)
        return "late"

    model = ScriptedModel([Call("slow", {}, "c1")], ["never"])
    session = await plain(slow=Tool(name="slow", execute=slow)).prepare(context=None)
    result = await session.stream(model=model, messages=[user("hi")])
    seen: list[dict[str, Any]] = []

    async def read() -> None:
        async for chunk in result:
            seen.append(chunk)

    reader = asyncio.ensure_future(read())
    await started.wait()
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    await session.close()
    assert not any(chunk["type"] == "tool-output-error" for chunk in seen)
    assert model.calls == 1


async def test_a_turn_that_was_not_cancelled_says_so() -> None:
    result, _ = await turn(plain(), ScriptedModel(["hi"]))
    assert result.cancelled is False


# Approvals, retries and denials within a step


async def test_the_approval_predicate_reads_the_call_and_the_other_calls_of_the_step_still_run() -> None:
    ran: list[Any] = []

    async def pay(call: ToolCall) -> str:
        ran.append(call.input)
        return "paid"

    payment = Tool(
        name="pay",
        execute=pay,
        input_schema={"type": "object", "properties": {"amount": {"type": "integer"}}},
        needs_approval=lambda call: call.input["amount"] > 100,
    )
    model = ScriptedModel([Call("pay", {"amount": 500}, "big"), Call("pay", {"amount": 5}, "small")])
    result, chunks = await turn(plain(pay=payment), model)
    assert [chunk["toolCallId"] for chunk in chunks if chunk["type"] == "tool-approval-request"] == ["big"]
    assert [chunk["toolCallId"] for chunk in chunks if chunk["type"] == "tool-output-available"] == ["small"]
    assert ran == [{"amount": 5}]
    assert result.finish_reason == "tool-calls"


async def test_a_tool_may_be_retried_as_often_as_the_agent_allows() -> None:
    agent = define_agent(name="a", instructions="", tools=lambda _: [lookup], tool_retries=2)
    model = ScriptedModel(
        [Call("lookup", {"word": 1}, "c1")],
        [Call("lookup", {"word": 2}, "c2")],
        [Call("lookup", {"word": "owl"}, "c3")],
        ["Found."],
    )
    _, chunks = await turn(agent, model)
    assert [chunk["toolCallId"] for chunk in chunks if chunk["type"] == "tool-input-error"] == ["c1", "c2"]
    assert [chunk["toolCallId"] for chunk in chunks if chunk["type"] == "tool-output-available"] == ["c3"]
    assert model.calls == 4


async def test_invalid_input_to_a_dynamic_tool_is_flagged_dynamic() -> None:
    async def echo(call: ToolCall) -> Any:
        return call.input

    remote = Tool(
        name="remote",
        execute=echo,
        dynamic=True,
        input_schema={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    )
    _, chunks = await turn(plain(remote=remote), ScriptedModel([Call("remote", {"a": "x"}, "c1")], ["ok"]))
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-input-error"]
    assert error["dynamic"] is True and error["errorText"].startswith("Invalid input: ")


async def test_a_call_its_policy_refuses_at_execution_shows_the_denied_output_to_both_sides() -> None:
    async def send(call: ToolCall) -> str:
        raise AssertionError("never runs")

    agent = define_agent(
        name="a",
        instructions="",
        tools=lambda _: [Tool(name="send", execute=send)],
        permissions={
            "send": ToolPolicy(can_execute=lambda ctx, call: False, denied_output={"refused": True})
        },
    )
    model = ScriptedModel([Call("send", {}, "c1")], ["ok"])
    _, chunks = await turn(agent, model)
    [output] = [chunk for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"type": "tool-output-available", "toolCallId": "c1", "output": {"refused": True}}
    returns = [
        part
        for message in model.requests[1].messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    assert [(r.tool_name, r.tool_call_id, r.content, r.outcome) for r in returns] == [
        ("send", "c1", {"refused": True}, "denied")
    ]


async def test_a_cancel_while_text_streams_ends_the_open_text_part() -> None:
    cancel = asyncio.Event()

    async def cut_off(messages: list[Any], info: AgentInfo) -> AsyncIterator[Any]:
        yield "Partial"
        cancel.set()
        await asyncio.Event().wait()
        yield "never"

    session = await plain().prepare(context=None, cancel=cancel)
    result = await session.stream(model=FunctionModel(stream_function=cut_off), messages=[user("hi")])
    assert await collect(result) == [
        {"type": "start-step"},
        {"type": "text-start", "id": "0-0"},
        {"type": "text-delta", "id": "0-0", "delta": "Partial"},
        {"type": "text-end", "id": "0-0"},
        {"type": "finish-step"},
    ]


async def test_arguments_to_a_dynamic_tool_that_are_not_an_object_are_flagged_dynamic() -> None:
    async def echo(call: ToolCall) -> Any:
        return call.input

    remote = Tool(name="remote", execute=echo, dynamic=True)
    _, chunks = await turn(plain(remote=remote), ScriptedModel([Call("remote", "[1]", "c1")], ["ok"]))
    [error] = [chunk for chunk in chunks if chunk["type"] == "tool-input-error"]
    assert error["dynamic"] is True and error["input"] == {}
