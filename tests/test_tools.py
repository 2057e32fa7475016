"""Tools: definition, input validation, composition of tool sources, and how executors are run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import jsonschema
import pydantic
import pytest
from pydantic_ai.native_tools import WebSearchTool

from bastion.tools import (
    DuplicateToolNameError,
    Tool,
    ToolCall,
    ToolDenial,
    ToolInputError,
    compose_tools,
    index_tools,
    run_executor,
    tool,
)


def make_tool(name: str, **fields: Any) -> Tool:
    fields.setdefault("description", f"The {name} tool.")
    return Tool(name=name, **fields)


def call_for(name: str, arguments: Any, call_id: str = "call-1") -> ToolCall:
    return ToolCall(tool_name=name, input=arguments, tool_call_id=call_id)


class Address(pydantic.BaseModel):
    city: str
    postcode: str | None = None


# compose_tools


def test_compose_tools_keeps_every_tool_in_source_order() -> None:
    composed = compose_tools([make_tool("a"), make_tool("b")], [make_tool("c")], [make_tool("d")])

    assert [item.name for item in composed] == ["a", "b", "c", "d"]


def test_compose_tools_refuses_a_duplicate_between_base_and_extension_naming_the_tool() -> None:
    with pytest.raises(DuplicateToolNameError, match="change_plan") as raised:
        compose_tools([make_tool("change_plan")], [make_tool("change_plan")])

    assert raised.value.tool_name == "change_plan"


def test_compose_tools_refuses_a_duplicate_between_two_extensions() -> None:
    with pytest.raises(DuplicateToolNameError, match="search"):
        compose_tools([make_tool("a")], [make_tool("search")], [make_tool("search")])


def test_compose_tools_refuses_a_duplicate_inside_one_source() -> None:
    with pytest.raises(DuplicateToolNameError, match="search"):
        compose_tools([make_tool("search"), make_tool("search")])


def test_compose_tools_replaces_a_tool_only_through_overrides() -> None:
    original = make_tool("search", description="original")
    replacement = make_tool("search", description="replacement")

    composed = compose_tools([original, make_tool("other")], overrides=[replacement])

    assert [item.name for item in composed] == ["search", "other"]
    assert composed[0] is replacement


def test_compose_tools_refuses_an_override_for_an_unknown_tool() -> None:
    with pytest.raises(ValueError, match="serach"):
        compose_tools([make_tool("search")], overrides=[make_tool("serach")])


def test_compose_tools_refuses_two_overrides_for_one_tool() -> None:
    with pytest.raises(DuplicateToolNameError, match="search"):
        compose_tools([make_tool("search")], overrides=[make_tool("search"), make_tool("search")])


def test_compose_tools_does_not_mutate_its_inputs() -> None:
    base = [make_tool("search"), make_tool("read")]
    extension = [make_tool("write")]
    overrides = [make_tool("search", description="replacement")]
    before = (list(base), list(extension), list(overrides))

    composed = compose_tools(base, extension, overrides=overrides)
    composed.append(make_tool("extra"))

    assert (base, extension, overrides) == before
    assert base[0].description == "The search tool."


# index_tools


def test_index_tools_maps_names_to_tools() -> None:
    search, read = make_tool("search"), make_tool("read")

    assert index_tools([search, read]) == {"search": search, "read": read}


def test_index_tools_refuses_duplicate_names() -> None:
    with pytest.raises(DuplicateToolNameError, match="search"):
        index_tools([make_tool("search"), make_tool("search")])


# Tool names


@pytest.mark.parametrize("name", ["search", "read-file", "documents__read", "A1", "x" * 128])
def test_tool_accepts_well_formed_names(name: str) -> None:
    assert Tool(name=name).name == name


@pytest.mark.parametrize(
    "name", ["", "x" * 129, "has space", "dotted.name", "slash/name", "émoji", "semi;colon"]
)
def test_tool_refuses_malformed_names(name: str) -> None:
    with pytest.raises(ValueError, match="Tool name"):
        Tool(name=name)


def test_tool_refuses_a_name_with_a_trailing_newline() -> None:
    with pytest.raises(ValueError, match="Tool name"):
        Tool(name="search\n")


# The tool decorator


def test_tool_decorator_builds_the_schema_from_typed_parameters() -> None:
    @tool
    def forecast(city: str, days: int = 3) -> str:
        """Forecast the weather."""
        return city

    schema = forecast.input_schema
    assert schema["type"] == "object"
    assert schema["properties"]["city"]["type"] == "string"
    assert schema["properties"]["days"]["type"] == "integer"
    assert schema["properties"]["days"]["default"] == 3
    assert schema["required"] == ["city"]
    assert schema["additionalProperties"] is False
    assert "title" not in schema


def test_tool_decorator_describes_nested_models_in_the_schema() -> None:
    @tool
    def ship(address: Address) -> str:
        """Ship a parcel."""
        return address.city

    definitions = ship.input_schema["$defs"]
    assert ship.input_schema["properties"]["address"] == {"$ref": "#/$defs/Address"}
    assert definitions["Address"]["required"] == ["city"]


async def test_tool_decorator_resolves_types_defined_where_the_tool_is_defined() -> None:
    """This module postpones annotations, so `Parcel` is a string that only this function's scope knows."""

    class Parcel(pydantic.BaseModel):
        weight_kg: float

    received: list[Any] = []

    @tool
    def weigh(parcel: Parcel) -> str:
        received.append(parcel)
        return "weighed"

    @tool(name="weigh_again")
    def weigh_again(parcel: Parcel) -> str:
        return "weighed"

    assert weigh.input_schema["$defs"]["Parcel"]["required"] == ["weight_kg"]
    assert weigh_again.input_schema["$defs"]["Parcel"]["required"] == ["weight_kg"]
    assert weigh.execute is not None
    await run_executor(weigh.execute, call_for("weigh", {"parcel": {"weight_kg": 2.5}}))
    assert received == [Parcel(weight_kg=2.5)]


