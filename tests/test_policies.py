"""Tool policies: exposure, execution, approval and what the model may see, each failing closed."""

from __future__ import annotations

import copy
import gc
import inspect
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic_ai.native_tools import WebSearchTool

from bastion.policies import (
    DEFAULT_DENIED_OUTPUT,
    GENERIC_TOOL_ERROR,
    REDACTED_OUTPUT,
    ToolPolicy,
    guard_tool,
    sanitize_tool_error_for_model,
    sanitize_tool_output,
    sanitize_tool_output_for_model,
    tool_part_name,
    tool_requires_approval,
    with_tool_policy,
)
from bastion.tools import Tool, ToolCall, ToolDenial


@dataclass(frozen=True)
class Ctx:
    user_id: str
    role: str = "member"


CONTEXT = Ctx(user_id="user-1")
ADMIN = Ctx(user_id="admin-1", role="admin")
DENIED = {"error": "not_allowed", "message": "Ask an administrator."}


class Recorder:
    """An executor that records the calls it ran."""

    def __init__(self, result: Any = "ran") -> None:
        self.calls: list[ToolCall] = []
        self.result = result

    async def __call__(self, call: ToolCall) -> Any:
        self.calls.append(call)
        return self.result


def make_tool(name: str = "transfer", **fields: Any) -> Tool:
    fields.setdefault("execute", Recorder())
    return Tool(name=name, description=f"The {name} tool.", **fields)


def call_for(name: str = "transfer", arguments: Any = None, call_id: str = "call-1") -> ToolCall:
    return ToolCall(
        tool_name=name, input={"amount": 5} if arguments is None else arguments, tool_call_id=call_id
    )


def guarded(policy: ToolPolicy[Ctx], item: Tool | None = None, context: Ctx = CONTEXT) -> Tool:
    return guard_tool(item or make_tool(), policy, context)


async def execute(item: Tool, call: ToolCall | None = None) -> Any:
    assert item.execute is not None
    pending = item.execute(call or call_for(item.name))
    assert inspect.isawaitable(pending)
    return await pending


def guarded_with_recorder(policy: ToolPolicy[Ctx], **tool_fields: Any) -> tuple[Tool, Recorder]:
    recorder = Recorder()
    return guarded(policy, make_tool(execute=recorder, **tool_fields)), recorder


def raise_error(*args: Any) -> Any:
    raise RuntimeError("policy store unavailable")


async def async_value(value: Any) -> Any:
    return value


async def raise_async(*args: Any) -> Any:
    await async_value(None)
    raise PermissionError("access revoked")


def output_part(name: str = "transfer", output: Any = None, **fields: Any) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": f"tool-{name}",
        "toolCallId": "call-1",
        "state": "output-available",
        "input": {"amount": 5},
        "output": {"balance": 100, "iban": "NO93 8601 1117 947"} if output is None else output,
    }
    part.update(fields)
    return part


def error_part(name: str = "transfer", error_text: str = "Database password rejected.") -> dict[str, Any]:
    return {
        "type": f"tool-{name}",
        "toolCallId": "call-1",
        "state": "output-error",
        "input": {"amount": 5},
        "errorText": error_text,
    }


def hide_iban(output: Any, context: Ctx, call: ToolCall) -> Any:
    return {key: value for key, value in output.items() if key != "iban"}


# with_tool_policy: exposure


def test_with_tool_policy_exposes_listed_visible_tools_in_order() -> None:
    tools = [make_tool("a"), make_tool("b"), make_tool("c")]

    exposed = with_tool_policy(tools, context=CONTEXT, policies={"c": ToolPolicy(), "a": ToolPolicy()})

    assert [item.name for item in exposed] == ["a", "c"]


def test_with_tool_policy_does_not_expose_tools_missing_from_the_map() -> None:
    remote = [make_tool("search"), make_tool("delete_everything")]

    exposed = with_tool_policy(remote, context=CONTEXT, policies={"search": ToolPolicy()})

    assert [item.name for item in exposed] == ["search"]


def test_with_tool_policy_with_an_empty_map_exposes_nothing() -> None:
    assert with_tool_policy([make_tool("search")], context=CONTEXT, policies={}) == []


def test_visible_receives_the_context() -> None:
    policy: ToolPolicy[Ctx] = ToolPolicy(visible=lambda context: context.role == "admin")
    tools = [make_tool("admin_report")]

    assert with_tool_policy(tools, context=CONTEXT, policies={"admin_report": policy}) == []
    assert len(with_tool_policy(tools, context=ADMIN, policies={"admin_report": policy})) == 1


def test_visible_false_hides_the_tool() -> None:
    policy: ToolPolicy[Ctx] = ToolPolicy(visible=lambda context: False)

    assert with_tool_policy([make_tool()], context=CONTEXT, policies={"transfer": policy}) == []


def test_visible_raising_hides_the_tool() -> None:
    policy: ToolPolicy[Ctx] = ToolPolicy(visible=raise_error)

    assert with_tool_policy([make_tool()], context=CONTEXT, policies={"transfer": policy}) == []


def test_visible_returning_a_truthy_non_boolean_hides_the_tool() -> None:
    policy: ToolPolicy[Ctx] = ToolPolicy(visible=lambda context: "yes")  # type: ignore[arg-type,return-value]

    assert with_tool_policy([make_tool()], context=CONTEXT, policies={"transfer": policy}) == []


