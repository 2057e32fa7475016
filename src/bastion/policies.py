"""Application-defined permissions for tools: exposure, execution, approval and what the model may see.

Each concern is decided independently and fails closed: an error in a visibility or execution check
denies, an error in an approval predicate requires approval, and a failing projection or error
formatter gives the model the denial or a generic error instead of the raw value.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from bastion.errors import ToolError
from bastion.tools import Tool, ToolCall, ToolDenial, ToolExecutor, run_executor

__all__ = [
    "DEFAULT_DENIED_OUTPUT",
    "GENERIC_TOOL_ERROR",
    "REDACTED_OUTPUT",
    "ToolPolicy",
    "sanitize_tool_error_for_model",
    "sanitize_tool_output",
    "sanitize_tool_output_for_model",
    "with_tool_policy",
]

ContextT = TypeVar("ContextT")

logger = logging.getLogger("bastion.policies")

DEFAULT_DENIED_OUTPUT: Mapping[str, str] = {
    "error": "permission_denied",
    "message": "This tool call is not allowed.",
}
REDACTED_OUTPUT: Mapping[str, str] = {"redacted": "This result is not available."}
GENERIC_TOOL_ERROR = "Tool execution failed."


@dataclass(frozen=True, kw_only=True)
class ToolPolicy(Generic[ContextT]):
    """What one tool may do for the current context. Every field is optional.

    - `visible(context)`: whether the model is offered the tool at all (synchronous).
    - `can_execute(context, call)`: checked before every execution (again after an approval), and once
      more when the tool has returned: if it now refuses, the model is told `denied_output` instead of
      the result (the UI still gets the result, as for stored history).
    - `needs_approval`: True, or a predicate; it can add a requirement but never remove the tool's own.
    - `model_output(output, context, call)`: the projection of a result the model may see; the full
      result stays for the authorized UI.
    - `model_error(error_text, context, call)`: the error text the model and the UI may see.
    - `denied_output`: what the model is told when execution is refused.
    """

    visible: Callable[[ContextT], bool] | None = None
    can_execute: Callable[[ContextT, ToolCall], Awaitable[bool] | bool] | None = None
    needs_approval: bool | Callable[[ContextT, ToolCall], Awaitable[bool] | bool] = False
    model_output: Callable[[Any, ContextT, ToolCall], Any] | None = None
    model_error: Callable[[str, ContextT, ToolCall], str] | None = None
    denied_output: Any = field(default_factory=lambda: dict(DEFAULT_DENIED_OUTPUT))

    @property
    def guards_execution(self) -> bool:
        return (
            self.can_execute is not None
            or self.needs_approval is not False
            or self.model_output is not None
            or self.model_error is not None
        )


def is_visible(policy: ToolPolicy[ContextT], context: ContextT) -> bool:
    if policy.visible is None:
        return True
    try:
        decision = policy.visible(context)
    except Exception:
        logger.warning("Tool visibility check failed; hiding the tool.", exc_info=True)
        return False
    if inspect.iscoroutine(decision):
        decision.close()
        logger.warning("Tool visibility checks must be synchronous; hiding the tool.")
        return False
    return decision is True


async def is_execution_allowed(policy: ToolPolicy[ContextT], context: ContextT, call: ToolCall) -> bool:
    if policy.can_execute is None:
        return True
    try:
        decision = policy.can_execute(context, _copy_call(call))
        if inspect.isawaitable(decision):
            decision = await decision
    except Exception:
        logger.warning("Tool execution check failed; denying %s.", call.tool_name, exc_info=True)
        return False
    return decision is True


async def _policy_requires_approval(policy: ToolPolicy[ContextT], context: ContextT, call: ToolCall) -> bool:
    requirement = policy.needs_approval
    if not callable(requirement):
        return requirement is not False
    try:
        decision = requirement(context, _copy_call(call))
        if inspect.isawaitable(decision):
            decision = await decision
    except Exception:
        logger.warning("Tool approval check failed; requiring approval.", exc_info=True)
        return True
    return decision is not False


async def sign_in_card(item: Tool, call: ToolCall) -> tuple[dict[str, Any] | None, str | None]:
    """The card that pauses the call until the user signs in (`Tool.sign_in`), or the refusal to show."""
    if item.sign_in is None:
        return None, None
    try:
        card = await item.sign_in(call)
    except ToolError as error:
        return None, error.message
    return (None if card is None else dict(card)), None


async def tool_requires_approval(item: Tool, call: ToolCall) -> bool:
    """The tool's own approval requirement; a failing predicate requires approval."""
    requirement = item.needs_approval
    if not callable(requirement):
        return requirement is not False
    try:
        decision = requirement(_copy_call(call))
        if inspect.isawaitable(decision):
            decision = await decision
    except Exception:
        logger.warning("Tool approval check failed; requiring approval.", exc_info=True)
        return True
    return decision is not False