def test_tool_decorator_names_a_type_it_cannot_resolve() -> None:
    def build() -> Tool:
        @tool
        def weigh(parcel: Undefined) -> str:  # type: ignore[name-defined]  # noqa: F821
            return "weighed"

        return weigh

    with pytest.raises(TypeError, match=r"weigh.*Undefined"):
        build()


def test_tool_decorator_error_names_the_path_inside_a_nested_model() -> None:
    @tool
    def ship(address: Address) -> str:
        return address.city

    with pytest.raises(ToolInputError, match="address/city"):
        ship.check_input({"address": {"postcode": "0150"}})


def test_tool_decorator_names_the_tool_after_the_function() -> None:
    @tool
    def get_identity() -> str:
        return "user-1"

    assert get_identity.name == "get_identity"


def test_tool_decorator_takes_the_description_from_the_docstrings_first_paragraph() -> None:
    @tool
    def forecast(city: str) -> str:
        """Forecast the weather
        for one city.

        Details the model does not need.
        """
        return city

    assert forecast.description == "Forecast the weather for one city."


def test_tool_decorator_keyword_arguments_override_name_and_description() -> None:
    @tool(name="weather", description="Weather for a city.")
    def forecast(city: str) -> str:
        """Ignored."""
        return city

    assert (forecast.name, forecast.description) == ("weather", "Weather for a city.")


def test_tool_decorator_without_docstring_has_an_empty_description() -> None:
    @tool
    def ping() -> str:
        return "pong"

    assert ping.description == ""


def test_tool_decorator_passes_approval_and_output_conversion_through() -> None:
    def to_text(value: Any) -> str:
        return str(value)

    @tool(needs_approval=True, to_model_output=to_text)
    def change_plan(plan: str) -> str:
        return plan

    assert change_plan.needs_approval is True
    assert change_plan.to_model_output is to_text


async def test_tool_decorator_runs_a_sync_function_with_validated_arguments() -> None:
    @tool
    def forecast(city: str, days: int = 3) -> str:
        return f"{city}:{days}"

    assert forecast.execute is not None
    assert await run_executor(forecast.execute, call_for("forecast", {"city": "Oslo"})) == "Oslo:3"


async def test_tool_decorator_awaits_an_async_function() -> None:
    @tool
    async def forecast(city: str) -> str:
        return f"sunny in {city}"

    assert forecast.execute is not None
    assert await run_executor(forecast.execute, call_for("forecast", {"city": "Oslo"})) == "sunny in Oslo"


async def test_tool_decorator_gives_nested_models_as_model_instances() -> None:
    received: list[Any] = []

    @tool
    def ship(address: Address) -> str:
        received.append(address)
        return "shipped"

    assert ship.execute is not None
    await run_executor(ship.execute, call_for("ship", {"address": {"city": "Oslo"}}))

    assert received == [Address(city="Oslo")]


