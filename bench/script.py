"""The scripted turn every system serves: call `lookup` once, then stream N words as N text deltas.

Every system's zero-latency model follows this script, so the work is the same; the word count travels
in the user's prompt, which lets one server answer both the 200-word turns and the short calibration
turns that separate the fixed cost of a turn from the cost of each delta.
"""

from __future__ import annotations

import re
from typing import Any, Final

WORDS: Final = 200
TOOL_NAME: Final = "lookup"
TOOL_ARGS: Final[dict[str, Any]] = {"key": "alpha"}

_WORD_COUNT = re.compile(r"write (\d+) words")


def lookup_result(key: str) -> dict[str, Any]:
    """What the `lookup` tool returns: a small dict."""
    return {"key": key, "value": "forty-two", "found": True}


def word(index: int) -> str:
    """The text of delta `index`."""
    return f"word{index} "


def prompt(words: int) -> str:
    """The user's message asking for `words` words."""
    return f"Look up alpha, then write {words} words."


def requested_words(text: str) -> int:
    """The word count a prompt asks for; the script's model reads it from the latest user message."""
    found = _WORD_COUNT.search(text)
    if found is None:
        raise ValueError("The prompt does not say how many words to write.")
    return int(found.group(1))


def tool_call_id(user_turns: int) -> str:
    """A call id unique within a conversation: one tool call per user turn."""
    return f"call-{user_turns}"