def test_an_async_visibility_check_hides_the_tool_without_leaving_a_coroutine_behind() -> None:
    async def visible(context: Ctx) -> bool:
        return True

    policy: ToolPolicy[Ctx] = ToolPolicy(visible=visible)  # type: ignore[arg-type]

    gc.collect()  # garbage from earlier tests must not be counted here
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert with_tool_policy([make_tool()], context=CONTEXT, policies={"transfer": policy}) == []
        gc.collect()

    never_awaited = [w for w in caught if "was never awaited" in str(w.message)]
    assert never_awaited == []


def test_with_tool_policy_keeps_dynamic_identity() -> None:
    remote = make_tool("docs__read", dynamic=True)

    [exposed] = with_tool_policy([remote], context=CONTEXT, policies={"docs__read": ToolPolicy()})

    assert exposed.dynamic is True


def test_with_tool_policy_does_not_change_the_original_tools() -> None:
    original = make_tool()
    snapshot = copy.copy(original)
    policy: ToolPolicy[Ctx] = ToolPolicy(can_execute=lambda context, call: False)

    with_tool_policy([original], context=CONTEXT, policies={"transfer": policy})

    assert original == snapshot


# Provider-executed tools


def test_native_tool_with_only_a_visibility_policy_is_kept_unchanged() -> None:
    search = Tool(name="web_search", native=WebSearchTool())

    exposed = with_tool_policy([search], context=CONTEXT, policies={"web_search": ToolPolicy()})

    assert exposed == [search]


@pytest.mark.parametrize(
    "policy",
    [
        ToolPolicy(can_execute=lambda context, call: True),
        ToolPolicy(needs_approval=True),
        ToolPolicy(needs_approval=lambda context, call: False),
        ToolPolicy(model_output=lambda output, context, call: output),
        ToolPolicy(model_error=lambda error, context, call: error),
    ],
    ids=["can_execute", "needs_approval", "approval_predicate", "model_output", "model_error"],
)
def test_native_tool_refuses_execution_guards_at_setup(policy: ToolPolicy[Ctx]) -> None:
    search = Tool(name="web_search", native=WebSearchTool())

    with pytest.raises(ValueError, match="Provider-executed"):
        with_tool_policy([search], context=CONTEXT, policies={"web_search": policy})


# can_execute


async def test_allowed_call_runs_the_executor_with_the_call() -> None:
    item, recorder = guarded_with_recorder(ToolPolicy(can_execute=lambda context, call: True))
    call = call_for(arguments={"amount": 7}, call_id="call-3")

    assert await execute(item, call) == "ran"
    assert recorder.calls == [call]


async def test_async_can_execute_true_runs_the_executor() -> None:
    item = guarded(ToolPolicy(can_execute=lambda context, call: async_value(True)))

    assert await execute(item) == "ran"


async def test_a_policy_without_can_execute_runs_the_executor() -> None:
    item = guarded(ToolPolicy())

    assert await execute(item) == "ran"


@pytest.mark.parametrize(
    "can_execute",
    [
        lambda context, call: False,
        raise_error,
        lambda context, call: async_value(False),
        raise_async,
        lambda context, call: 1,
        lambda context, call: "yes",
        lambda context, call: async_value({"allowed": True}),
        lambda context, call: None,
    ],
    ids=["false", "raising", "async-false", "async-raising", "one", "string", "async-dict", "none"],
)
async def test_can_execute_denies_unless_it_returns_true(can_execute: Any) -> None:
    item, recorder = guarded_with_recorder(ToolPolicy(can_execute=can_execute))

    result = await execute(item)

    assert result == ToolDenial(dict(DEFAULT_DENIED_OUTPUT))
    assert recorder.calls == []


async def test_denial_carries_the_policys_denied_output() -> None:
    item = guarded(ToolPolicy(can_execute=lambda context, call: False, denied_output=DENIED))

    assert await execute(item) == ToolDenial(DENIED)


async def test_can_execute_receives_the_context_and_the_call() -> None:
    seen: list[tuple[Ctx, ToolCall]] = []

    def can_execute(context: Ctx, call: ToolCall) -> bool:
        seen.append((context, call))
        return True

    call = call_for(arguments={"amount": 9}, call_id="call-5")
    await execute(guarded(ToolPolicy(can_execute=can_execute), context=ADMIN), call)

    assert seen == [(ADMIN, call)]


async def test_can_execute_is_checked_before_every_execution() -> None:
    answers = iter([True, False])
    item, recorder = guarded_with_recorder(ToolPolicy(can_execute=lambda context, call: next(answers)))

    assert await execute(item) == "ran"
    assert isinstance(await execute(item), ToolDenial)
    assert len(recorder.calls) == 1


async def test_can_execute_mutating_the_input_does_not_change_what_the_executor_gets() -> None:
    def can_execute(context: Ctx, call: ToolCall) -> bool:
        call.input["amount"] = 1_000_000
        return True

    item, recorder = guarded_with_recorder(ToolPolicy(can_execute=can_execute))
    call = call_for(arguments={"amount": 5})

    await execute(item, call)

    assert recorder.calls[0].input == {"amount": 5}
    assert call.input == {"amount": 5}


async def test_guarded_executor_reduces_an_async_iterable_to_its_final_value() -> None:
    async def progress(call: ToolCall) -> AsyncIterator[str]:
        yield "working"
        yield "done"

    item = guarded(ToolPolicy(can_execute=lambda context, call: True), make_tool(execute=progress))

    assert await execute(item) == "done"