async def test_tool_decorator_hides_a_tool_call_parameter_and_passes_the_call() -> None:
    received: list[ToolCall] = []

    @tool
    def change_plan(plan: str, call: ToolCall) -> str:
        received.append(call)
        return plan

    assert set(change_plan.input_schema["properties"]) == {"plan"}
    assert change_plan.input_schema["required"] == ["plan"]
    invocation = call_for("change_plan", {"plan": "pro"}, call_id="call-42")
    assert change_plan.execute is not None
    assert await run_executor(change_plan.execute, invocation) == "pro"
    assert received == [invocation]


def test_tool_decorator_refuses_a_missing_required_argument_with_a_useful_message() -> None:
    @tool
    def forecast(city: str, days: int = 3) -> str:
        return city

    with pytest.raises(ToolInputError) as raised:
        forecast.check_input({"days": 2})

    assert "city" in str(raised.value)
    assert "required" in str(raised.value).lower()


def test_tool_decorator_refuses_a_wrongly_typed_argument_naming_the_field() -> None:
    @tool
    def forecast(city: str, days: int = 3) -> str:
        return city

    with pytest.raises(ToolInputError, match="days"):
        forecast.check_input({"city": "Oslo", "days": "many"})


def test_tool_decorator_refuses_extra_keys() -> None:
    @tool
    def forecast(city: str) -> str:
        return city

    with pytest.raises(ToolInputError, match="unit"):
        forecast.check_input({"city": "Oslo", "unit": "kelvin"})


def test_tool_decorator_refuses_a_call_parameter_passed_as_an_argument() -> None:
    @tool
    def change_plan(plan: str, call: ToolCall) -> str:
        return plan

    with pytest.raises(ToolInputError, match="call"):
        change_plan.check_input({"plan": "pro", "call": {"tool_name": "x"}})


def test_tool_decorator_refuses_input_that_is_not_an_object() -> None:
    @tool
    def forecast(city: str) -> str:
        return city

    with pytest.raises(ToolInputError, match="input"):
        forecast.check_input(["Oslo"])


def test_tool_decorator_error_message_does_not_echo_the_input() -> None:
    @tool
    def forecast(city: str) -> str:
        return city

    with pytest.raises(ToolInputError) as raised:
        forecast.check_input({"city": {"secret": "hunter2"}})

    assert "hunter2" not in str(raised.value)


def test_tool_decorator_check_input_returns_the_raw_json_input() -> None:
    @tool
    def forecast(city: str, days: int = 3) -> str:
        return city

    raw = {"city": "Oslo", "days": "4"}

    assert forecast.check_input(raw) is raw


async def test_tool_decorator_executor_validates_the_input_itself() -> None:
    ran: list[str] = []

    @tool
    def forecast(city: str) -> str:
        ran.append(city)
        return city

    assert forecast.execute is not None
    with pytest.raises(ToolInputError, match="city"):
        await run_executor(forecast.execute, call_for("forecast", {}))
    assert ran == []


def test_tool_decorator_refuses_variadic_parameters() -> None:
    def anything(**kwargs: Any) -> str:
        return ""

    with pytest.raises(TypeError, match="kwargs"):
        tool(anything)


def test_tool_decorator_refuses_an_invalid_name() -> None:
    def forecast(city: str) -> str:
        return city

    with pytest.raises(ValueError, match="Tool name"):
        tool(name="weather forecast")(forecast)


# Schema-based tools


SHIP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "count": {"type": "integer", "minimum": 1}},
    "required": ["city"],
    "additionalProperties": False,
}


def test_schema_tool_accepts_input_matching_its_schema() -> None:
    ship = Tool(name="ship", input_schema=SHIP_SCHEMA)
    raw = {"city": "Oslo", "count": 2}

    assert ship.check_input(raw) is raw


def test_schema_tool_refuses_a_missing_required_property() -> None:
    ship = Tool(name="ship", input_schema=SHIP_SCHEMA)

    with pytest.raises(ToolInputError, match="'city' is a required property"):
        ship.check_input({"count": 2})


def test_schema_tool_error_names_the_path_of_the_invalid_value() -> None:
    ship = Tool(name="ship", input_schema=SHIP_SCHEMA)

    with pytest.raises(ToolInputError, match=r"^count: "):
        ship.check_input({"city": "Oslo", "count": 0})


