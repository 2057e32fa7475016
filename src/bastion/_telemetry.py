"""Traces through `opentelemetry-api`: a no-op until the application configures a tracer provider.

Spans: `bastion.turn` (one agent turn), `bastion.model_request` (each model request, with its token
usage), `bastion.tool_call` (each tool call, with whether its policy needs approval and how the
approval and the call ended) and `bastion.store.*` (each persistence call of a run). Attributes
carry names, ids and counts only, never inputs, outputs or context.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode
from pydantic_ai.usage import RequestUsage

from bastion.tools import ToolCall

__all__ = ["TokenUsage", "end", "span", "tool_attributes", "tracer"]

tracer: Final = trace.get_tracer("bastion")


@contextmanager
def span(name: str, attributes: Mapping[str, Any], *, context: Context | None = None) -> Iterator[Span]:
    """A current span named `name`; an exception marks it as an error (its type only, no message)."""
    with tracer.start_as_current_span(
        name, context=context, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as error:
            current.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise


def end(current: Span, error: BaseException | None = None) -> None:
    """End a span started by hand (one that spans the yields of a stream)."""
    if error is not None:
        current.set_status(Status(StatusCode.ERROR, type(error).__name__))
    current.end()


@dataclass(slots=True)
class TokenUsage:
    """Tokens a model request (or a whole turn) used, as the provider reported them.

    `as_json()` gives them in the AI SDK's names (`inputTokens`, `outputTokens`, `totalTokens`).
    """

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @classmethod
    def of(cls, usage: RequestUsage) -> TokenUsage:
        return cls(usage.input_tokens, usage.output_tokens)

    def add(self, other: TokenUsage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens

    def as_json(self) -> dict[str, int]:
        return {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "totalTokens": self.total_tokens,
        }

    def record(self, current: Span) -> None:
        current.set_attribute("gen_ai.usage.input_tokens", self.input_tokens)
        current.set_attribute("gen_ai.usage.output_tokens", self.output_tokens)


def tool_attributes(call: ToolCall, approval: str, outcome: str | None = None) -> dict[str, str]:
    """Names and ids only; `bastion.tool.approval`: not-required, requested, approved or denied."""
    attributes = {
        "bastion.tool.name": call.tool_name,
        "bastion.tool.call_id": call.tool_call_id,
        "bastion.tool.approval": approval,
    }
    if outcome is not None:
        attributes["bastion.tool.outcome"] = outcome
    return attributes