async def test_guarding_a_tool_without_an_executor_keeps_it_without_one() -> None:
    client_tool = Tool(name="confirm_address")

    item = guard_tool(client_tool, ToolPolicy(can_execute=lambda context, call: True), CONTEXT)

    assert item.execute is None


# needs_approval


def test_a_tool_without_any_approval_requirement_stays_without_one() -> None:
    assert guarded(ToolPolicy()).needs_approval is False


async def test_policy_approval_true_adds_a_requirement() -> None:
    item = guarded(ToolPolicy(needs_approval=True))

    assert await tool_requires_approval(item, call_for()) is True


@pytest.mark.parametrize(
    "policy_requirement",
    [False, lambda context, call: False, lambda context, call: async_value(False)],
    ids=["false", "predicate", "async-predicate"],
)
async def test_policy_cannot_remove_the_tools_own_approval(policy_requirement: Any) -> None:
    item = guarded(ToolPolicy(needs_approval=policy_requirement), make_tool(needs_approval=True))

    assert await tool_requires_approval(item, call_for()) is True


async def test_policy_cannot_remove_the_tools_own_approval_predicate() -> None:
    own = make_tool(needs_approval=lambda call: call.input["amount"] > 100)
    item = guarded(ToolPolicy(needs_approval=lambda context, call: False), own)

    assert await tool_requires_approval(item, call_for(arguments={"amount": 500})) is True
    assert await tool_requires_approval(item, call_for(arguments={"amount": 5})) is False


async def test_policy_approval_predicate_receives_context_and_call() -> None:
    policy: ToolPolicy[Ctx] = ToolPolicy(needs_approval=lambda context, call: context.role != "admin")

    assert await tool_requires_approval(guarded(policy, context=CONTEXT), call_for()) is True
    assert await tool_requires_approval(guarded(policy, context=ADMIN), call_for()) is False


async def test_async_policy_approval_predicate_is_awaited() -> None:
    async def needs_approval(context: Ctx, call: ToolCall) -> bool:
        return bool(call.input["amount"] > 100)

    item = guarded(ToolPolicy(needs_approval=needs_approval))

    assert await tool_requires_approval(item, call_for(arguments={"amount": 500})) is True
    assert await tool_requires_approval(item, call_for(arguments={"amount": 5})) is False


@pytest.mark.parametrize(
    "predicate",
    [raise_error, raise_async],
    ids=["raising", "async-raising"],
)
async def test_policy_approval_predicate_error_requires_approval(predicate: Any) -> None:
    item = guarded(ToolPolicy(needs_approval=predicate))

    assert await tool_requires_approval(item, call_for()) is True


async def test_policy_approval_predicate_returning_a_non_boolean_requires_approval() -> None:
    item = guarded(ToolPolicy(needs_approval=lambda context, call: None))  # type: ignore[arg-type,return-value]

    assert await tool_requires_approval(item, call_for()) is True


async def test_tools_own_approval_predicate_error_requires_approval() -> None:
    item = make_tool(needs_approval=raise_error)

    assert await tool_requires_approval(item, call_for()) is True


async def test_tools_own_async_approval_predicate_is_awaited() -> None:
    item = make_tool(needs_approval=lambda call: async_value(False))

    assert await tool_requires_approval(item, call_for()) is False


async def test_approval_predicate_mutating_the_input_does_not_change_the_call() -> None:
    def needs_approval(context: Ctx, call: ToolCall) -> bool:
        call.input["amount"] = 0
        return False

    item, recorder = guarded_with_recorder(ToolPolicy(needs_approval=needs_approval))
    call = call_for(arguments={"amount": 5})

    await tool_requires_approval(item, call)
    await execute(item, call)

    assert call.input == {"amount": 5}
    assert recorder.calls[0].input == {"amount": 5}


# model_output


def test_model_output_projects_the_result_for_the_model() -> None:
    item = guarded(ToolPolicy(model_output=hide_iban))

    assert item.model_view({"balance": 100, "iban": "NO93"}, call_for()) == {"balance": 100}


def test_model_output_receives_context_and_call() -> None:
    seen: list[tuple[Ctx, ToolCall]] = []

    def projection(output: Any, context: Ctx, call: ToolCall) -> Any:
        seen.append((context, call))
        return output

    call = call_for(call_id="call-8")
    guarded(ToolPolicy(model_output=projection), context=ADMIN).model_view({}, call)

    assert seen == [(ADMIN, call)]


def test_model_output_runs_before_the_tools_own_conversion() -> None:
    converted: list[Any] = []

    def to_model_output(output: Any) -> str:
        converted.append(output)
        return f"balance {output['balance']}"

    item = guarded(ToolPolicy(model_output=hide_iban), make_tool(to_model_output=to_model_output))

    assert item.model_view({"balance": 100, "iban": "NO93"}, call_for()) == "balance 100"
    assert converted == [{"balance": 100}]


def test_model_output_error_falls_back_to_the_denied_output_without_conversion() -> None:
    converted: list[Any] = []
    item = guarded(
        ToolPolicy(model_output=raise_error, denied_output=DENIED),
        make_tool(to_model_output=converted.append),
    )

    assert item.model_view({"balance": 100, "iban": "NO93"}, call_for()) == DENIED
    assert converted == []


def test_model_output_cannot_mutate_the_full_result() -> None:
    def projection(output: Any, context: Ctx, call: ToolCall) -> Any:
        output.pop("iban")
        return output

    full = {"balance": 100, "iban": "NO93"}

    assert guarded(ToolPolicy(model_output=projection)).model_view(full, call_for()) == {"balance": 100}
    assert full == {"balance": 100, "iban": "NO93"}


