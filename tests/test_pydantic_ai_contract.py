"""The parts of pydantic-ai the loop relies on, pinned so that an upgrade changing them fails loudly.

The loop drives `Model.request_stream` through `pydantic_ai.direct.model_request_stream` and builds its own
message and tool-definition values; each test below pins one of those facts with a scripted model.
"""

from __future__ import annotations

import typing
import warnings
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pydantic_ai
import pytest
from pydantic_ai.direct import model_request_stream
from pydantic_ai.exceptions import PydanticAIDeprecationWarning
from pydantic_ai.messages import (
    ERROR_OUTCOMES,
    FinishReason,
    InstructionPart,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    RetryPromptPart,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
    ToolCallPart,
    ToolCallPartDelta,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters, infer_model
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingCalls,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)
from pydantic_ai.native_tools import WebSearchTool
from pydantic_ai.tools import ToolDefinition

StreamItem = str | DeltaToolCalls | DeltaThinkingCalls

LOOKUP = ToolDefinition(
    name="lookup",
    description="Look a word up.",
    parameters_json_schema={"type": "object", "properties": {"word": {"type": "string"}}},
    strict=None,
)


class Scripted:
    """A stream function that plays fixed items and remembers what the model was told."""

    def __init__(self, *items: StreamItem) -> None:
        self.items = items
        self.infos: list[AgentInfo] = []

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[StreamItem]:
        self.infos.append(info)
        for item in self.items:
            yield item


def user_request(text: str = "Hello") -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(content=text)])


async def stream_events(
    script: Scripted,
    *,
    messages: Sequence[ModelMessage] | None = None,
    parameters: ModelRequestParameters | None = None,
) -> tuple[list[ModelResponseStreamEvent], ModelResponse]:
    model = FunctionModel(stream_function=script)
    events: list[ModelResponseStreamEvent] = []
    async with model_request_stream(
        model,
        list(messages) if messages is not None else [user_request()],
        model_request_parameters=parameters or ModelRequestParameters(),
    ) as stream:
        async for event in stream:
            events.append(event)
        response = stream.get()
    return events, response


def part_events(events: list[ModelResponseStreamEvent]) -> list[Any]:
    """The part lifecycle events the loop translates; any other event kind is ignored by the loop."""
    return [event for event in events if isinstance(event, PartStartEvent | PartDeltaEvent | PartEndEvent)]


def test_pydantic_ai_version_is_the_pinned_one() -> None:
    assert pydantic_ai.__version__ == "2.68.0"


# Streaming events


async def test_text_stream_starts_with_the_first_chunk_then_deltas_then_ends_with_the_full_text() -> None:
    events, _ = await stream_events(Scripted("Hel", "lo", "!"))

    assert part_events(events) == [
        PartStartEvent(index=0, part=TextPart(content="Hel")),
        PartDeltaEvent(index=0, delta=TextPartDelta(content_delta="lo")),
        PartDeltaEvent(index=0, delta=TextPartDelta(content_delta="!")),
        PartEndEvent(index=0, part=TextPart(content="Hello!")),
    ]


async def test_tool_call_stream_gives_the_name_and_id_at_start_and_string_argument_deltas() -> None:
    events, _ = await stream_events(
        Scripted(
            {0: DeltaToolCall(name="lookup", json_args='{"word": ', tool_call_id="call-1")},
            {0: DeltaToolCall(json_args='"bastion"}')},
        )
    )
    start, delta, end = part_events(events)

    assert type(start) is PartStartEvent
    assert start.part == ToolCallPart(tool_name="lookup", args='{"word": ', tool_call_id="call-1")
    assert type(delta) is PartDeltaEvent
    assert type(delta.delta) is ToolCallPartDelta
    assert delta.delta.args_delta == '"bastion"}'
    assert isinstance(delta.delta.args_delta, str)
    assert delta.index == start.index
    assert type(end) is PartEndEvent
    assert end.part == ToolCallPart(tool_name="lookup", args='{"word": "bastion"}', tool_call_id="call-1")


