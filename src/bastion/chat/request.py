"""The AI SDK chat request (the body `useChat` posts): its shape, checked before anything is read or
stored, and its JSON schema, from the same types.

Validation is strict JSON (no `"5"` for 5) and keeps the messages as the plain JSON the browser sent:
reconciliation compares them with the stored ones value for value. The rules that depend on what is
stored (which moves are legitimate, what a new user message may hold) are `bastion.history`'s.

`WireUIMessage` is a UI message as it crosses HTTP, checked; inside, the runtime handles the same
message as a plain dict, `bastion.chat.stream_response.UIMessage` (callbacks typed with
`dict[str, Any]` keep type-checking). The old name `bastion.chat.request.UIMessage` still imports, with
a `DeprecationWarning`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, Literal, Self

from pydantic import ConfigDict, Field, model_validator
from typing_extensions import TypedDict

from bastion._moved import moved_names
from bastion.api import UUID_PATTERN, StrictModel
from bastion.errors import BastionError
from bastion.history import SUBMIT_MESSAGE

__all__ = [
    "UI_MESSAGE_CHUNK",
    "UI_MESSAGE_STREAM_END",
    "UUID_PATTERN",
    "ChatRequest",
    "EmptyMessageError",
    "UIMessage",
    "UIMessagePart",
    "WireUIMessage",
]


UI_MESSAGE_CHUNK: Final[Mapping[str, Any]] = {
    "description": "A UI message chunk: `start`, `text-delta`, `tool-input-available`, `finish`, ….",
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"type": "string"}},
}
UI_MESSAGE_STREAM_END: Final = "[DONE]"


class UIMessagePart(TypedDict):
    """One part of an AI SDK UI message: a `type` (`text`, `file`, `tool-<name>`, …) and its fields."""

    __pydantic_config__ = ConfigDict(extra="allow", strict=True)  # type: ignore[misc]
    type: str


class WireUIMessage(TypedDict):
    """An AI SDK UI message as HTTP carries it (a chat request, a conversation's messages, the client):
    `id`, `role` (`user` or `assistant`) and its `parts`, plus any fields the AI SDK adds (`metadata`)."""

    __pydantic_config__ = ConfigDict(extra="allow", strict=True)  # type: ignore[misc]
    id: Annotated[str, Field(min_length=1, max_length=200)]
    role: Literal["user", "assistant"]
    parts: list[UIMessagePart]


class EmptyMessageError(BastionError):
    """A new user message with nothing in it: no text but blanks and no file. Nothing is stored."""

    code: ClassVar[str] = "empty_message"
    status: ClassVar[int] = 400

    def __init__(self, field: str) -> None:
        super().__init__("The message is empty: write something or attach a file.", field=field)


class ChatRequest(StrictModel):
    """A chat turn: the conversation's id, the AI SDK trigger and the browser's messages (all of them, or
    only the latest)."""

    id: Annotated[str, Field(pattern=UUID_PATTERN, description="The conversation's id (a UUID).")]
    trigger: Literal["submit-message", "regenerate-message"] = SUBMIT_MESSAGE
    messages: Annotated[list[WireUIMessage], Field(min_length=1)]

    @model_validator(mode="after")
    def _says_something(self) -> Self:
        """A message sent (the latest, a user's) holds some text or a file; approvals send none."""
        latest = self.messages[-1]
        if self.trigger == SUBMIT_MESSAGE and latest["role"] == "user":
            parts: list[Any] = list(latest["parts"])
            # A text part that is no string is said so by the history's checks, field by field.
            said = any(
                part.get("type") != "text" or not isinstance(part.get("text"), str) or part["text"].strip()
                for part in parts
            )
            if parts and not said:
                raise EmptyMessageError(f"messages[{len(self.messages) - 1}].parts")
        return self


if TYPE_CHECKING:
    UIMessage = WireUIMessage  # the old name, for type checkers; at run time it warns

__getattr__ = moved_names(__name__, {}, renamed={"UIMessage": (__name__, "WireUIMessage")})