def test_denial_bypasses_the_projection_and_the_tools_converter() -> None:
    projected: list[Any] = []
    converted: list[Any] = []

    def projection(output: Any, context: Ctx, call: ToolCall) -> Any:
        projected.append(output)
        return output

    item = guarded(ToolPolicy(model_output=projection), make_tool(to_model_output=converted.append))

    assert item.model_view(ToolDenial(DENIED), call_for()) == DENIED
    assert (projected, converted) == ([], [])


async def test_denied_execution_is_shown_to_the_model_as_the_denied_output() -> None:
    converted: list[Any] = []
    item = guarded(
        ToolPolicy(can_execute=lambda context, call: False, denied_output=DENIED),
        make_tool(to_model_output=converted.append),
    )

    result = await execute(item)

    assert item.model_view(result, call_for()) == DENIED
    assert converted == []


def test_guarding_twice_applies_both_projections_outer_first() -> None:
    def first(output: Any, context: Ctx, call: ToolCall) -> Any:
        return [*output, "inner"]

    def second(output: Any, context: Ctx, call: ToolCall) -> Any:
        return [*output, "outer"]

    inner = guarded(ToolPolicy(model_output=first))
    outer = guard_tool(inner, ToolPolicy(model_output=second), CONTEXT)

    assert outer.model_view([], call_for()) == ["outer", "inner"]


# recheck_before_model


def test_a_policy_without_can_execute_adds_no_recheck() -> None:
    assert guarded(ToolPolicy(model_output=hide_iban)).recheck_before_model is None


async def test_the_recheck_gives_the_policys_denied_output_once_execution_is_refused() -> None:
    allowed = [True]
    item = guarded(ToolPolicy(can_execute=lambda context, call: allowed[0], denied_output=DENIED))
    assert item.recheck_before_model is not None

    assert await item.recheck_before_model(call_for()) is None
    allowed[0] = False
    denial = await item.recheck_before_model(call_for())

    assert denial == ToolDenial(DENIED)
    assert denial is not None and denial.output is not DENIED


@pytest.mark.parametrize(
    ("inner_allows", "outer_allows", "denied"),
    [(False, True, {"error": "inner"}), (True, False, {"error": "outer"}), (True, True, None)],
    ids=["inner-refuses", "outer-refuses", "both-allow"],
)
async def test_guarding_twice_rechecks_both_policies(
    inner_allows: bool, outer_allows: bool, denied: Any
) -> None:
    inner = guarded(
        ToolPolicy(can_execute=lambda context, call: inner_allows, denied_output={"error": "inner"})
    )
    outer = guard_tool(inner, ToolPolicy(model_output=hide_iban), CONTEXT)
    outermost = guard_tool(
        outer,
        ToolPolicy(can_execute=lambda context, call: outer_allows, denied_output={"error": "outer"}),
        CONTEXT,
    )
    assert outer.recheck_before_model is not None and outermost.recheck_before_model is not None

    denial = await outermost.recheck_before_model(call_for())

    assert (denial.output if denial is not None else None) == denied


# model_error


def test_model_error_redacts_the_error_text() -> None:
    item = guarded(ToolPolicy(model_error=lambda error, context, call: "The transfer failed."))

    assert item.error_view("password=hunter2 rejected", call_for()) == "The transfer failed."


def test_model_error_receives_the_text_context_and_call() -> None:
    seen: list[tuple[str, Ctx, ToolCall]] = []

    def model_error(error: str, context: Ctx, call: ToolCall) -> str:
        seen.append((error, context, call))
        return "redacted"

    call = call_for(call_id="call-4")
    guarded(ToolPolicy(model_error=model_error), context=ADMIN).error_view("boom", call)

    assert seen == [("boom", ADMIN, call)]


def test_failing_model_error_gives_a_generic_error() -> None:
    item = guarded(ToolPolicy(model_error=raise_error))

    assert item.error_view("password=hunter2 rejected", call_for()) == GENERIC_TOOL_ERROR
    assert GENERIC_TOOL_ERROR == "Tool execution failed."


def test_model_error_returning_a_non_string_gives_a_generic_error() -> None:
    item = guarded(ToolPolicy(model_error=lambda error, context, call: {"error": error}))  # type: ignore[arg-type,return-value]

    assert item.error_view("password=hunter2 rejected", call_for()) == GENERIC_TOOL_ERROR


def test_without_model_error_the_error_text_is_kept() -> None:
    assert guarded(ToolPolicy()).error_view("Insufficient funds.", call_for()) == "Insufficient funds."


# sanitize_tool_output


def test_sanitize_tool_output_redacts_unknown_tools_by_default() -> None:
    sanitized = sanitize_tool_output(output_part("removed_tool"), context=CONTEXT, policies={})

    assert sanitized["output"] == REDACTED_OUTPUT


@pytest.mark.parametrize("unknown_output", [{"hidden": True}, "gone", None], ids=["object", "text", "null"])
def test_sanitize_tool_output_gives_unknown_tools_the_unknown_output(unknown_output: Any) -> None:
    part = output_part("removed_tool")

    sanitized = sanitize_tool_output(part, context=CONTEXT, policies={}, unknown_output=unknown_output)

    assert sanitized == {**part, "output": unknown_output}


def test_sanitize_tool_output_unknown_output_is_a_copy() -> None:
    unknown = {"hidden": ["row"]}

    sanitized = sanitize_tool_output(
        output_part("removed_tool"), context=CONTEXT, policies={}, unknown_output=unknown
    )
    sanitized["output"]["hidden"].append("leaked")

    assert unknown == {"hidden": ["row"]}


