"""The assistant UI message assembled from UI message stream chunks, exactly as the AI SDK client does.

The server stores what the browser assembled, so this mirrors `processUIMessageStream` of the `ai`
package (6.0 and 7.0) for the chunks bastion's loop emits, and refuses what either client would refuse:
each chunk is checked against the fields both versions accept before it is applied. JavaScript's
`undefined` does not survive JSON, so a key is set only when the client would serialize it (`_ABSENT`
stands for `undefined`, `None` is JSON `null`). Values pass through JSON once (`to_client_json`) so that
numbers read as the client reads them: `1.0` becomes `1`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

UIMessage = dict[str, Any]
UIPart = dict[str, Any]


class InvalidUIMessageChunkError(Exception):
    """A chunk the AI SDK client would refuse; the stream must not send it."""

    code = "invalid_ui_message_chunk"


class _Absent:
    """JavaScript's `undefined`: the key is not written."""

    def __repr__(self) -> str:
        return "<absent>"


_ABSENT: Final = _Absent()
_MAX_SAFE_INTEGER: Final = 2**53


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _js_number(text: str) -> int | float:
    """A JSON number as `JSON.parse` reads it: integral values are plain integers."""
    value = float(text)
    if value.is_integer() and abs(value) < _MAX_SAFE_INTEGER:
        return int(value)
    return value


def _loads(text: str) -> Any:
    return json.loads(text, parse_float=_js_number, parse_constant=_reject_constant)


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def to_client_json(value: Any) -> tuple[bytes, Any]:
    """The compact UTF-8 wire text of `value` and the value the client parses from it.

    Raises `ValueError` or `TypeError` for values that are not JSON (NaN, sets, objects).
    A NUL or a lone surrogate (which a model or a tool can produce, and which neither UTF-8 nor
    Postgres can carry) becomes U+FFFD, so the client and the stored message see the same text.
    A flat object of strings (every text and reasoning chunk) reads back as itself, so the hot path
    skips parsing it again.
    """
    text = _encode(value)
    wire = _utf8(text)
    if wire is None:
        value = _replace_unencodable(value)
        text = _encode(value)
        wire = text.encode()
    if type(value) is dict and all(type(item) is str for item in value.values()):
        return wire, value
    return wire, _loads(text)


def _utf8(text: str) -> bytes | None:
    """`text` as UTF-8, or None when it holds a NUL (escaped by JSON) or a lone surrogate."""
    if "\\u0000" in text:
        return None
    try:
        return text.encode()
    except UnicodeEncodeError:
        return None


_UNENCODABLE: Final = re.compile("[\x00\ud800-\udfff]")


def _replace_unencodable(value: Any) -> Any:
    if isinstance(value, str):
        return _UNENCODABLE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replace_unencodable(key): _replace_unencodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_replace_unencodable(item) for item in value]
    return value


