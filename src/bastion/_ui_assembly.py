"""The assistant UI message assembled from UI message stream chunks, exactly as the AI SDK client does.

The server stores what the browser assembled, so this mirrors `processUIMessageStream` of the `ai`
package (6.0 and 7.0) for the chunks bastion's loop emits, and refuses what either client would refuse:
each chunk is checked (`bastion._ui_chunks`) before it is applied. Values are the client's
(`bastion._client_json`): a key is set only when the client would serialize it, and a streaming tool
input is what the client's partial parse shows (`bastion._partial_json`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from bastion._client_json import ABSENT, to_client_json
from bastion._partial_json import fix_json, parse_partial_json
from bastion._ui_chunks import (
    CHUNK_FIELDS,
    TOOL_CALL_FIELDS,
    TOOL_RESULT_FIELDS,
    InvalidUIMessageChunkError,
    UIMessage,
    validate_chunk,
)

__all__ = [
    "CHUNK_FIELDS",
    "InvalidUIMessageChunkError",
    "UIMessageAssembler",
    "UIPart",
    "assemble_ui_messages",
    "fix_json",
    "parse_partial_json",
    "to_client_json",
    "validate_chunk",
]

UIPart = dict[str, Any]


@dataclass
class _PartialToolCall:
    text: str
    tool_name: str
    dynamic: bool
    title: Any
    tool_metadata: Any


def _assign(part: UIPart, key: str, value: Any) -> None:
    if value is ABSENT:
        part.pop(key, None)
    else:
        part[key] = value


def _present(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not ABSENT}


def _is_static_tool(part: Mapping[str, Any]) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and kind.startswith("tool-")


def _is_tool(part: Mapping[str, Any]) -> bool:
    return _is_static_tool(part) or part.get("type") == "dynamic-tool"


_RESULT_STATES: Final = frozenset({"output-available", "output-error"})


class UIMessageAssembler:
    """Applies validated chunks to one assistant message, new or continued (after an approval).

    Stricter than either client alone where they differ: text and reasoning ids end at `finish-step`
    (ai 6), and a tool input streamed in an earlier response cannot be continued (ai 6).
    """

    def __init__(self, message: UIMessage) -> None:
        self._message = message
        self._active_text: dict[str, UIPart] = {}
        self._active_reasoning: dict[str, UIPart] = {}
        self._partial_calls: dict[str, _PartialToolCall] = {}
        # The client re-parses a streaming tool input at every delta; only the last parse can be seen,
        # so it is done when the next chunk for that call arrives or the message is read.
        self._unparsed_inputs: dict[str, tuple[UIPart, str]] = {}

    def assembled_message(self) -> UIMessage:
        """The message as the client holds it after the chunks applied so far."""
        for tool_call_id in list(self._unparsed_inputs):
            self._parse_streamed_input(tool_call_id)
        return self._message

    def _parse_streamed_input(self, tool_call_id: str) -> None:
        pending = self._unparsed_inputs.pop(tool_call_id, None)
        if pending is not None:
            part, text = pending
            _assign(part, "input", parse_partial_json(text))

    @property
    def _parts(self) -> list[UIPart]:
        parts: list[UIPart] = self._message["parts"]
        return parts

    def apply_metadata(self, metadata: Any) -> None:
        """Merge message metadata the way the client merges a `start` chunk's `messageMetadata`."""
        if metadata is None:
            return
        current = self._message.get("metadata")
        self._message["metadata"] = metadata if current is None else _merge_objects(current, metadata)

    def apply(self, chunk: dict[str, Any]) -> None:
        """Validate `chunk` and apply it; raises `InvalidUIMessageChunkError` where a client would."""
        validate_chunk(chunk)
        if "toolCallId" in chunk and chunk["type"] != "tool-input-delta":
            self._parse_streamed_input(chunk["toolCallId"])
        self._handlers[chunk["type"]](self, chunk)

    def apply_text_delta(self, part_id: str, delta: str) -> None:
        """Apply a text delta given as its two strings (checked by the caller): the same as `apply` of
        `{"type": "text-delta", "id": part_id, "delta": delta}`, without checking the chunk's shape."""
        part = self._active_text.get(part_id)
        if part is None:
            raise InvalidUIMessageChunkError("'text-delta' for a part that was not started.")
        part["text"] += delta

    def _current_step(self) -> list[UIPart]:
        parts = self._parts
        for index in range(len(parts) - 1, -1, -1):
            if parts[index].get("type") == "step-start":
                return parts[index + 1 :]
        return list(parts)

    def _find_tool(self, tool_call_id: str) -> UIPart:
        for part in self._current_step():
            if _is_tool(part) and part.get("toolCallId") == tool_call_id:
                return part
        for part in reversed(self._parts):
            if _is_tool(part) and part.get("toolCallId") == tool_call_id:
                return part
        raise InvalidUIMessageChunkError(f"No tool invocation found for tool call id {tool_call_id!r}.")

    def _update_tool(
        self, options: dict[str, Any], *, dynamic: bool, existing: UIPart | None = None
    ) -> UIPart:
        """`updateToolPart` / `updateDynamicToolPart`: options hold only the keys the client passes."""
        part = existing
        if part is None:
            for candidate in self._current_step():
                same_kind = candidate.get("type") == "dynamic-tool" if dynamic else _is_static_tool(candidate)
                if same_kind and candidate.get("toolCallId") == options["toolCallId"]:
                    part = candidate
                    break
        state = options["state"]
        provider_metadata = options.get("providerMetadata", ABSENT)
        metadata_key = "resultProviderMetadata" if state in _RESULT_STATES else "callProviderMetadata"
        if part is None:
            name = options["toolName"]
            created = _present(
                type="dynamic-tool" if dynamic else f"tool-{name}",
                toolName=name if dynamic else ABSENT,
                toolCallId=options["toolCallId"],
                state=state,
                title=options.get("title", ABSENT),
                toolMetadata=options.get("toolMetadata", ABSENT),
                input=options.get("input", ABSENT),
                output=options.get("output", ABSENT),
                rawInput=ABSENT if dynamic else options.get("rawInput", ABSENT),
                errorText=options.get("errorText", ABSENT),
                providerExecuted=options.get("providerExecuted", ABSENT),
                preliminary=options.get("preliminary", ABSENT),
            )
            if provider_metadata is not ABSENT:
                created[metadata_key] = provider_metadata
            self._parts.append(created)
            return created
        part["state"] = state
        if dynamic:
            part["toolName"] = options["toolName"]
        else:
            part["type"] = f"tool-{options['toolName']}"
        for key in ("input", "output", "errorText", "rawInput"):
            _assign(part, key, options.get(key, ABSENT))
        part.pop("inputEncoding", None)
        _assign(part, "preliminary", options.get("preliminary", ABSENT))
        for key in ("title", "toolMetadata"):
            if key in options:
                part[key] = options[key]
        _assign(
            part, "providerExecuted", options.get("providerExecuted", part.get("providerExecuted", ABSENT))
        )
        if provider_metadata is not ABSENT:
            part[metadata_key] = provider_metadata
        return part

    # --- handlers, one per chunk type ---

    def _start_step(self, chunk: dict[str, Any]) -> None:
        self._parts.append({"type": "step-start"})

    def _finish_step(self, chunk: dict[str, Any]) -> None:
        self._active_text = {}
        self._active_reasoning = {}

    def _text_start(self, chunk: dict[str, Any]) -> None:
        part = _present(type="text", text="", providerMetadata=chunk.get("providerMetadata", ABSENT))
        part["state"] = "streaming"
        self._active_text[chunk["id"]] = part
        self._parts.append(part)

    def _reasoning_start(self, chunk: dict[str, Any]) -> None:
        part = _present(
            type="reasoning", id=chunk["id"], text="", providerMetadata=chunk.get("providerMetadata", ABSENT)
        )
        part["state"] = "streaming"
        self._active_reasoning[chunk["id"]] = part
        self._parts.append(part)

    @staticmethod
    def _active(active: dict[str, UIPart], chunk: dict[str, Any]) -> UIPart:
        part = active.get(chunk["id"])
        if part is None:
            raise InvalidUIMessageChunkError(f"{chunk['type']!r} for a part that was not started.")
        if "providerMetadata" in chunk:
            part["providerMetadata"] = chunk["providerMetadata"]
        return part

    def _text_delta(self, chunk: dict[str, Any]) -> None:
        self._active(self._active_text, chunk)["text"] += chunk["delta"]

    def _reasoning_delta(self, chunk: dict[str, Any]) -> None:
        self._active(self._active_reasoning, chunk)["text"] += chunk["delta"]

    def _text_end(self, chunk: dict[str, Any]) -> None:
        self._active(self._active_text, chunk)["state"] = "done"
        del self._active_text[chunk["id"]]

    def _reasoning_end(self, chunk: dict[str, Any]) -> None:
        self._active(self._active_reasoning, chunk)["state"] = "done"
        del self._active_reasoning[chunk["id"]]

    def _tool_input_start(self, chunk: dict[str, Any]) -> None:
        dynamic = bool(chunk.get("dynamic"))
        self._partial_calls[chunk["toolCallId"]] = _PartialToolCall(
            text="",
            tool_name=chunk["toolName"],
            dynamic=dynamic,
            title=chunk.get("title", ABSENT),
            tool_metadata=chunk.get("toolMetadata", ABSENT),
        )
        options = {key: chunk[key] for key in TOOL_CALL_FIELDS if key in chunk and key != "dynamic"}
        options.update(toolCallId=chunk["toolCallId"], toolName=chunk["toolName"], state="input-streaming")
        self._update_tool(options, dynamic=dynamic)

    def _tool_input_delta(self, chunk: dict[str, Any]) -> None:
        partial = self._partial_calls.get(chunk["toolCallId"])
        if partial is None:
            raise InvalidUIMessageChunkError("'tool-input-delta' for a tool call that was not started.")
        partial.text += chunk["inputTextDelta"]
        options = _present(
            toolCallId=chunk["toolCallId"],
            toolName=partial.tool_name,
            state="input-streaming",
            rawInput=partial.text,
            title=partial.title,
            toolMetadata=partial.tool_metadata,
        )
        part = self._update_tool(options, dynamic=partial.dynamic)
        self._unparsed_inputs[chunk["toolCallId"]] = (part, partial.text)

    def _tool_input_available(self, chunk: dict[str, Any]) -> None:
        options = {key: chunk[key] for key in TOOL_CALL_FIELDS if key in chunk and key != "dynamic"}
        options.update(
            toolCallId=chunk["toolCallId"],
            toolName=chunk["toolName"],
            state="input-available",
            input=chunk["input"],
        )
        self._update_tool(options, dynamic=bool(chunk.get("dynamic")))

    def _tool_input_error(self, chunk: dict[str, Any]) -> None:
        # ai 7 keeps the refused input as `input`; ai 6 stores it as `rawInput` of a static tool part.
        existing = next(
            (p for p in self._current_step() if _is_tool(p) and p.get("toolCallId") == chunk["toolCallId"]),
            None,
        )
        dynamic = (
            existing.get("type") == "dynamic-tool" if existing is not None else bool(chunk.get("dynamic"))
        )
        options = {key: chunk[key] for key in TOOL_RESULT_FIELDS if key in chunk and key != "dynamic"}
        options.update(
            toolCallId=chunk["toolCallId"],
            toolName=chunk["toolName"],
            state="output-error",
            input=chunk["input"],
            errorText=chunk["errorText"],
        )
        self._update_tool(options, dynamic=dynamic)

    def _tool_approval_request(self, chunk: dict[str, Any]) -> None:
        part = self._find_tool(chunk["toolCallId"])
        part["state"] = "approval-requested"
        part["approval"] = {"id": chunk["approvalId"]}

    def _tool_output_denied(self, chunk: dict[str, Any]) -> None:
        self._find_tool(chunk["toolCallId"])["state"] = "output-denied"

    def _tool_result(self, chunk: dict[str, Any], options: dict[str, Any]) -> None:
        part = self._find_tool(chunk["toolCallId"])
        dynamic = part.get("type") == "dynamic-tool"
        for key in ("providerExecuted", "providerMetadata", "preliminary"):
            if key in chunk:
                options[key] = chunk[key]
        tool_metadata = chunk.get("toolMetadata", part.get("toolMetadata", ABSENT))
        options.update(
            _present(
                toolCallId=chunk["toolCallId"],
                toolName=part["toolName"] if dynamic else part["type"][len("tool-") :],
                input=part.get("input", ABSENT),
                title=part.get("title", ABSENT),
                toolMetadata=tool_metadata,
            )
        )
        self._update_tool(options, dynamic=dynamic, existing=part)

    def _tool_output_available(self, chunk: dict[str, Any]) -> None:
        self._tool_result(chunk, {"state": "output-available", "output": chunk["output"]})

    def _tool_output_error(self, chunk: dict[str, Any]) -> None:
        options: dict[str, Any] = {"state": "output-error", "errorText": chunk["errorText"]}
        part = self._find_tool(chunk["toolCallId"])
        if _is_static_tool(part) and "rawInput" in part:
            options["rawInput"] = part["rawInput"]
        self._tool_result(chunk, options)

    _handlers: Final[dict[str, Callable[[UIMessageAssembler, dict[str, Any]], None]]] = {
        "start-step": _start_step,
        "finish-step": _finish_step,
        "text-start": _text_start,
        "text-delta": _text_delta,
        "text-end": _text_end,
        "reasoning-start": _reasoning_start,
        "reasoning-delta": _reasoning_delta,
        "reasoning-end": _reasoning_end,
        "tool-input-start": _tool_input_start,
        "tool-input-delta": _tool_input_delta,
        "tool-input-available": _tool_input_available,
        "tool-input-error": _tool_input_error,
        "tool-approval-request": _tool_approval_request,
        "tool-output-available": _tool_output_available,
        "tool-output-error": _tool_output_error,
        "tool-output-denied": _tool_output_denied,
    }