@pytest.mark.parametrize("visible", [lambda context: False, raise_error], ids=["hidden", "check-raising"])
def test_sanitize_tool_output_gives_a_hidden_tool_its_policys_denied_output(visible: Any) -> None:
    policies = {"transfer": ToolPolicy[Ctx](visible=visible, denied_output=DENIED)}

    sanitized = sanitize_tool_output(
        output_part(), context=CONTEXT, policies=policies, unknown_output={"unknown": True}
    )

    assert sanitized == {**output_part(), "output": DENIED}


def test_sanitize_tool_output_gives_a_hidden_tool_the_default_denial() -> None:
    policies = {"transfer": ToolPolicy[Ctx](visible=lambda context: False)}

    sanitized = sanitize_tool_output(output_part(), context=CONTEXT, policies=policies)

    assert sanitized["output"] == DEFAULT_DENIED_OUTPUT


def test_sanitize_tool_output_applies_the_projection() -> None:
    policies = {"transfer": ToolPolicy[Ctx](model_output=hide_iban)}

    sanitized = sanitize_tool_output(output_part(), context=CONTEXT, policies=policies)

    assert sanitized == {**output_part(), "output": {"balance": 100}}


def test_sanitize_tool_output_gives_the_denied_output_when_the_projection_fails() -> None:
    policies = {"transfer": ToolPolicy[Ctx](model_output=raise_error, denied_output=DENIED)}

    sanitized = sanitize_tool_output(output_part(), context=CONTEXT, policies=policies)

    assert sanitized["output"] == DENIED


def test_sanitize_tool_output_denied_output_is_a_copy_of_the_policys() -> None:
    denied = {"error": "not_allowed"}
    policies = {"transfer": ToolPolicy[Ctx](model_output=raise_error, denied_output=denied)}

    sanitized = sanitize_tool_output(output_part(), context=CONTEXT, policies=policies)
    sanitized["output"]["leaked"] = "row data"

    assert denied == {"error": "not_allowed"}


def test_sanitize_tool_output_projects_dynamic_tool_parts_by_tool_name() -> None:
    part = {**output_part(), "type": "dynamic-tool", "toolName": "transfer"}
    policies = {"transfer": ToolPolicy[Ctx](model_output=hide_iban)}

    assert sanitize_tool_output(part, context=CONTEXT, policies=policies)["output"] == {"balance": 100}


def test_sanitize_tool_output_does_not_run_execution_checks() -> None:
    policies = {"transfer": ToolPolicy[Ctx](can_execute=lambda context, call: False, model_output=hide_iban)}

    sanitized = sanitize_tool_output(output_part(), context=CONTEXT, policies=policies)

    assert sanitized["output"] == {"balance": 100}


@pytest.mark.parametrize(
    "part",
    [
        error_part("removed_tool"),
        {**output_part("removed_tool"), "state": "input-available"},
        {**output_part("removed_tool"), "state": "approval-requested", "approval": {"id": "a-1"}},
        {"type": "text", "text": "Hello.", "state": "done"},
    ],
    ids=["output-error", "input-available", "approval-requested", "text"],
)
def test_sanitize_tool_output_leaves_parts_without_an_output_untouched(part: dict[str, Any]) -> None:
    assert sanitize_tool_output(part, context=CONTEXT, policies={}) == part


def test_sanitize_tool_output_does_not_mutate_the_part() -> None:
    def projection(output: Any, context: Ctx, call: ToolCall) -> Any:
        output.pop("iban")
        call.input.clear()
        return output

    part = output_part()
    snapshot = copy.deepcopy(part)

    sanitized = sanitize_tool_output(
        part, context=CONTEXT, policies={"transfer": ToolPolicy(model_output=projection)}
    )

    assert part == snapshot
    assert sanitized is not part


# sanitize_tool_output_for_model


async def test_output_for_model_applies_the_projection_when_still_allowed() -> None:
    policies = {"transfer": ToolPolicy[Ctx](can_execute=lambda context, call: True, model_output=hide_iban)}

    sanitized = await sanitize_tool_output_for_model(output_part(), context=CONTEXT, policies=policies)

    assert sanitized == {**output_part(), "output": {"balance": 100}}


@pytest.mark.parametrize(
    "can_execute",
    [
        lambda context, call: False,
        raise_error,
        lambda context, call: async_value(False),
        raise_async,
    ],
    ids=["false", "raising", "async-false", "async-raising"],
)
async def test_output_for_model_is_denied_when_execution_is_now_refused(can_execute: Any) -> None:
    policies = {"transfer": ToolPolicy[Ctx](can_execute=can_execute, denied_output=DENIED)}

    sanitized = await sanitize_tool_output_for_model(output_part(), context=CONTEXT, policies=policies)

    assert sanitized == {**output_part(), "output": DENIED}


async def test_output_for_model_rechecks_execution_against_the_stored_input() -> None:
    seen: list[ToolCall] = []

    async def can_execute(context: Ctx, call: ToolCall) -> bool:
        seen.append(call)
        return True

    part = output_part(input={"amount": 42}, toolCallId="call-77")

    await sanitize_tool_output_for_model(
        part, context=CONTEXT, policies={"transfer": ToolPolicy(can_execute=can_execute)}
    )

    assert seen == [ToolCall(tool_name="transfer", input={"amount": 42}, tool_call_id="call-77")]