def _copy_call(call: ToolCall) -> ToolCall:
    """Policies get their own copy of the input, so they cannot change what runs or what is stored."""
    return replace(call, input=copy.deepcopy(call.input))


def project_output(policy: ToolPolicy[ContextT], output: Any, context: ContextT, call: ToolCall) -> Any:
    """The model's view of a result; a failing projection gives the denial instead of the raw value."""
    if isinstance(output, ToolDenial) or policy.model_output is None:
        return output
    try:
        return policy.model_output(copy.deepcopy(output), context, _copy_call(call))
    except Exception:
        logger.warning("Tool output projection failed; withholding the result.", exc_info=True)
        return _denial(policy)


def _unwrap(value: Any) -> Any:
    return value.output if isinstance(value, ToolDenial) else value


def format_error(policy: ToolPolicy[ContextT], error_text: str, context: ContextT, call: ToolCall) -> str:
    """The error text the model and the UI see; a failing formatter gives a generic error."""
    if policy.model_error is None:
        return error_text
    try:
        formatted = policy.model_error(error_text, context, _copy_call(call))
    except Exception:
        logger.warning("Tool error formatter failed; using a generic error.", exc_info=True)
        return GENERIC_TOOL_ERROR
    return formatted if isinstance(formatted, str) else GENERIC_TOOL_ERROR


def with_tool_policy(
    tools: Iterable[Tool],
    *,
    context: ContextT,
    policies: Mapping[str, ToolPolicy[ContextT]],
) -> list[Tool]:
    """Apply a permission map to a tool source: only listed, visible tools remain, each guarded.

    A tool that is not in the map is not exposed, so a remote server adding a tool grants nothing.
    """
    guarded: list[Tool] = []
    for item in tools:
        policy = policies.get(item.name)
        if policy is None or not is_visible(policy, context):
            continue
        guarded.append(guard_tool(item, policy, context))
    return guarded


def guard_tool(item: Tool, policy: ToolPolicy[ContextT], context: ContextT) -> Tool:
    """The tool with its policy's checks folded into approval, execution, projection and errors."""
    if item.provider_executed:
        if policy.guards_execution:
            raise ValueError(f"Provider-executed tool {item.name!r} cannot use execution policies.")
        return item
    own_approval = item.needs_approval
    own_projection = item.model_projection
    own_error_format = item.error_format
    own_recheck = item.recheck_before_model

    async def needs_approval(call: ToolCall) -> bool:
        if await tool_requires_approval(item, call):
            return True
        return await _policy_requires_approval(policy, context, call)

    async def recheck_before_model(call: ToolCall) -> ToolDenial | None:
        """Permission revoked while the tool ran: the model is not told the result."""
        if not await is_execution_allowed(policy, context, call):
            return _denial(policy)
        return None if own_recheck is None else await own_recheck(call)

    def model_projection(output: Any, call: ToolCall) -> Any:
        projected = project_output(policy, output, context, call)
        if isinstance(projected, ToolDenial) or own_projection is None:
            return projected
        return own_projection(projected, call)

    def error_format(error_text: str, call: ToolCall) -> str:
        formatted = format_error(policy, error_text, context, call)
        return formatted if own_error_format is None else own_error_format(formatted, call)

    return replace(
        item,
        execute=_guarded_executor(item.execute, policy, context),
        needs_approval=needs_approval
        if own_approval is not False or policy.needs_approval is not False
        else False,
        model_projection=model_projection,
        error_format=error_format,
        recheck_before_model=recheck_before_model
        if policy.can_execute is not None or own_recheck is not None
        else None,
    )


def _guarded_executor(
    executor: ToolExecutor | None, policy: ToolPolicy[ContextT], context: ContextT
) -> ToolExecutor | None:
    """The executor behind the policy's execution check; a tool without one stays without one."""
    if executor is None:
        return None
    original = executor

    async def execute(call: ToolCall) -> Any:
        if not await is_execution_allowed(policy, context, call):
            return _denial(policy)
        return await run_executor(original, call)

    return execute