# --- chunk fields accepted by both `ai` 6 and 7 (`uiMessageChunkSchema`), for the chunks the loop emits ---


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
_TOOL_CALL_FIELDS: Final[dict[str, _Check]] = {
    "providerExecuted": _boolean,
    "providerMetadata": _provider_metadata,
    "toolMetadata": _json_object,
    "dynamic": _boolean,
    "title": _string,
}
_TOOL_RESULT_FIELDS: Final[dict[str, _Check]] = {
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
    "tool-input-start": ({"toolCallId": _string, "toolName": _string}, _TOOL_CALL_FIELDS),
    "tool-input-delta": ({"toolCallId": _string, "inputTextDelta": _string}, {}),
    "tool-input-available": (
        {"toolCallId": _string, "toolName": _string, "input": _anything},
        _TOOL_CALL_FIELDS,
    ),
    "tool-input-error": (
        {"toolCallId": _string, "toolName": _string, "input": _anything, "errorText": _string},
        _TOOL_CALL_FIELDS,
    ),
    "tool-approval-request": ({"approvalId": _string, "toolCallId": _string}, {}),
    "tool-output-available": (
        {"toolCallId": _string, "output": _anything},
        {**_TOOL_RESULT_FIELDS, "preliminary": _boolean},
    ),
    "tool-output-error": ({"toolCallId": _string, "errorText": _string}, _TOOL_RESULT_FIELDS),
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


# --- assembly (`processUIMessageStream`) ---


@dataclass
class _PartialToolCall:
    text: str
    tool_name: str
    dynamic: bool
    title: Any
    tool_metadata: Any


def _assign(part: UIPart, key: str, value: Any) -> None:
    if value is _ABSENT:
        part.pop(key, None)
    else:
        part[key] = value


def _present(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not _ABSENT}


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
        provider_metadata = options.get("providerMetadata", _ABSENT)
        metadata_key = "resultProviderMetadata" if state in _RESULT_STATES else "callProviderMetadata"
        if part is None:
            name = options["toolName"]
            created = _present(
                type="dynamic-tool" if dynamic else f"tool-{name}",
                toolName=name if dynamic else _ABSENT,
                toolCallId=options["toolCallId"],
                state=state,
                title=options.get("title", _ABSENT),
                toolMetadata=options.get("toolMetadata", _ABSENT),
                input=options.get("input", _ABSENT),
                output=options.get("output", _ABSENT),
                rawInput=_ABSENT if dynamic else options.get("rawInput", _ABSENT),
                errorText=options.get("errorText", _ABSENT),
                providerExecuted=options.get("providerExecuted", _ABSENT),
                preliminary=options.get("preliminary", _ABSENT),
            )
            if provider_metadata is not _ABSENT:
                created[metadata_key] = provider_metadata
            self._parts.append(created)
            return created
        part["state"] = state
        if dynamic:
            part["toolName"] = options["toolName"]
        else:
            part["type"] = f"tool-{options['toolName']}"
        for key in ("input", "output", "errorText", "rawInput"):
            _assign(part, key, options.get(key, _ABSENT))
        part.pop("inputEncoding", None)
        _assign(part, "preliminary", options.get("preliminary", _ABSENT))
        for key in ("title", "toolMetadata"):
            if key in options:
                part[key] = options[key]
        _assign(
            part, "providerExecuted", options.get("providerExecuted", part.get("providerExecuted", _ABSENT))
        )
        if provider_metadata is not _ABSENT:
            part[metadata_key] = provider_metadata
        return part

    # --- handlers, one per chunk type ---

    def _start_step(self, chunk: dict[str, Any]) -> None:
        self._parts.append({"type": "step-start"})

    def _finish_step(self, chunk: dict[str, Any]) -> None:
        self._active_text = {}
        self._active_reasoning = {}

    def _text_start(self, chunk: dict[str, Any]) -> None:
        part = _present(type="text", text="", providerMetadata=chunk.get("providerMetadata", _ABSENT))
        part["state"] = "streaming"
        self._active_text[chunk["id"]] = part
        self._parts.append(part)

    def _reasoning_start(self, chunk: dict[str, Any]) -> None:
        part = _present(
            type="reasoning", id=chunk["id"], text="", providerMetadata=chunk.get("providerMetadata", _ABSENT)
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
            title=chunk.get("title", _ABSENT),
            tool_metadata=chunk.get("toolMetadata", _ABSENT),
        )
        options = {key: chunk[key] for key in _TOOL_CALL_FIELDS if key in chunk and key != "dynamic"}
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
        options = {key: chunk[key] for key in _TOOL_CALL_FIELDS if key in chunk and key != "dynamic"}
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
        options = {key: chunk[key] for key in _TOOL_RESULT_FIELDS if key in chunk and key != "dynamic"}
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
        tool_metadata = chunk.get("toolMetadata", part.get("toolMetadata", _ABSENT))
        options.update(
            _present(
                toolCallId=chunk["toolCallId"],
                toolName=part["toolName"] if dynamic else part["type"][len("tool-") :],
                input=part.get("input", _ABSENT),
                title=part.get("title", _ABSENT),
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


# --- partial tool input (`parsePartialJson` with ai 7's `fixJson`) ---


def parse_partial_json(text: str) -> Any:
    """The input the client shows while tool arguments stream: parsed, repaired, or absent."""
    try:
        return _loads(text)
    except ValueError:
        pass
    try:
        return _loads(fix_json(text))
    except ValueError:
        return _ABSENT


_LITERALS: Final = ("true", "false", "null")
_OBJECT_STATES: Final = frozenset(
    {
        "OBJECT_KEY",
        "OBJECT_AFTER_KEY",
        "OBJECT_AFTER_COMMA",
        "OBJECT_START",
        "OBJECT_BEFORE_VALUE",
        "OBJECT_AFTER_VALUE",
    }
)
_ARRAY_STATES: Final = frozenset({"ARRAY_START", "ARRAY_AFTER_COMMA", "ARRAY_AFTER_VALUE"})
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")


def fix_json(text: str) -> str:
    """Close a truncated JSON text: a port of the `ai` package's `fixJson` (7.0) scanner."""
    stack = ["ROOT"]
    last_valid = -1
    literal_start = 0
    unicode_digits = 0

    def value_start(char: str, index: int, swap_state: str) -> None:
        nonlocal last_valid, literal_start
        pushed = {"{": "OBJECT_START", "[": "ARRAY_START", '"': "STRING"}.get(char)
        if char in "ftn":
            pushed = "LITERAL"
            literal_start = index
        elif char == "-" or (char.isdigit() and char.isascii()):
            pushed = "NUMBER"
        if pushed is None:
            return
        if char != "-":
            last_valid = index
        stack.pop()
        stack.append(swap_state)
        stack.append(pushed)

    def after_object_value(char: str, index: int) -> None:
        nonlocal last_valid
        if char == ",":
            stack.pop()
            stack.append("OBJECT_AFTER_COMMA")
        elif char == "}":
            last_valid = index
            stack.pop()

    def after_array_value(char: str, index: int) -> None:
        nonlocal last_valid
        if char == ",":
            stack.pop()
            stack.append("ARRAY_AFTER_COMMA")
        elif char == "]":
            last_valid = index
            stack.pop()

    for index, char in enumerate(text):
        state = stack[-1]
        if state == "ROOT":
            value_start(char, index, "FINISH")
        elif state in ("OBJECT_START", "OBJECT_AFTER_COMMA"):
            if char == '"':
                stack[-1] = "OBJECT_KEY"
            elif char == "}" and state == "OBJECT_START":
                last_valid = index
                stack.pop()
        elif state == "OBJECT_KEY":
            if char == '"':
                stack[-1] = "OBJECT_AFTER_KEY"
        elif state == "OBJECT_AFTER_KEY":
            if char == ":":
                stack[-1] = "OBJECT_BEFORE_VALUE"
        elif state == "OBJECT_BEFORE_VALUE":
            value_start(char, index, "OBJECT_AFTER_VALUE")
        elif state == "OBJECT_AFTER_VALUE":
            after_object_value(char, index)
        elif state == "STRING":
            if char == '"':
                stack.pop()
                last_valid = index
            elif char == "\\":
                stack.append("STRING_ESCAPE")
            else:
                last_valid = index
        elif state == "ARRAY_START":
            if char == "]":
                last_valid = index
                stack.pop()
            else:
                value_start(char, index, "ARRAY_AFTER_VALUE")
        elif state == "ARRAY_AFTER_VALUE":
            if char in ",]":
                after_array_value(char, index)
            else:
                last_valid = index
        elif state == "ARRAY_AFTER_COMMA":
            value_start(char, index, "ARRAY_AFTER_VALUE")
        elif state == "STRING_ESCAPE":
            stack.pop()
            if char == "u":
                unicode_digits = 0
                stack.append("STRING_UNICODE_ESCAPE")
            else:
                last_valid = index
        elif state == "STRING_UNICODE_ESCAPE":
            if char in _HEX_DIGITS:
                unicode_digits += 1
                if unicode_digits == 4:
                    stack.pop()
                    last_valid = index
        elif state == "NUMBER":
            if char.isdigit() and char.isascii():
                last_valid = index
            elif char in "eE-.":
                pass
            else:
                stack.pop()
                if char in ",]" and stack[-1] == "ARRAY_AFTER_VALUE":
                    after_array_value(char, index)
                if char in ",}" and stack[-1] == "OBJECT_AFTER_VALUE":
                    after_object_value(char, index)
        elif state == "LITERAL":
            partial = text[literal_start : index + 1]
            if any(literal.startswith(partial) for literal in _LITERALS):
                last_valid = index
            else:
                stack.pop()
                if stack[-1] == "OBJECT_AFTER_VALUE":
                    after_object_value(char, index)
                elif stack[-1] == "ARRAY_AFTER_VALUE":
                    after_array_value(char, index)

    result = text[: last_valid + 1]
    for state in reversed(stack):
        if state == "STRING":
            result += '"'
        elif state in _OBJECT_STATES:
            result += "}"
        elif state in _ARRAY_STATES:
            result += "]"
        elif state == "LITERAL":
            partial = text[literal_start:]
            literal = next((literal for literal in _LITERALS if literal.startswith(partial)), None)
            if literal is not None:
                result += literal[len(partial) :]
    return result


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
