"""JSON as the AI SDK client reads and writes it, so the server holds the same values as the browser.

Values pass through JSON once (`to_client_json`) so that numbers read as `JSON.parse` reads them
(`1.0` becomes `1`), and text neither UTF-8 nor Postgres can carry is replaced the same way on both
sides. JavaScript's `undefined` does not survive JSON: `ABSENT` stands for it (a key that is not
written), while `None` is JSON `null`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["ABSENT", "parse_client_json", "text_delta_json", "to_client_json"]


class _Absent:
    """JavaScript's `undefined`: the key is not written."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Final = _Absent()
_MAX_SAFE_INTEGER: Final = 2**53


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _js_number(text: str) -> int | float:
    """A JSON number as `JSON.parse` reads it: integral values are plain integers."""
    value = float(text)
    if value.is_integer() and abs(value) < _MAX_SAFE_INTEGER:
        return int(value)
    return value


def parse_client_json(text: str) -> Any:
    """`JSON.parse`: integral numbers are integers, NaN and Infinity are refused."""
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
    return wire, parse_client_json(text)


_encode_string = json.encoder.encode_basestring  # what `_encode` writes for a string
_TEXT_DELTA_START: Final = b'{"type":"text-delta","id":'
_TEXT_DELTA_KEYS: Final = ("type", "id", "delta")


def text_delta_json(chunk: Any) -> bytes | None:
    """The wire JSON of a plain text delta (`type`, `id` and `delta`, in that order, as bastion's loop
    makes it), from its two strings: what `to_client_json(chunk)[0]` gives, without encoding the dict.
    The chunk reads back as itself. None for any other chunk, or text `to_client_json` would replace."""
    if type(chunk) is not dict or tuple(chunk) != _TEXT_DELTA_KEYS or chunk["type"] != "text-delta":
        return None
    part_id, delta = chunk.get("id"), chunk.get("delta")
    if type(part_id) is not str or type(delta) is not str or "\x00" in delta or "\x00" in part_id:
        return None
    try:
        return b"".join(
            (
                _TEXT_DELTA_START,
                _encode_string(part_id).encode(),
                b',"delta":',
                _encode_string(delta).encode(),
                b"}",
            )
        )
    except UnicodeEncodeError:  # a lone surrogate
        return None


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