async def test_output_for_model_is_denied_for_a_hidden_tool() -> None:
    policies = {"transfer": ToolPolicy[Ctx](visible=lambda context: False, denied_output=DENIED)}

    sanitized = await sanitize_tool_output_for_model(output_part(), context=CONTEXT, policies=policies)

    assert sanitized["output"] == DENIED


async def test_output_for_model_redacts_a_missing_tool() -> None:
    sanitized = await sanitize_tool_output_for_model(
        output_part("removed_tool"), context=CONTEXT, policies={}
    )

    assert sanitized == {**output_part("removed_tool"), "output": REDACTED_OUTPUT}


async def test_output_for_model_redacts_a_missing_dynamic_tool() -> None:
    part = {**output_part(), "type": "dynamic-tool", "toolName": "docs__delete"}

    sanitized = await sanitize_tool_output_for_model(
        part, context=CONTEXT, policies={"transfer": ToolPolicy()}
    )

    assert sanitized["output"] == REDACTED_OUTPUT


@pytest.mark.parametrize("unknown_output", [{"hidden": True}, None], ids=["object", "null"])
async def test_output_for_model_gives_a_missing_tool_the_unknown_output(unknown_output: Any) -> None:
    sanitized = await sanitize_tool_output_for_model(
        output_part("removed_tool"), context=CONTEXT, policies={}, unknown_output=unknown_output
    )

    assert sanitized == {**output_part("removed_tool"), "output": unknown_output}


async def test_output_for_model_denial_of_a_known_tool_ignores_the_unknown_output() -> None:
    policies = {"transfer": ToolPolicy[Ctx](can_execute=lambda context, call: False, denied_output=DENIED)}

    sanitized = await sanitize_tool_output_for_model(
        output_part(), context=CONTEXT, policies=policies, unknown_output={"unknown": True}
    )

    assert sanitized["output"] == DENIED


async def test_output_for_model_gives_the_denied_output_when_the_projection_fails() -> None:
    policies = {"transfer": ToolPolicy[Ctx](model_output=raise_error, denied_output=DENIED)}

    sanitized = await sanitize_tool_output_for_model(output_part(), context=CONTEXT, policies=policies)

    assert sanitized["output"] == DENIED


async def test_output_for_model_does_not_mutate_the_part() -> None:
    policies = {"transfer": ToolPolicy[Ctx](can_execute=lambda context, call: False)}
    part = output_part()
    snapshot = copy.deepcopy(part)

    sanitized = await sanitize_tool_output_for_model(part, context=CONTEXT, policies=policies)
    sanitized["output"]["message"] = "changed"

    assert part == snapshot
    assert DEFAULT_DENIED_OUTPUT["message"] == "This tool call is not allowed."


async def test_output_for_model_leaves_an_allowed_pending_call_untouched() -> None:
    part = {**output_part(), "state": "input-available"}
    del part["output"]

    sanitized = await sanitize_tool_output_for_model(
        part, context=CONTEXT, policies={"transfer": ToolPolicy()}
    )

    assert sanitized == part


# sanitize_tool_error_for_model


async def test_error_for_model_applies_the_error_formatter() -> None:
    policies = {"transfer": ToolPolicy[Ctx](model_error=lambda error, context, call: "The transfer failed.")}

    sanitized = await sanitize_tool_error_for_model(error_part(), context=CONTEXT, policies=policies)

    assert sanitized == {**error_part(), "errorText": "The transfer failed."}


async def test_error_for_model_with_a_failing_formatter_gives_a_generic_error() -> None:
    policies = {"transfer": ToolPolicy[Ctx](model_error=raise_error)}

    sanitized = await sanitize_tool_error_for_model(error_part(), context=CONTEXT, policies=policies)

    assert sanitized["errorText"] == GENERIC_TOOL_ERROR


async def test_error_for_model_without_a_formatter_keeps_the_text() -> None:
    sanitized = await sanitize_tool_error_for_model(
        error_part(), context=CONTEXT, policies={"transfer": ToolPolicy()}
    )

    assert sanitized == error_part()


@pytest.mark.parametrize(
    "policies",
    [
        {"transfer": ToolPolicy[Ctx](visible=lambda context: False, denied_output=DENIED)},
        {
            "transfer": ToolPolicy[Ctx](
                can_execute=lambda context, call: async_value(False), denied_output=DENIED
            )
        },
        {"transfer": ToolPolicy[Ctx](can_execute=raise_error, denied_output=DENIED)},
    ],
    ids=["hidden", "rejected", "check-raising"],
)
async def test_error_for_model_becomes_the_denied_output_when_access_is_gone(
    policies: dict[str, ToolPolicy[Ctx]],
) -> None:
    sanitized = await sanitize_tool_error_for_model(error_part(), context=CONTEXT, policies=policies)

    assert "errorText" not in sanitized
    assert (sanitized["state"], sanitized["output"]) == ("output-available", DENIED)


async def test_error_for_model_becomes_the_redaction_for_a_missing_tool() -> None:
    sanitized = await sanitize_tool_error_for_model(error_part("removed_tool"), context=CONTEXT, policies={})

    assert "errorText" not in sanitized
    assert (sanitized["state"], sanitized["output"]) == ("output-available", REDACTED_OUTPUT)


