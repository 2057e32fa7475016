"""Canonical AI SDK UI messages turned into pydantic-ai model messages, once per turn.

The UI messages are the system of record; the model messages are derived from them. An assistant
message holds several steps (split by `step-start` parts): each becomes a model response followed by
a request carrying that step's tool results. A tool call that never got a result (left waiting for an
approval) is answered with a note, because providers refuse a call without a result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.messages import (
    BinaryContent,
    DocumentUrl,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)

from bastion.policies import tool_part_name

UNANSWERED_TOOL_CALL = "This tool call was not run: the conversation continued without an answer."


def denial_text(reason: object) -> str:
    """What the model is told when the user refused a call."""
    if isinstance(reason, str) and reason.strip():
        return f"The user denied this tool call. Reason: {reason.strip()}"
    return "The user denied this tool call."


@dataclass
class ConvertedHistory:
    """Model messages, plus the calls still waiting for their result in the final step."""

    messages: list[ModelMessage]
    open_results: list[ModelRequestPart] | None = None
    awaiting: dict[str, ToolCallPart] = field(default_factory=dict)


def to_model_messages(
    ui_messages: Sequence[Mapping[str, Any]],
    *,
    convert_output: Callable[[str, Any], Any],
    awaiting_call_ids: frozenset[str] = frozenset(),
) -> ConvertedHistory:
    """Convert UI messages; `awaiting_call_ids` are calls whose results this turn will add.

    `convert_output(tool_name, output)` gives the model's view of a stored result.
    """
    converted = ConvertedHistory(messages=[])
    for message in ui_messages:
        role = message.get("role")
        parts = message.get("parts") or []
        if role == "user":
            content = _user_content(parts)
            if content:
                prompt = content[0] if len(content) == 1 and isinstance(content[0], str) else content
                converted.messages.append(ModelRequest(parts=[UserPromptPart(content=prompt)]))
        elif role == "system":
            text = "\n".join(
                p["text"] for p in parts if p.get("type") == "text" and isinstance(p.get("text"), str)
            )
            if text:
                converted.messages.append(ModelRequest(parts=[SystemPromptPart(content=text)]))
        elif role == "assistant":
            _convert_assistant(parts, converted, convert_output, awaiting_call_ids)
    return converted


def _user_content(parts: Sequence[Mapping[str, Any]]) -> list[UserContent]:
    content: list[UserContent] = []
    for part in parts:
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            content.append(part["text"])
        elif kind == "file" and isinstance(part.get("url"), str):
            media_type = str(part.get("mediaType", "application/octet-stream"))
            try:
                content.append(_file_content(part["url"], media_type))
            except ValueError:
                # Stored before files were checked, or written by another application: leave it out
                # rather than make every later turn of the conversation fail.
                continue
    return content


def _file_content(url: str, media_type: str) -> UserContent:
    if url.startswith("data:"):
        return BinaryContent.from_data_uri(url)
    if media_type.startswith("image/"):
        return ImageUrl(url=url, media_type=media_type)
    return DocumentUrl(url=url, media_type=media_type)


def _convert_assistant(
    parts: Sequence[Mapping[str, Any]],
    converted: ConvertedHistory,
    convert_output: Callable[[str, Any], Any],
    awaiting_call_ids: frozenset[str],
) -> None:
    response: list[ModelResponsePart] = []
    results: list[ModelRequestPart] = []
    awaiting: dict[str, ToolCallPart] = {}

    def flush() -> None:
        nonlocal response, results, awaiting
        if response:
            converted.messages.append(ModelResponse(parts=response))
            if results or awaiting:
                converted.messages.append(ModelRequest(parts=results))
                converted.open_results = results
                converted.awaiting = awaiting
        response, results, awaiting = [], [], {}

    for part in parts:
        kind = part.get("type")
        if kind == "step-start":
            flush()
        elif kind == "text" and isinstance(part.get("text"), str):
            response.append(TextPart(content=part["text"]))
        elif kind == "reasoning" and isinstance(part.get("text"), str) and part["text"]:
            response.append(ThinkingPart(content=part["text"]))
        else:
            name = tool_part_name(part)
            if name is None or part.get("providerExecuted") is True:
                continue
            call = ToolCallPart(
                tool_name=name, args=_tool_args(part.get("input")), tool_call_id=part["toolCallId"]
            )
            response.append(call)
            if call.tool_call_id in awaiting_call_ids:
                awaiting[call.tool_call_id] = call
            else:
                results.append(_stored_result(part, name, convert_output))
    flush()


def _tool_args(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _stored_result(
    part: Mapping[str, Any], name: str, convert_output: Callable[[str, Any], Any]
) -> ToolReturnPart:
    call_id = part["toolCallId"]
    state = part.get("state")
    if state == "output-available":
        return ToolReturnPart(
            tool_name=name, content=convert_output(name, part.get("output")), tool_call_id=call_id
        )
    if state == "output-error":
        return ToolReturnPart(
            tool_name=name, content=str(part.get("errorText", "")), tool_call_id=call_id, outcome="failed"
        )
    if state == "output-denied":
        approval = part.get("approval") or {}
        return ToolReturnPart(
            tool_name=name,
            content=denial_text(approval.get("reason")),
            tool_call_id=call_id,
            outcome="denied",
        )
    return ToolReturnPart(
        tool_name=name, content=UNANSWERED_TOOL_CALL, tool_call_id=call_id, outcome="interrupted"
    )