async def test_thinking_stream_gives_thinking_part_and_deltas() -> None:
    events, _ = await stream_events(
        Scripted({0: DeltaThinkingPart(content="Let me")}, {0: DeltaThinkingPart(content=" think.")})
    )

    assert part_events(events) == [
        PartStartEvent(index=0, part=ThinkingPart(content="Let me")),
        PartDeltaEvent(index=0, delta=ThinkingPartDelta(content_delta=" think.")),
        PartEndEvent(index=0, part=ThinkingPart(content="Let me think.")),
    ]


async def test_event_indexes_are_response_positions_and_each_part_ends_before_the_next() -> None:
    events, response = await stream_events(
        Scripted(
            "Checking.",
            {
                5: DeltaToolCall(name="lookup", json_args='{"word": "a"}', tool_call_id="call-a"),
                9: DeltaToolCall(name="lookup", json_args='{"word": "b"}', tool_call_id="call-b"),
            },
        )
    )
    lifecycle = [(type(event).__name__, event.index) for event in part_events(events)]

    assert lifecycle == [
        ("PartStartEvent", 0),
        ("PartEndEvent", 0),
        ("PartStartEvent", 1),
        ("PartEndEvent", 1),
        ("PartStartEvent", 2),
        ("PartEndEvent", 2),
    ]
    assert [type(part) for part in response.parts] == [TextPart, ToolCallPart, ToolCallPart]


async def test_stream_get_returns_the_response_with_tool_calls_and_a_finish_reason_field() -> None:
    _, response = await stream_events(
        Scripted(
            "Looking it up.",
            {1: DeltaToolCall(name="lookup", json_args='{"word": "x"}', tool_call_id="call-1")},
        )
    )

    assert isinstance(response, ModelResponse)
    assert response.parts == [
        TextPart(content="Looking it up."),
        ToolCallPart(tool_name="lookup", args='{"word": "x"}', tool_call_id="call-1"),
    ]
    assert response.finish_reason is None


def test_finish_reasons_are_the_ones_the_loop_maps() -> None:
    assert set(typing.get_args(FinishReason)) == {"stop", "length", "content_filter", "tool_call", "error"}


# Tool call arguments


def test_args_as_dict_parses_json_text() -> None:
    part = ToolCallPart(tool_name="lookup", args='{"word": "x"}', tool_call_id="call-1")

    assert part.args_as_dict(raise_if_invalid=True) == {"word": "x"}


def test_args_as_dict_returns_a_dict_argument_as_is() -> None:
    part = ToolCallPart(tool_name="lookup", args={"word": "x"}, tool_call_id="call-1")

    assert part.args_as_dict(raise_if_invalid=True) == {"word": "x"}


def test_args_as_dict_gives_an_empty_dict_for_empty_arguments() -> None:
    part = ToolCallPart(tool_name="lookup", args="", tool_call_id="call-1")

    assert part.args_as_dict(raise_if_invalid=True) == {}


def test_args_as_dict_raises_value_error_on_invalid_json() -> None:
    part = ToolCallPart(tool_name="lookup", args='{"word": ', tool_call_id="call-1")

    with pytest.raises(ValueError):
        part.args_as_dict(raise_if_invalid=True)


def test_args_as_dict_raises_assertion_error_on_json_that_is_not_an_object() -> None:
    part = ToolCallPart(tool_name="lookup", args="[1, 2]", tool_call_id="call-1")

    with pytest.raises(AssertionError):
        part.args_as_dict(raise_if_invalid=True)


# Message types


@pytest.mark.parametrize("outcome", ["success", "failed", "denied", "interrupted"])
def test_tool_return_part_accepts_the_outcomes_the_loop_uses(outcome: Any) -> None:
    part = ToolReturnPart(tool_name="lookup", content="text", tool_call_id="call-1", outcome=outcome)

    assert part.outcome == outcome


def test_failed_tool_return_reaches_the_model_wrapped_as_an_error() -> None:
    part = ToolReturnPart(
        tool_name="lookup", content="Lookup failed.", tool_call_id="call-1", outcome="failed"
    )

    assert part.model_response_str() == '{"error":"Lookup failed."}'