@pytest.mark.parametrize("unknown_output", [{"hidden": True}, None], ids=["object", "null"])
async def test_error_for_model_gives_a_missing_tool_the_unknown_output(unknown_output: Any) -> None:
    sanitized = await sanitize_tool_error_for_model(
        error_part("removed_tool"), context=CONTEXT, policies={}, unknown_output=unknown_output
    )

    assert "errorText" not in sanitized
    assert (sanitized["state"], sanitized["output"]) == ("output-available", unknown_output)


async def test_error_for_model_does_not_mutate_the_part() -> None:
    policies = {"transfer": ToolPolicy[Ctx](model_error=lambda error, context, call: "redacted")}
    part = error_part()
    snapshot = copy.deepcopy(part)

    await sanitize_tool_error_for_model(part, context=CONTEXT, policies=policies)
    await sanitize_tool_error_for_model(part, context=CONTEXT, policies={})

    assert part == snapshot


# tool_part_name


@pytest.mark.parametrize(
    ("part", "name"),
    [
        ({"type": "tool-transfer"}, "transfer"),
        ({"type": "dynamic-tool", "toolName": "docs__read"}, "docs__read"),
        ({"type": "dynamic-tool"}, None),
        ({"type": "text", "text": "hi"}, None),
        ({"type": 7}, None),
        ({}, None),
    ],
)
def test_tool_part_name_reads_static_and_dynamic_tool_parts(part: dict[str, Any], name: str | None) -> None:
    assert tool_part_name(part) == name


@pytest.mark.parametrize("misused", [None, 0])
async def test_a_misused_approval_value_still_requires_approval(misused: Any) -> None:
    policy: ToolPolicy[Ctx] = ToolPolicy(needs_approval=misused)
    [guarded] = with_tool_policy([make_tool()], context=CONTEXT, policies={"transfer": policy})
    assert await tool_requires_approval(guarded, ToolCall(tool_name="transfer", input={}, tool_call_id="c1"))


# What the operator sees: each failing policy is logged with its traceback


async def _run_visible_raising() -> None:
    with_tool_policy([make_tool()], context=CONTEXT, policies={"transfer": ToolPolicy(visible=raise_error)})


async def _run_visible_async() -> None:
    async def visible(context: Ctx) -> bool:
        return True

    with_tool_policy([make_tool()], context=CONTEXT, policies={"transfer": ToolPolicy(visible=visible)})


async def _run_can_execute_raising() -> None:
    await execute(guarded(ToolPolicy(can_execute=raise_error)))


async def _run_policy_approval_raising() -> None:
    item = guarded(ToolPolicy(needs_approval=raise_error))
    await tool_requires_approval(item, call_for())


async def _run_own_approval_raising() -> None:
    await tool_requires_approval(make_tool(needs_approval=raise_error), call_for())


async def _run_projection_raising() -> None:
    guarded(ToolPolicy(model_output=raise_error)).model_view({"balance": 1}, call_for())


async def _run_error_format_raising() -> None:
    guarded(ToolPolicy(model_error=raise_error)).error_view("failed", call_for())


@pytest.mark.parametrize(
    ("run", "message", "with_traceback"),
    [
        (_run_visible_raising, "Tool visibility check failed; hiding the tool.", True),
        (_run_visible_async, "Tool visibility checks must be synchronous; hiding the tool.", False),
        (_run_can_execute_raising, "Tool execution check failed; denying transfer.", True),
        (_run_policy_approval_raising, "Tool approval check failed; requiring approval.", True),
        (_run_own_approval_raising, "Tool approval check failed; requiring approval.", True),
        (_run_projection_raising, "Tool output projection failed; withholding the result.", True),
        (_run_error_format_raising, "Tool error formatter failed; using a generic error.", True),
    ],
    ids=["visible", "visible-async", "can-execute", "policy-approval", "own-approval", "projection", "error"],
)
async def test_a_failing_policy_is_logged_as_a_warning_with_its_cause(
    caplog: pytest.LogCaptureFixture, run: Any, message: str, with_traceback: bool
) -> None:
    with caplog.at_level("WARNING", logger="bastion.policies"):
        await run()

    [record] = [r for r in caplog.records if r.name == "bastion.policies"]
    assert (record.levelname, record.getMessage()) == ("WARNING", message)
    assert (record.exc_info is not None) is with_traceback
    if with_traceback:
        assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)


# Copies all the way down: a policy cannot reach into what runs, what is stored or its own denial


async def test_can_execute_mutating_nested_input_does_not_change_what_the_executor_gets() -> None:
    def meddle(context: Ctx, call: ToolCall) -> bool:
        call.input["payee"]["iban"] = "attacker"
        return True

    item, recorder = guarded_with_recorder(ToolPolicy(can_execute=meddle))

    await execute(item, call_for(arguments={"payee": {"iban": "NO93"}}))

    assert recorder.calls[0].input == {"payee": {"iban": "NO93"}}


def test_model_output_mutating_a_nested_value_does_not_change_the_full_result() -> None:
    def meddle(output: Any, context: Ctx, call: ToolCall) -> Any:
        output["account"]["iban"] = "hidden"
        return output

    full = {"account": {"iban": "NO93"}}

    guarded(ToolPolicy(model_output=meddle)).model_view(full, call_for())

    assert full == {"account": {"iban": "NO93"}}


NESTED_DENIAL = {"error": {"code": "not_allowed"}}


async def _denied_by_execution() -> Any:
    item = guarded(ToolPolicy(can_execute=lambda context, call: False, denied_output=NESTED_DENIAL))
    return (await execute(item)).output