def _denial(policy: ToolPolicy[ContextT]) -> ToolDenial:
    """The policy's denied output, copied so that nothing downstream can change the policy's own."""
    return ToolDenial(copy.deepcopy(policy.denied_output))


def sanitize_tool_output(
    part: Mapping[str, Any],
    *,
    context: ContextT,
    policies: Mapping[str, ToolPolicy[ContextT]],
    unknown_output: Any = REDACTED_OUTPUT,
) -> dict[str, Any]:
    """A stored tool part with its output projected for sharing.

    Synchronous: it applies visibility and the output projection, not execution checks. A hidden tool
    gives its policy's `denied_output`; a tool missing from the map gives `unknown_output` (the
    redaction unless given; None is kept as a null output).
    """
    sanitized = dict(part)
    if part.get("state") != "output-available":
        return sanitized
    name = tool_part_name(part)
    if name is None or (policy := policies.get(name)) is None:
        sanitized["output"] = copy.deepcopy(unknown_output)
        return sanitized
    if not is_visible(policy, context):
        sanitized["output"] = _denial(policy).output
        return sanitized
    sanitized["output"] = _unwrap(
        project_output(policy, part.get("output"), context, _stored_call(part, name))
    )
    return sanitized


async def sanitize_tool_output_for_model(
    part: Mapping[str, Any],
    *,
    context: ContextT,
    policies: Mapping[str, ToolPolicy[ContextT]],
    unknown_output: Any = REDACTED_OUTPUT,
) -> dict[str, Any]:
    """A stored result as the model may see it now: current visibility and execution checks run again.

    A tool that is hidden or refused becomes its policy's denial; one missing from the map gives
    `unknown_output` (the redaction unless given; None is kept as a null output).
    """
    sanitized, allowed = await _checked_again(part, context, policies, unknown_output)
    if allowed is not None and part.get("state") == "output-available":
        policy, call = allowed
        sanitized["output"] = _unwrap(project_output(policy, part.get("output"), context, call))
    return sanitized


async def sanitize_tool_error_for_model(
    part: Mapping[str, Any],
    *,
    context: ContextT,
    policies: Mapping[str, ToolPolicy[ContextT]],
    unknown_output: Any = REDACTED_OUTPUT,
) -> dict[str, Any]:
    """A stored tool error as the model may see it now, with the current error formatter applied.

    Denied and missing tools are handled as by `sanitize_tool_output_for_model`.
    """
    sanitized, allowed = await _checked_again(part, context, policies, unknown_output)
    if allowed is not None and part.get("state") == "output-error":
        policy, call = allowed
        sanitized["errorText"] = format_error(policy, str(part.get("errorText", "")), context, call)
    return sanitized


async def _checked_again(
    part: Mapping[str, Any],
    context: ContextT,
    policies: Mapping[str, ToolPolicy[ContextT]],
    unknown_output: Any,
) -> tuple[dict[str, Any], tuple[ToolPolicy[ContextT], ToolCall] | None]:
    """A copy of the part, and its policy and call if today's checks still allow it (else a denial)."""
    name = tool_part_name(part)
    sanitized = dict(part)
    if name is None or (policy := policies.get(name)) is None:
        return _as_denied(sanitized, unknown_output), None
    call = _stored_call(part, name)
    if not is_visible(policy, context) or not await is_execution_allowed(policy, context, call):
        return _as_denied(sanitized, policy.denied_output), None
    return sanitized, (policy, call)


def _as_denied(part: dict[str, Any], denied_output: Any) -> dict[str, Any]:
    part.pop("errorText", None)
    part["state"] = "output-available"
    part["output"] = copy.deepcopy(denied_output)
    return part


def _stored_call(part: Mapping[str, Any], name: str) -> ToolCall:
    return ToolCall(tool_name=name, input=part.get("input"), tool_call_id=str(part.get("toolCallId", "")))


def tool_part_name(part: Mapping[str, Any]) -> str | None:
    """The tool name of a UI tool part (`tool-<name>` or `dynamic-tool`), or None for other parts."""
    kind = part.get("type")
    if not isinstance(kind, str):
        return None
    if kind == "dynamic-tool":
        name = part.get("toolName")
        return name if isinstance(name, str) else None
    if kind.startswith("tool-"):
        return kind[len("tool-") :]
    return None
