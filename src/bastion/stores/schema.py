"""What an application adds to bastion's conversations: its typed state and its own columns.

`ConversationSchema(state=TaskState, columns=[AppColumn("project_id", "uuid")])` is given to a store
once. The state type is a pydantic model or a dataclass (anything pydantic validates): state is
validated on every write (`InvalidStateError`, code `invalid_state`) and returned as that type on
reads, so `Conversation[TaskState].state` is a `TaskState`. State is the application's: it is never
sent to the model (put it in a context message if the model should see it) and the HTTP routes show
or take it only when the application's `ConversationRules` allow.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final, Generic, TypeVar

import pydantic

from bastion.errors import BastionError
from bastion.stores.entities import is_storable_text
from bastion.stores.filters import AppColumn, InvalidFilterError

__all__ = ["ConversationSchema", "InvalidStateError"]

State = TypeVar("State")

_MAX_STATE_BYTES = 1_000_000
_MAX_DETAILS = 3


class InvalidStateError(BastionError):
    """The conversation state does not match the application's state type."""

    code: ClassVar[str] = "invalid_state"
    status: ClassVar[int] = 400


class ConversationSchema(Generic[State]):
    """The application's state type (None: any JSON object) and its registered columns."""

    def __init__(self, *, state: type[State] | None = None, columns: Iterable[AppColumn] = ()) -> None:
        by_name: dict[str, AppColumn] = {}
        for column in columns:
            if column.name in by_name:
                raise ValueError(f"The column {column.name!r} is registered twice.")
            by_name[column.name] = column
        self.state: Final = state
        self.columns: Final[Mapping[str, AppColumn]] = by_name
        self._adapter: Final = pydantic.TypeAdapter(state) if state is not None else None

    def dump_state(self, value: object) -> str:
        """The state as JSON text, after validation; `InvalidStateError` says what is wrong."""
        adapter = self._adapter
        if adapter is None:
            if not isinstance(value, Mapping):
                raise InvalidStateError("The conversation state must be a JSON object.")
            plain: Any = value
        else:
            try:
                plain = adapter.dump_python(adapter.validate_python(value), mode="json")
            except pydantic.ValidationError as error:
                raise InvalidStateError(_describe(error)) from None
        try:
            text = json.dumps(plain, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            raise InvalidStateError("The conversation state must be JSON.") from None
        if not is_storable_text(text) or len(text.encode()) > _MAX_STATE_BYTES:
            raise InvalidStateError(
                "The conversation state is too large or holds text that cannot be stored."
            )
        return text

    def load_state(self, stored: Any) -> State | None:
        """The stored state (parsed JSON, or None) as the application's type."""
        if stored is None:
            return None
        if self._adapter is None:
            result: State = stored
            return result
        return self._adapter.validate_python(stored)

    def check_columns(self, values: Mapping[str, object]) -> dict[str, Any]:
        """Values for registered columns, checked; an unregistered name is refused."""
        checked: dict[str, Any] = {}
        for name, value in values.items():
            column = self.columns.get(name)
            if column is None:
                raise InvalidFilterError(name)
            checked[name] = None if value is None else column.check(value)
        return checked


def _describe(error: pydantic.ValidationError) -> str:
    """Where and how the state is wrong, without echoing the values that were sent."""
    details = []
    for item in error.errors(include_url=False, include_input=False)[:_MAX_DETAILS]:
        where = ".".join(str(part) for part in item["loc"]) or "state"
        details.append(f"{where}: {item['msg']}")
    return "The conversation state is not valid: " + "; ".join(details) + "."