def test_schema_tool_refuses_additional_properties_when_the_schema_does() -> None:
    ship = Tool(name="ship", input_schema=SHIP_SCHEMA)

    with pytest.raises(ToolInputError, match="extra"):
        ship.check_input({"city": "Oslo", "extra": True})


def test_schema_tool_reports_several_errors_in_one_message() -> None:
    ship = Tool(name="ship", input_schema=SHIP_SCHEMA)

    with pytest.raises(ToolInputError) as raised:
        ship.check_input({"city": 5, "count": "two"})

    assert "city" in str(raised.value)
    assert "count" in str(raised.value)


def test_schema_tool_default_schema_is_an_object_without_properties() -> None:
    ping = Tool(name="ping")

    assert ping.check_input({}) == {}
    with pytest.raises(ToolInputError):
        ping.check_input("not an object")


def test_schema_tool_uses_the_draft_the_schema_declares() -> None:
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}},
    }
    pair = Tool(name="pair", input_schema=draft7)

    with pytest.raises(ToolInputError, match="pair"):
        pair.check_input({"pair": ["a", "b"]})


def test_schema_tool_refuses_an_invalid_schema_at_construction() -> None:
    with pytest.raises(jsonschema.SchemaError):
        Tool(name="broken", input_schema={"type": "object", "properties": {"city": {"type": "town"}}})


def test_a_custom_input_validator_replaces_schema_validation() -> None:
    def only_oslo(raw: Any) -> Any:
        if raw != {"city": "Oslo"}:
            raise ToolInputError("Only Oslo.")
        return raw

    ship = Tool(name="ship", input_schema=SHIP_SCHEMA, validate_input=only_oslo)

    assert ship.check_input({"city": "Oslo"}) == {"city": "Oslo"}
    with pytest.raises(ToolInputError, match="Only Oslo"):
        ship.check_input({"city": "Bergen"})


# Provider-executed tools


def test_native_tool_is_provider_executed() -> None:
    search = Tool(name="web_search", native=WebSearchTool())

    assert search.provider_executed is True
    assert make_tool("local").provider_executed is False


def test_native_tool_refuses_a_local_executor() -> None:
    async def execute(call: ToolCall) -> str:
        return "local"

    with pytest.raises(ValueError, match="Provider-executed"):
        Tool(name="web_search", native=WebSearchTool(), execute=execute)


@pytest.mark.parametrize("requirement", [True, lambda call: True])
def test_native_tool_refuses_an_approval_requirement(requirement: Any) -> None:
    with pytest.raises(ValueError, match="Provider-executed"):
        Tool(name="web_search", native=WebSearchTool(), needs_approval=requirement)


def test_native_tool_input_is_not_validated_locally() -> None:
    search = Tool(name="web_search", native=WebSearchTool())

    assert search.check_input({"anything": 1}) == {"anything": 1}


# model_view and error_view without policies


def test_model_view_applies_the_tools_output_converter() -> None:
    item = make_tool("search", to_model_output=lambda output: f"{len(output)} rows")

    assert item.model_view([1, 2, 3], call_for("search", {})) == "3 rows"


def test_model_view_shows_a_denial_as_is_without_the_converter() -> None:
    converted: list[Any] = []
    item = make_tool("search", to_model_output=converted.append)

    assert item.model_view(ToolDenial({"error": "no"}), call_for("search", {})) == {"error": "no"}
    assert converted == []


def test_error_view_without_a_formatter_keeps_the_text() -> None:
    assert make_tool("search").error_view("Search failed.", call_for("search", {})) == "Search failed."


# run_executor


async def test_run_executor_returns_a_plain_value() -> None:
    assert await run_executor(lambda call: {"ok": True}, call_for("t", {})) == {"ok": True}


async def test_run_executor_awaits_a_coroutine() -> None:
    async def execute(call: ToolCall) -> str:
        return call.tool_call_id

    assert await run_executor(execute, call_for("t", {}, call_id="call-7")) == "call-7"


async def test_run_executor_reduces_an_async_generator_to_its_last_item() -> None:
    async def execute(call: ToolCall) -> AsyncIterator[str]:
        yield "searching"
        yield "half way"
        yield "done"

    assert await run_executor(execute, call_for("t", {})) == "done"


