"""bastion's agent loop: bounded steps on pydantic-ai's model stream, speaking UI message chunks.

The loop owns what the turn needs between model calls: argument validation (invalid input goes back
to the model as a bounded retry), approvals as a pause that ends the turn, policy checks through the
guarded executors, tool exceptions turned into tool errors, and cancellation. It yields AI SDK UI
message chunks directly, so the hot path does no translation between event types.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span
from pydantic_ai.direct import model_request_stream
from pydantic_ai.messages import (
    InstructionPart,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
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
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_core import to_jsonable_python

from bastion import _telemetry
from bastion._cancel import AgentCancelledError, this_task_is_cancelled, unless_cancelled, until_cancelled
from bastion._telemetry import TokenUsage, tool_attributes
from bastion._turn_plan import ModelSteps, TurnPlan
from bastion._ui_chunks import Chunk, close_open_parts, tool_input_error_chunk
from bastion._ui_messages import denial_text
from bastion.errors import ToolError
from bastion.policies import GENERIC_TOOL_ERROR, sign_in_card, tool_requires_approval
from bastion.tools import (
    CallOrigin,
    Tool,
    ToolCall,
    ToolDenial,
    ToolInputError,
    operation_key,
    run_executor,
)

logger = logging.getLogger("bastion.loop")

_DURABLE_IDS = uuid.UUID("5b0d3c1e-6f0a-4c59-9d1e-2a7c8b4f3e10")  # namespace of durable turns' ids

_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "content_filter": "content-filter",
    "tool_call": "tool-calls",
    "error": "error",
}


class AgentStreamResult:
    """One turn's stream: iterate it once for the UI message chunks (without `start`/`finish`).

    After iteration, `finish_reason` is the UI finish reason and `cancelled` tells whether the
    application's signal stopped the turn; `usage` is the turn's token usage and `request_usage`
    each model request's, in order. A provider error propagates from the iteration.
    """

    def __init__(
        self,
        *,
        plan: TurnPlan,
        model: Model,
        model_settings: ModelSettings | None,
        cancel: asyncio.Event | None,
        on_cancel: Callable[[], Awaitable[None]],
        steps: ModelSteps | None = None,
    ) -> None:
        self._plan = plan
        self._steps = steps
        self._model = model
        self._model_settings = model_settings
        self._cancel = cancel
        self._on_cancel = on_cancel
        self._started = False
        self._scope = steps.id_seed if steps is not None else _new_id()  # keys without persistence
        self.finish_reason: str | None = None
        self.cancelled = False
        self.messages: list[ModelMessage] = plan.history.messages
        self._turn_starts_at = len(self.messages)  # what this turn adds comes after
        # Token usage of the whole turn and of each model request, in order.
        self.usage = TokenUsage()
        self.request_usage: list[TokenUsage] = []
        self._approval_of: dict[str, str] = {}
        self._trace: Context | None = None

    def __aiter__(self) -> AsyncIterator[Chunk]:
        if self._started:
            raise RuntimeError("An agent stream can be read once.")
        self._started = True
        return self._run()

    def _is_cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    async def _run(self) -> AsyncIterator[Chunk]:
        turn = _telemetry.tracer.start_span(
            "bastion.turn", attributes={"bastion.tools": len(self._plan.tools)}
        )
        self._trace = trace.set_span_in_context(turn)
        failure: BaseException | None = None
        try:
            async for chunk in self._turn():
                yield chunk
        except AgentCancelledError:
            self.cancelled = True
            self.finish_reason = "other"
            await self._on_cancel()
        except BaseException as error:
            failure = error
            raise
        finally:
            turn.set_attribute("bastion.finish_reason", self.finish_reason or "none")
            turn.set_attribute("bastion.cancelled", self.cancelled)
            turn.set_attribute("bastion.model_requests", len(self.request_usage))
            self.usage.record(turn)
            _telemetry.end(turn, failure)

    async def _turn(self) -> AsyncIterator[Chunk]:
        plan = self._plan
        if plan.approvals:
            async for chunk in self._answer_approvals():
                yield chunk
        if plan.approvals_outstanding:
            self.finish_reason = "tool-calls"
            return
        definitions = [_definition(item) for item in plan.tools.values() if item.native is None]
        natives = [item.native for item in plan.tools.values() if item.native is not None]
        instruction_parts = [InstructionPart(content=plan.instructions)] if plan.instructions else []
        if plan.skill_instructions:
            instruction_parts.append(InstructionPart(content=plan.skill_instructions))
        if plan.tool_instructions:
            instruction_parts.append(InstructionPart(content=plan.tool_instructions, dynamic=True))
        parameters = ModelRequestParameters(
            function_tools=definitions,
            native_tools=natives,
            allow_text_output=True,
            instruction_parts=instruction_parts or None,
        )
        instructions = "\n\n".join(part.content for part in instruction_parts) or None
        retries: dict[str, int] = {}
        for step in range(plan.max_steps):
            self._check_cancel()
            _set_instructions(self.messages, instructions)
            yield {"type": "start-step"}
            calls: list[ToolCallPart] = []
            async for chunk in self._model_step(step, parameters, calls):
                yield chunk
            outcome = _StepOutcome()
            async for chunk in self._run_tools(step, calls, retries, outcome):
                yield chunk
            yield {"type": "finish-step"}
            if outcome.results:
                self.messages.append(ModelRequest(parts=outcome.results))
            if not calls or outcome.paused or outcome.retries_exhausted:
                break
        self._check_cancel()

    def _check_cancel(self) -> None:
        if self._is_cancelled():
            raise AgentCancelledError

    async def _model_step(
        self, step: int, parameters: ModelRequestParameters, calls: list[ToolCallPart]
    ) -> AsyncIterator[Chunk]:
        request = _telemetry.tracer.start_span(
            "bastion.model_request", context=self._trace, attributes={"bastion.step": step}
        )
        failure: BaseException | None = None
        response: list[ModelResponse] = []
        try:
            if self._steps is None:
                chunks = self._model_request(step, parameters, response)
            else:
                chunks = self._steps.request(
                    step, lambda: self._model_request(step, parameters, response), response
                )
            async for chunk in chunks:
                yield chunk
            self._apply_response(response[0], calls, request)
        except BaseException as error:
            failure = error
            raise
        finally:
            _telemetry.end(request, failure)

    async def _model_request(
        self, step: int, parameters: ModelRequestParameters, response: list[ModelResponse]
    ) -> AsyncIterator[Chunk]:
        """Stream one model request as chunks; its `ModelResponse` is left in `response`."""
        open_parts: dict[int, Chunk] = {}
        async with model_request_stream(
            self._model,
            self.messages,
            model_settings=self._model_settings,
            model_request_parameters=parameters,
        ) as stream:
            async for event in until_cancelled(stream, self._cancel):
                if event is None:
                    for chunk in close_open_parts(open_parts):
                        yield chunk
                    yield {"type": "finish-step"}
                    raise AgentCancelledError
                kind = type(event)
                if kind is PartDeltaEvent:
                    delta = event.delta  # type: ignore[union-attr]
                    opened = open_parts.get(event.index)  # type: ignore[union-attr]
                    if opened is None:
                        continue
                    if type(delta) is TextPartDelta:
                        yield {"type": "text-delta", "id": opened["id"], "delta": delta.content_delta}
                    elif type(delta) is ThinkingPartDelta:
                        if delta.content_delta:
                            yield {
                                "type": "reasoning-delta",
                                "id": opened["id"],
                                "delta": delta.content_delta,
                            }
                    elif type(delta) is ToolCallPartDelta and isinstance(delta.args_delta, str):
                        yield {
                            "type": "tool-input-delta",
                            "toolCallId": opened["toolCallId"],
                            "inputTextDelta": delta.args_delta,
                        }
                elif kind is PartStartEvent:
                    for chunk in self._start_part(step, event, open_parts):  # type: ignore[arg-type]
                        yield chunk
                elif kind is PartEndEvent:
                    opened = open_parts.pop(event.index, None)  # type: ignore[union-attr]
                    if opened is not None and opened["type"] != "tool":
                        yield {"type": f"{opened['type']}-end", "id": opened["id"]}
            response.append(stream.get())
        for chunk in close_open_parts(open_parts):
            yield chunk

    def _apply_response(self, response: ModelResponse, calls: list[ToolCallPart], request: Span) -> None:
        """Account for a model response and add it to the turn's messages."""
        used = TokenUsage.of(response.usage)
        self.request_usage.append(used)
        self.usage.add(used)
        used.record(request)
        request.set_attribute("gen_ai.response.model", response.model_name or "")
        request.set_attribute("bastion.finish_reason", response.finish_reason or "none")
        self.messages.append(response)
        calls.extend(part for part in response.parts if isinstance(part, ToolCallPart))
        self.finish_reason = _FINISH_REASONS.get(response.finish_reason or "stop", "other")
        if calls:
            self.finish_reason = "tool-calls"

    def _start_part(self, step: int, event: PartStartEvent, open_parts: dict[int, Chunk]) -> list[Chunk]:
        part = event.part
        part_id = f"{step}-{event.index}"
        if isinstance(part, TextPart):
            open_parts[event.index] = {"type": "text", "id": part_id}
            chunks: list[Chunk] = [{"type": "text-start", "id": part_id}]
            if part.content:
                chunks.append({"type": "text-delta", "id": part_id, "delta": part.content})
            return chunks
        if isinstance(part, ThinkingPart):
            open_parts[event.index] = {"type": "reasoning", "id": part_id}
            chunks = [{"type": "reasoning-start", "id": part_id}]
            if part.content:
                chunks.append({"type": "reasoning-delta", "id": part_id, "delta": part.content})
            return chunks
        if isinstance(part, NativeToolCallPart):
            # Run by the provider (web search, code execution): shown, never executed or guarded here.
            return [
                {
                    "type": "tool-input-available",
                    "toolCallId": part.tool_call_id,
                    "toolName": part.tool_name,
                    "input": to_jsonable_python(part.args_as_dict()),
                    "providerExecuted": True,
                }
            ]
        if isinstance(part, NativeToolReturnPart):
            return [
                {
                    "type": "tool-output-available",
                    "toolCallId": part.tool_call_id,
                    "output": to_jsonable_python(part.content),
                    "providerExecuted": True,
                }
            ]
        if isinstance(part, ToolCallPart):
            open_parts[event.index] = {"type": "tool", "toolCallId": part.tool_call_id}
            start: Chunk = {
                "type": "tool-input-start",
                "toolCallId": part.tool_call_id,
                "toolName": part.tool_name,
            }
            if self._is_dynamic(part.tool_name):
                start["dynamic"] = True
            chunks = [start]
            if isinstance(part.args, str) and part.args:
                chunks.append(
                    {"type": "tool-input-delta", "toolCallId": part.tool_call_id, "inputTextDelta": part.args}
                )
            return chunks
        return []

    def _has_tool_results(self) -> bool:
        """Whether a tool's result came in during this turn, other than of the tools that wait for the
        user after one (their outputs are the server's): content someone else may have written."""
        for message in self.messages[self._turn_starts_at :]:
            if not isinstance(message, ModelRequest):
                continue
            for part in message.parts:
                if not isinstance(part, ToolReturnPart | RetryPromptPart) or part.tool_name is None:
                    continue
                item = self._plan.tools.get(part.tool_name)
                if item is None or not item.approval_after_tool_results:
                    return True
        return False

    def _approval_id(self, step: int, index: int) -> str:
        """A new approval's id: random, or derived from the turn and the call's place in a durable one."""
        if self._steps is None:
            return _new_id()
        return uuid.uuid5(_DURABLE_IDS, f"{self._steps.id_seed}/{step}.{index}").hex

    def _is_dynamic(self, name: str) -> bool:
        item = self._plan.tools.get(name)
        return item is None or item.dynamic

    async def _run_tools(
        self, step: int, calls: list[ToolCallPart], retries: dict[str, int], outcome: _StepOutcome
    ) -> AsyncIterator[Chunk]:
        runnable: list[tuple[Tool, ToolCall, CallOrigin]] = []
        for index, part in enumerate(calls):
            item = self._plan.tools.get(part.tool_name)
            dynamic = self._is_dynamic(part.tool_name)
            try:
                raw_input = part.args_as_dict(raise_if_invalid=True)
            except (ValueError, AssertionError):
                raw_input = part.args if isinstance(part.args, dict) else {}
                yield tool_input_error_chunk(
                    part, raw_input, "Invalid input: the arguments are not a JSON object.", dynamic
                )
                outcome.retry(part, "The arguments must be a JSON object.", retries, self._plan.tool_retries)
                continue
            if item is None:
                yield tool_input_error_chunk(part, raw_input, f"Unknown tool: {part.tool_name}", dynamic)
                outcome.retry(
                    part, f"Unknown tool name: {part.tool_name!r}.", retries, self._plan.tool_retries
                )
                continue
            try:
                item.check_input(raw_input)
            except ToolInputError as error:
                yield tool_input_error_chunk(part, raw_input, f"Invalid input: {error}", dynamic)
                outcome.retry(part, f"Invalid arguments: {error}", retries, self._plan.tool_retries)
                continue
            available: Chunk = {
                "type": "tool-input-available",
                "toolCallId": part.tool_call_id,
                "toolName": part.tool_name,
                "input": raw_input,
            }
            if dynamic:
                available["dynamic"] = True
            call = ToolCall(tool_name=part.tool_name, input=raw_input, tool_call_id=part.tool_call_id)
            card, refusal = await sign_in_card(item, call)
            if card is not None:  # the user signs in first; their answer continues the call
                available["toolMetadata"] = {"authorization": card}
            yield available
            if refusal is not None:
                chunk, result = self._error(item, call, refusal)
                yield chunk
                outcome.results.append(result)
                continue
            after_results = item.approval_after_tool_results and self._has_tool_results()
            if card is not None or after_results or await tool_requires_approval(item, call):
                self._trace_unrun(call, approval="requested", outcome="paused")
                yield {
                    "type": "tool-approval-request",
                    "approvalId": self._approval_id(step, index),
                    "toolCallId": part.tool_call_id,
                }
                outcome.paused = True
                continue
            self._approval_of[call.tool_call_id] = "not-required"
            runnable.append((item, call, CallOrigin(step=step, index=index)))
        for chunk, result in await self._execute_all(runnable):
            yield chunk
            outcome.results.append(result)

    async def _answer_approvals(self) -> AsyncIterator[Chunk]:
        """Run (or refuse) the calls the user answered, before the model is called again."""
        history = self._plan.history
        runnable: list[tuple[Tool, ToolCall, CallOrigin]] = []
        for part in self._plan.approvals:
            call_id = str(part["toolCallId"])
            awaiting = history.awaiting.get(call_id)
            name = awaiting.tool_name if awaiting is not None else str(part.get("toolName", ""))
            approval = part.get("approval")
            if not isinstance(approval, Mapping):
                approval = {}  # not an answer the loop can read: a denial, never a failed turn
            item = self._plan.tools.get(name)
            if approval.get("approved") is not True:
                self._trace_unrun(
                    ToolCall(tool_name=name, input=None, tool_call_id=call_id), "denied", "denied"
                )
                yield {"type": "tool-output-denied", "toolCallId": call_id}
                self._add_result(
                    ToolReturnPart(
                        tool_name=name,
                        content=denial_text(approval.get("reason")),
                        tool_call_id=call_id,
                        outcome="denied",
                    )
                )
                continue
            call = ToolCall(tool_name=name, input=part.get("input"), tool_call_id=call_id)
            if item is None:
                error_text = "This tool is no longer available."
                yield {"type": "tool-output-error", "toolCallId": call_id, "errorText": error_text}
                self._add_result(
                    ToolReturnPart(tool_name=name, content=error_text, tool_call_id=call_id, outcome="failed")
                )
                continue
            approval_id = approval.get("id")
            origin = CallOrigin(approval_id=approval_id if isinstance(approval_id, str) else None)
            self._approval_of[call_id] = "approved"
            runnable.append((item, call, origin))
        for chunk, result in await self._execute_all(runnable):
            yield chunk
            self._add_result(result)

    def _add_result(self, result: ModelRequestPart) -> None:
        history = self._plan.history
        if (
            history.open_results is not None
            and isinstance(result, ToolReturnPart)
            and result.tool_call_id in history.awaiting
        ):
            history.open_results.append(result)

    async def _execute_all(
        self, runnable: list[tuple[Tool, ToolCall, CallOrigin]]
    ) -> list[tuple[Chunk, ModelRequestPart]]:
        """Run a step's calls concurrently; their results keep the order of the calls."""
        if not runnable:
            return []
        if len(runnable) == 1:
            return [await self._execute(*runnable[0])]
        return list(await asyncio.gather(*(self._execute(*entry) for entry in runnable)))

    def _trace_unrun(self, call: ToolCall, approval: str, outcome: str) -> None:
        """A tool call that did not run (waiting for, or refused by, the user) still gets its span."""
        attributes = tool_attributes(call, approval, outcome)
        with _telemetry.span("bastion.tool_call", attributes, context=self._trace):
            pass

    async def _execute(
        self, item: Tool, call: ToolCall, origin: CallOrigin
    ) -> tuple[Chunk, ModelRequestPart]:
        approval = self._approval_of.pop(call.tool_call_id, "not-required")
        attributes = tool_attributes(call, approval)
        with _telemetry.span("bastion.tool_call", attributes, context=self._trace) as current:
            chunk, result = await self._execute_untraced(item, call, origin)
            current.set_attribute("bastion.tool.outcome", str(chunk["type"]).removeprefix("tool-output-"))
            return chunk, result

    async def _execute_untraced(
        self, item: Tool, call: ToolCall, origin: CallOrigin
    ) -> tuple[Chunk, ModelRequestPart]:
        try:
            output = await unless_cancelled(self._invoke(item, call, origin), self._cancel)
        except AgentCancelledError:
            raise
        except ToolError as error:
            return self._error(item, call, error.message)
        except asyncio.CancelledError:
            if this_task_is_cancelled():
                raise
            # A tool awaiting something that another task cancelled: its failure, not the turn's.
            logger.exception("Tool %s was cancelled from elsewhere.", call.tool_name)
            return self._error(item, call, GENERIC_TOOL_ERROR)
        except Exception:
            logger.exception("Tool %s failed.", call.tool_name)
            return self._error(item, call, GENERIC_TOOL_ERROR)
        if isinstance(output, ToolDenial):
            ui_output = to_jsonable_python(output.output)
            chunk = {"type": "tool-output-available", "toolCallId": call.tool_call_id, "output": ui_output}
            return chunk, ToolReturnPart(
                tool_name=call.tool_name, content=ui_output, tool_call_id=call.tool_call_id, outcome="denied"
            )
        withheld = None if item.recheck_before_model is None else await item.recheck_before_model(call)
        try:
            model_view = item.model_view(output, call) if withheld is None else withheld.output
            ui_output = to_jsonable_python(output)
        except Exception:
            logger.exception("Converting the result of %s failed.", call.tool_name)
            return self._error(item, call, GENERIC_TOOL_ERROR)
        chunk = {"type": "tool-output-available", "toolCallId": call.tool_call_id, "output": ui_output}
        return chunk, ToolReturnPart(
            tool_name=call.tool_name,
            content=model_view,
            tool_call_id=call.tool_call_id,
            outcome="success" if withheld is None else "denied",
        )

    def _error(self, item: Tool, call: ToolCall, error_text: str) -> tuple[Chunk, ModelRequestPart]:
        shown = item.error_view(error_text, call)
        chunk = {"type": "tool-output-error", "toolCallId": call.tool_call_id, "errorText": shown}
        return chunk, ToolReturnPart(
            tool_name=call.tool_name, content=shown, tool_call_id=call.tool_call_id, outcome="failed"
        )

    async def _invoke(self, item: Tool, call: ToolCall, origin: CallOrigin) -> Any:
        executor = item.execute
        if executor is None:
            raise RuntimeError(f"Tool {item.name!r} has no executor.")

        async def execute(key: str) -> Any:
            return await run_executor(executor, replace(call, operation_key=key))

        hook = self._plan.execute_tool
        if hook is None:
            return await execute(operation_key(self._scope, call.tool_call_id, origin))
        return await hook(
            name=call.tool_name,
            tool_call_id=call.tool_call_id,
            input=call.input,
            execute=execute,
            origin=origin,
            idempotent=item.idempotent,
        )


@dataclass
class _StepOutcome:
    """What running one step's tool calls produced for the next model request."""

    results: list[ModelRequestPart] = field(default_factory=list)
    paused: bool = False
    retries_exhausted: bool = False

    def retry(self, part: ToolCallPart, message: str, retries: dict[str, int], limit: int) -> None:
        """Send the problem back to the model, at most `limit` times per tool in a turn."""
        used = retries.get(part.tool_name, 0)
        if used >= limit:
            self.retries_exhausted = True
        retries[part.tool_name] = used + 1
        self.results.append(
            ToolReturnPart(
                tool_name=part.tool_name, content=message, tool_call_id=part.tool_call_id, outcome="retried"
            )
        )


def _definition(item: Tool) -> ToolDefinition:
    return ToolDefinition(
        name=item.name,
        description=item.description or None,
        parameters_json_schema=dict(item.input_schema),
        strict=item.strict,
    )


def _set_instructions(messages: list[ModelMessage], instructions: str | None) -> None:
    """Providers read the instructions from the latest request; the agent's are static."""
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            message.instructions = instructions
            return


def _new_id() -> str:
    return uuid.uuid4().hex