async def _denied_by_recheck() -> Any:
    item = guarded(ToolPolicy(can_execute=lambda context, call: False, denied_output=NESTED_DENIAL))
    assert item.recheck_before_model is not None
    denial = await item.recheck_before_model(call_for())
    assert denial is not None
    return denial.output


async def _denied_by_failed_projection() -> Any:
    item = guarded(ToolPolicy(model_output=raise_error, denied_output=NESTED_DENIAL))
    return item.model_view({"balance": 1}, call_for())


async def _denied_for_sharing() -> Any:
    policies = {"transfer": ToolPolicy[Ctx](visible=lambda context: False, denied_output=NESTED_DENIAL)}
    return sanitize_tool_output(output_part(), context=CONTEXT, policies=policies)["output"]


async def _denied_for_the_model() -> Any:
    policies = {
        "transfer": ToolPolicy[Ctx](can_execute=lambda context, call: False, denied_output=NESTED_DENIAL)
    }
    return (await sanitize_tool_output_for_model(output_part(), context=CONTEXT, policies=policies))["output"]


@pytest.mark.parametrize(
    "deny",
    [
        _denied_by_execution,
        _denied_by_recheck,
        _denied_by_failed_projection,
        _denied_for_sharing,
        _denied_for_the_model,
    ],
    ids=["execution", "recheck", "projection", "sharing", "model"],
)
async def test_changing_a_denial_never_changes_the_policys_denied_output(deny: Any) -> None:
    denied = await deny()
    denied["error"]["code"] = "changed"

    assert NESTED_DENIAL == {"error": {"code": "not_allowed"}}


# Every check is asked about the turn's own context and the stored call


def admin_only(context: Ctx, call: ToolCall) -> bool:
    return context.role == "admin"


def for_caller(output: Any, context: Ctx, call: ToolCall) -> Any:
    return {"for": context.user_id, "call": [call.tool_name, call.input, call.tool_call_id]}


async def test_a_guarded_tool_checks_the_context_it_was_guarded_for() -> None:
    item = guard_tool(make_tool(), ToolPolicy(can_execute=admin_only), ADMIN)
    assert item.recheck_before_model is not None

    assert await execute(item) == "ran"
    assert await item.recheck_before_model(call_for()) is None


def test_sanitize_tool_output_asks_visibility_and_projection_about_the_context_and_the_stored_call() -> None:
    policies = {
        "transfer": ToolPolicy[Ctx](visible=lambda context: context.role == "admin", model_output=for_caller)
    }

    sanitized = sanitize_tool_output(output_part(toolCallId="call-9"), context=ADMIN, policies=policies)

    assert sanitized["output"] == {"for": "admin-1", "call": ["transfer", {"amount": 5}, "call-9"]}


async def test_output_for_model_asks_every_check_about_the_context_and_the_stored_call() -> None:
    policies = {
        "transfer": ToolPolicy[Ctx](
            visible=lambda context: context.role == "admin", can_execute=admin_only, model_output=for_caller
        )
    }

    sanitized = await sanitize_tool_output_for_model(
        output_part(toolCallId="call-9"), context=ADMIN, policies=policies
    )

    assert sanitized["output"] == {"for": "admin-1", "call": ["transfer", {"amount": 5}, "call-9"]}


async def test_error_for_model_asks_every_check_about_the_context() -> None:
    policies = {
        "transfer": ToolPolicy[Ctx](
            visible=lambda context: context.role == "admin",
            can_execute=admin_only,
            model_error=lambda text, context, call: f"{context.user_id}: {text}",
        )
    }

    sanitized = await sanitize_tool_error_for_model(error_part(), context=ADMIN, policies=policies)

    assert sanitized["errorText"] == "admin-1: Database password rejected."


async def test_a_stored_error_without_text_is_formatted_as_empty_text() -> None:
    part = error_part()
    del part["errorText"]
    policies = {"transfer": ToolPolicy[Ctx](model_error=lambda text, context, call: f"[{text}]")}

    sanitized = await sanitize_tool_error_for_model(part, context=CONTEXT, policies=policies)

    assert sanitized["errorText"] == "[]"


async def test_a_stored_part_without_a_call_id_is_checked_as_a_call_with_an_empty_id() -> None:
    seen: list[ToolCall] = []

    def can_execute(context: Ctx, call: ToolCall) -> bool:
        seen.append(call)
        return True

    part = output_part()
    del part["toolCallId"]

    await sanitize_tool_output_for_model(
        part, context=CONTEXT, policies={"transfer": ToolPolicy(can_execute=can_execute)}
    )

    assert seen == [ToolCall(tool_name="transfer", input={"amount": 5}, tool_call_id="")]


def test_guarding_twice_applies_both_error_formatters_outer_first_each_with_the_call() -> None:
    seen: list[str] = []

    def inner(error: str, context: Ctx, call: ToolCall) -> str:
        seen.append(call.tool_call_id)
        return f"inner({error})"

    def outer(error: str, context: Ctx, call: ToolCall) -> str:
        seen.append(call.tool_call_id)
        return f"outer({error})"

    item = guard_tool(guarded(ToolPolicy(model_error=inner)), ToolPolicy(model_error=outer), CONTEXT)

    assert item.error_view("failed", call_for(call_id="call-3")) == "inner(outer(failed))"
    assert seen == ["call-3", "call-3"]


@pytest.mark.parametrize("tool_name", [5, None, ["docs__read"]])
def test_a_dynamic_tool_part_whose_name_is_not_text_has_no_tool_name(tool_name: Any) -> None:
    assert tool_part_name({"type": "dynamic-tool", "toolName": tool_name}) is None