def _merge_objects(base: Any, overrides: Any) -> Any:
    """`mergeObjects`: nested JSON objects merge key by key; anything else is replaced."""
    if not isinstance(base, dict) or not isinstance(overrides, dict):
        return overrides
    merged = dict(base)
    for key, value in overrides.items():
        if key in ("__proto__", "constructor", "prototype"):
            continue
        current = merged.get(key)
        merged[key] = _merge_objects(current, value) if isinstance(current, dict) else value
    return merged


# --- the public entry point ---

_METADATA_CHUNKS: Final = frozenset({"start", "finish", "message-metadata"})


def assemble_ui_messages(
    chunks: Iterable[Mapping[str, Any]],
    messages: Sequence[Mapping[str, Any]] = (),
    *,
    message_id: str | None = None,
) -> list[UIMessage]:
    """The conversation after one streamed response, as the AI SDK client (`useChat`) holds it.

    `messages` is the history the turn ran on (`AgentRun.messages`), `chunks` the response's UI message
    chunks: what `AgentSession.stream` yields, or what the HTTP stream carried (`start`, `finish` and
    `message-metadata` chunks set the message's id and merge its metadata). When the history ends
    with an assistant message (a continuation after an approval) that message is continued, with its
    id; otherwise a new assistant message is appended, with the `start` chunk's `messageId`, else
    `message_id`, else a random id. Neither argument is modified. Raises `InvalidUIMessageChunkError`
    for a chunk the client would refuse; an `error` or `abort` chunk leaves the message as it is.
    """
    history: list[UIMessage] = [to_client_json(dict(message))[1] for message in messages]
    continued = bool(history) and history[-1].get("role") == "assistant"
    message: UIMessage = (
        history.pop() if continued else {"id": message_id or uuid.uuid4().hex, "role": "assistant"}
    )
    message.setdefault("parts", [])
    assembler = UIMessageAssembler(message)
    for chunk in chunks:
        value = to_client_json(dict(chunk))[1]
        kind = value.get("type")
        if kind in _METADATA_CHUNKS:
            if kind == "start" and isinstance(value.get("messageId"), str) and value["messageId"]:
                message["id"] = value["messageId"]
            assembler.apply_metadata(value.get("messageMetadata"))
        elif kind not in ("error", "abort"):
            assembler.apply(value)
    return [*history, assembler.assembled_message()]
