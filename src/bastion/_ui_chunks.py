"""The UI message stream chunks bastion's loop emits, and the fields both AI SDK clients accept in each.

A chunk is checked against `uiMessageChunkSchema` of the `ai` package as versions 6 and 7 both read
it, before it is applied or sent: a chunk either client would refuse must not reach the wire or the
stored message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pydantic_ai.messages import ToolCallPart

__all__ = [
    "CHUNK_FIELDS",
    "TOOL_CALL_FIELDS",
    "TOOL_RESULT_FIELDS",
    "Chunk",
    "InvalidUIMessageChunkError",
    "UIMessage",
    "close_open_parts",
    "tool_input_error_chunk",
    "validate_chunk",
]

# One UI message stream chunk in the AI SDK's wire shape (`{"type": "text-delta", ...}`).
Chunk = dict[str, Any]
# One AI SDK UI message as the runtime handles it (`id`, `role`, `parts`, …): the one `UIMessage`. HTTP
# checks its shape with `bastion.chat.request.WireUIMessage`.
UIMessage = dict[str, Any]


class InvalidUIMessageChunkError(Exception):
    """A chunk the AI SDK client would refuse; the stream must not send it."""

    code = "invalid_ui_message_chunk"


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _anything(value: Any) -> bool:
    return True


def _json_object(value: Any) -> bool:
    return isinstance(value, dict)


def _provider_metadata(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(entry, dict) for entry in value.values())


_Check = Callable[[Any], bool]
_TEXT_FIELDS: Final[dict[str, _Check]] = {"providerMetadata": _provider_metadata}
TOOL_CALL_FIELDS: Final[dict[str, _Check]] = {
    "providerExecuted": _boolean,
    "providerMetadata": _provider_metadata,
    "toolMetadata": _json_object,
    "dynamic": _boolean,
    "title": _string,
}
TOOL_RESULT_FIELDS: Final[dict[str, _Check]] = {
    "providerExecuted": _boolean,
    "providerMetadata": _provider_metadata,
    "toolMetadata": _json_object,
    "dynamic": _boolean,
}

# chunk type → (required fields, optional fields); any other key is refused.
CHUNK_FIELDS: Final[dict[str, tuple[dict[str, _Check], dict[str, _Check]]]] = {
    "start-step": ({}, {}),
    "finish-step": ({}, {}),
    "text-start": ({"id": _string}, _TEXT_FIELDS),
    "text-delta": ({"id": _string, "delta": _string}, _TEXT_FIELDS),
    "text-end": ({"id": _string}, _TEXT_FIELDS),
    "reasoning-start": ({"id": _string}, _TEXT_FIELDS),
    "reasoning-delta": ({"id": _string, "delta": _string}, _TEXT_FIELDS),
    "reasoning-end": ({"id": _string}, _TEXT_FIELDS),
    "tool-input-start": ({"toolCallId": _string, "toolName": _string}, TOOL_CALL_FIELDS),
    "tool-input-delta": ({"toolCallId": _string, "inputTextDelta": _string}, {}),
    "tool-input-available": (
        {"toolCallId": _string, "toolName": _string, "input": _anything},
        TOOL_CALL_FIELDS,
    ),
    "tool-input-error": (
        {"toolCallId": _string, "toolName": _string, "input": _anything, "errorText": _string},
        TOOL_CALL_FIELDS,
    ),
    "tool-approval-request": ({"approvalId": _string, "toolCallId": _string}, {}),
    "tool-output-available": (
        {"toolCallId": _string, "output": _anything},
        {**TOOL_RESULT_FIELDS, "preliminary": _boolean},
    ),
    "tool-output-error": ({"toolCallId": _string, "errorText": _string}, TOOL_RESULT_FIELDS),
    "tool-output-denied": ({"toolCallId": _string}, {}),
}


def validate_chunk(chunk: Any) -> None:
    """Refuse a chunk whose type, keys or field types the clients would not accept."""
    if not isinstance(chunk, dict):
        raise InvalidUIMessageChunkError(f"A chunk must be a JSON object, got {type(chunk).__name__}.")
    kind = chunk.get("type")
    fields = CHUNK_FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise InvalidUIMessageChunkError(f"Unsupported chunk type {kind!r}.")
    required, optional = fields
    for key, value in chunk.items():
        if key == "type":
            continue
        check = required.get(key) or optional.get(key)
        if check is None:
            raise InvalidUIMessageChunkError(f"Unexpected field {key!r} in a {kind!r} chunk.")
        if not check(value):
            raise InvalidUIMessageChunkError(f"Invalid field {key!r} in a {kind!r} chunk.")
    missing = [key for key in required if key not in chunk]
    if missing:
        raise InvalidUIMessageChunkError(f"Missing field {missing[0]!r} in a {kind!r} chunk.")


def tool_input_error_chunk(part: ToolCallPart, raw_input: Any, error_text: str, dynamic: bool) -> Chunk:
    chunk: Chunk = {
        "type": "tool-input-error",
        "toolCallId": part.tool_call_id,
        "toolName": part.tool_name,
        "input": raw_input,
        "errorText": error_text,
    }
    if dynamic:
        chunk["dynamic"] = True
    return chunk


def close_open_parts(open_parts: dict[int, Chunk]) -> list[Chunk]:
    chunks = [
        {"type": f"{opened['type']}-end", "id": opened["id"]}
        for opened in open_parts.values()
        if opened["type"] != "tool"
    ]
    open_parts.clear()
    return chunks