async def test_run_executor_reduces_an_awaited_async_iterable() -> None:
    async def progress() -> AsyncIterator[int]:
        for step in (1, 2, 3):
            yield step

    async def execute(call: ToolCall) -> AsyncIterator[int]:
        return progress()

    assert await run_executor(execute, call_for("t", {})) == 3


async def test_run_executor_gives_none_for_an_empty_async_iterable() -> None:
    nothing: list[str] = []

    async def execute(call: ToolCall) -> AsyncIterator[str]:
        for item in nothing:
            yield item

    assert await run_executor(execute, call_for("t", {})) is None


async def test_run_executor_returns_a_list_whole() -> None:
    assert await run_executor(lambda call: [1, 2, 3], call_for("t", {})) == [1, 2, 3]


async def test_run_executor_passes_the_call_to_the_executor() -> None:
    received: list[ToolCall] = []
    invocation = call_for("search", {"q": "x"}, call_id="call-9")

    await run_executor(received.append, invocation)

    assert received == [invocation]


async def test_run_executor_propagates_an_executor_error() -> None:
    async def execute(call: ToolCall) -> AsyncIterator[str]:
        yield "started"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await run_executor(execute, call_for("t", {}))


async def test_a_tool_defined_again_each_turn_reuses_its_schema_but_not_its_closure() -> None:
    def factory(user: str) -> Tool:
        @tool
        async def whoami(loud: bool = False) -> str:
            """Who the caller is."""
            return user.upper() if loud else user

        return whoami

    first, second = factory("ada"), factory("bob")
    assert first.input_schema == second.input_schema
    assert first.input_schema is not second.input_schema
    assert await _run(first, {"loud": True}) == "ADA"
    assert await _run(second, {}) == "bob"


def test_two_closures_of_one_factory_with_different_defaults_get_their_own_schema() -> None:
    def factory(default: Any) -> Tool:
        @tool
        def pick(limit: Any = default) -> Any:
            """Pick."""
            return limit

        return pick

    schemas = [
        factory(value).input_schema["properties"]["limit"]["default"] for value in (3, 1, True, 1.0, "1")
    ]

    assert [(type(value), value) for value in schemas] == [
        (int, 3),
        (int, 1),
        (bool, True),
        (float, 1.0),
        (str, "1"),
    ]


async def test_two_closures_of_one_factory_with_different_annotations_get_their_own_validator() -> None:
    def factory(allowed: tuple[str, ...]) -> Tool:
        Choice = Literal[allowed]  # an annotation local to the factory, resolved per turn

        @tool
        def choose(choice: Choice) -> str:  # type: ignore[valid-type]
            """Choose one of the caller's own options."""
            return str(choice)

        return choose

    reader, admin = factory(("read", "list")), factory(("read", "list", "delete"))

    assert reader.input_schema["properties"]["choice"]["enum"] == ["read", "list"]
    assert admin.input_schema["properties"]["choice"]["enum"] == ["read", "list", "delete"]
    assert await _run(admin, {"choice": "delete"}) == "delete"
    with pytest.raises(ToolInputError):
        reader.check_input({"choice": "delete"})
    assert reader.execute is not None
    with pytest.raises(ToolInputError):
        await _run(reader, {"choice": "delete"})


def test_closures_with_defaults_equal_but_not_the_same_value_do_not_share_a_schema() -> None:
    def factory(default: Any) -> Tool:
        @tool
        def page(tags: Any = default) -> Any:
            """Page."""
            return tags

        return page

    assert factory((1, 2)).input_schema["properties"]["tags"]["default"] == [1, 2]
    assert factory((True, 2)).input_schema["properties"]["tags"]["default"] == [True, 2]
    assert factory((True, 2)).input_schema["properties"]["tags"]["default"][0] is True


def test_closures_with_defaults_that_are_not_plain_values_build_their_own_schema() -> None:
    def factory(default: Any) -> Tool:
        @tool
        def filter_by(tags: Any = default) -> Any:
            """Filter."""
            return tags

        return filter_by

    assert factory(["a"]).input_schema["properties"]["tags"]["default"] == ["a"]
    assert factory(["b"]).input_schema["properties"]["tags"]["default"] == ["b"]


async def _run(item: Tool, arguments: dict[str, Any]) -> Any:
    assert item.execute is not None
    return await run_executor(item.execute, ToolCall(tool_name=item.name, input=arguments, tool_call_id="c"))
