"""The tool input the AI SDK client shows while a tool call's arguments stream: `parsePartialJson`
with ai 7's `fixJson`, which closes a truncated JSON text so that it parses.
"""

from __future__ import annotations

from typing import Any, Final

from bastion._client_json import ABSENT, parse_client_json

__all__ = ["fix_json", "parse_partial_json"]


def parse_partial_json(text: str) -> Any:
    """The input the client shows while tool arguments stream: parsed, repaired, or absent."""
    try:
        return parse_client_json(text)
    except ValueError:
        pass
    try:
        return parse_client_json(fix_json(text))
    except ValueError:
        return ABSENT


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