def test_denied_tool_return_reaches_the_model_unwrapped() -> None:
    denied = {"error": "permission_denied", "message": "This tool call is not allowed."}
    part = ToolReturnPart(tool_name="lookup", content=denied, tool_call_id="call-1", outcome="denied")

    assert (
        part.model_response_str()
        == '{"error":"permission_denied","message":"This tool call is not allowed."}'
    )


def test_successful_tool_return_reaches_the_model_as_json() -> None:
    part = ToolReturnPart(tool_name="lookup", content={"rows": 2}, tool_call_id="call-1")

    assert (part.outcome, part.model_response_str()) == ("success", '{"rows":2}')


def test_only_failed_and_retried_outcomes_are_error_outcomes() -> None:
    assert set(ERROR_OUTCOMES) == {"failed", "retried"}


def test_retry_prompt_part_takes_content_tool_name_and_call_id() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticAIDeprecationWarning)
        part = RetryPromptPart(content="Invalid arguments.", tool_name="lookup", tool_call_id="call-1")

    assert (part.content, part.tool_name, part.tool_call_id) == ("Invalid arguments.", "lookup", "call-1")
    assert "Invalid arguments." in part.model_response()


def test_tool_return_part_accepts_the_retried_outcome_that_replaces_retry_prompt_part() -> None:
    part = ToolReturnPart(
        tool_name="lookup", content="Invalid arguments.", tool_call_id="call-1", outcome="retried"
    )

    assert part.model_response_str() == '{"error":"Invalid arguments."}'


def test_model_request_instructions_is_settable() -> None:
    request = user_request()
    request.instructions = "Be brief."

    assert request.instructions == "Be brief."


def test_tool_definition_takes_name_description_schema_and_strict() -> None:
    schema = {"type": "object", "properties": {"word": {"type": "string"}}}
    definition = ToolDefinition(
        name="lookup", description="Look a word up.", parameters_json_schema=schema, strict=True
    )

    assert (
        definition.name,
        definition.description,
        definition.parameters_json_schema,
        definition.strict,
    ) == (
        "lookup",
        "Look a word up.",
        schema,
        True,
    )


def test_model_request_parameters_takes_the_fields_the_loop_sets() -> None:
    native = WebSearchTool()
    parameters = ModelRequestParameters(
        function_tools=[LOOKUP],
        native_tools=[native],
        allow_text_output=True,
        instruction_parts=[InstructionPart(content="Be brief.")],
    )

    assert parameters.function_tools == [LOOKUP]
    assert parameters.native_tools == [native]
    assert parameters.allow_text_output is True
    assert parameters.instruction_parts == [InstructionPart(content="Be brief.")]


def test_instruction_part_takes_content() -> None:
    assert InstructionPart(content="Be brief.").content == "Be brief."


# What the model is told


async def test_function_model_sees_instruction_parts_joined_as_its_instructions() -> None:
    script = Scripted("ok")
    parameters = ModelRequestParameters(
        instruction_parts=[InstructionPart(content="Be brief."), InstructionPart(content="Skills: pdf.")]
    )

    await stream_events(script, parameters=parameters)

    assert script.infos[0].instructions == "Be brief.\n\nSkills: pdf."


async def test_function_model_sees_the_latest_requests_instructions() -> None:
    script = Scripted("ok")
    request = user_request()
    request.instructions = "Answer in French."

    await stream_events(script, messages=[request])

    assert script.infos[0].instructions == "Answer in French."


async def test_function_model_sees_the_function_tools() -> None:
    script = Scripted("ok")

    await stream_events(script, parameters=ModelRequestParameters(function_tools=[LOOKUP]))

    assert script.infos[0].function_tools == [LOOKUP]


# Model resolution


def test_infer_model_resolves_a_model_name_to_a_model() -> None:
    assert isinstance(infer_model("test"), Model)


def test_model_has_request_stream() -> None:
    assert callable(Model.request_stream)
