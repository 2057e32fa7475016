"""Filters on a caller's conversations: agent name, registered application columns, time ranges, cursor.

A filter narrows what the store's rules already allow (row-level security in Postgres, scoped queries
in SQLite); it can never widen it. Application columns are named only from the closed set the
application registered (`AppColumn`), so no identifier ever comes from input; values are parameters.
Every malformed value is `InvalidFilterError` naming the parameter, before any query runs.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final, Literal, TypeAlias

from bastion.errors import BastionError
from bastion.stores.entities import Conversation, check_text, is_storable_text

__all__ = [
    "AppColumn",
    "ColumnKind",
    "ConversationFilter",
    "InvalidFilterError",
    "conversation_cursor",
]

ColumnKind: TypeAlias = Literal["uuid", "text", "integer", "boolean"]

_COLUMN_NAME: Final = re.compile(r"[a-z][a-z0-9_]{0,62}")
# bastion's own columns and the list route's own parameters: an application column cannot shadow them.
RESERVED_NAMES: Final = frozenset(
    {
        "id",
        "owner_id",
        "tenant_id",
        "title",
        "revision",
        "active_run_id",
        "created_at",
        "updated_at",
        "agent_name",
        "state",
        "agent",
        "before",
        "after",
        "cursor",
        "limit",
    }
)
_BIGINT: Final = 2**63 - 1
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


class InvalidFilterError(BastionError):
    """A filter value is malformed, or names no registered column; `parameter` says which."""

    code: ClassVar[str] = "invalid_filter"
    status: ClassVar[int] = 400

    def __init__(self, parameter: str) -> None:
        self.parameter = parameter
        super().__init__(f"The filter {parameter!r} is not valid.", field=parameter)


@dataclass(frozen=True, slots=True)
class AppColumn:
    """An application's own column on the conversations table that listings may filter on.

    The application adds the column in its own migration; registering it here makes it selectable
    and filterable. `kind` says how a value is checked (and parsed from a query string).
    """

    name: str
    kind: ColumnKind = "text"

    def __post_init__(self) -> None:
        if not _COLUMN_NAME.fullmatch(self.name) or self.name in RESERVED_NAMES:
            raise ValueError(
                f"{self.name!r} cannot be an application column: use a lower-case SQL name that is not "
                "one of bastion's own columns or list parameters."
            )
        if self.kind not in ("uuid", "text", "integer", "boolean"):
            raise ValueError(f"Unknown column kind {self.kind!r}.")

    def check(self, value: object) -> Any:
        """`value` as stored, or `InvalidFilterError` naming this column."""
        if self.kind == "uuid":
            if isinstance(value, uuid.UUID):
                return str(value)
            if isinstance(value, str) and len(value) == 36:
                try:
                    return str(uuid.UUID(value))
                except ValueError:
                    pass
        elif self.kind == "text":
            if isinstance(value, str) and value and len(value) <= 200 and is_storable_text(value):
                return value
        elif self.kind == "integer":
            if type(value) is int and -_BIGINT - 1 <= value <= _BIGINT:
                return value
        elif type(value) is bool:
            return value
        raise InvalidFilterError(self.name)

    def parse(self, text: str) -> Any:
        """A query-string value of this column."""
        if self.kind == "integer":
            digits = text[1:] if text.startswith("-") else text
            if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
                raise InvalidFilterError(self.name)
            return self.check(int(text))
        if self.kind == "boolean":
            if text not in ("true", "false"):
                raise InvalidFilterError(self.name)
            return text == "true"
        return self.check(text)

    def read(self, value: Any) -> Any:
        """A stored value as the application sees it (a UUID as its text)."""
        return str(value) if isinstance(value, uuid.UUID) else value


@dataclass(frozen=True, slots=True, kw_only=True)
class ConversationFilter:
    """What a listing keeps: conversations of `agent_name`, whose registered `columns` equal the given
    values, last active after `updated_after` and before `updated_before`, and after `cursor` (the
    `conversation_cursor` of the previous page's last conversation). Listings are most recent first.
    """

    agent_name: str | None = None
    columns: Mapping[str, Any] = field(default_factory=dict)
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    cursor: str | None = None

    def checked(self, registered: Mapping[str, AppColumn]) -> CheckedFilter:
        """The filter with every value checked, ready for a store's query."""
        if self.agent_name is not None:
            try:
                check_text(self.agent_name)
            except Exception:
                raise InvalidFilterError("agent") from None
        columns: dict[str, Any] = {}
        for name, value in self.columns.items():
            column = registered.get(name)
            if column is None:
                raise InvalidFilterError(name)
            columns[name] = column.check(value)
        return CheckedFilter(
            agent_name=self.agent_name,
            columns=columns,
            updated_after=_aware(self.updated_after, "after"),
            updated_before=_aware(self.updated_before, "before"),
            cursor=parse_cursor(self.cursor) if self.cursor is not None else None,
        )

    @classmethod
    def from_query(cls, params: Mapping[str, str], registered: Mapping[str, AppColumn]) -> ConversationFilter:
        """The filter a list route's query string asks for: `agent`, `before`, `after` (ISO 8601 times
        with a UTC offset), `cursor` and the registered columns; any other parameter but `limit` is
        refused."""
        columns: dict[str, Any] = {}
        for name, text in params.items():
            if name in ("agent", "before", "after", "cursor", "limit"):
                continue
            column = registered.get(name)
            if column is None:
                raise InvalidFilterError(name)
            columns[name] = column.parse(text)
        return cls(
            agent_name=params.get("agent"),
            columns=columns,
            updated_after=_parse_time(params, "after"),
            updated_before=_parse_time(params, "before"),
            cursor=params.get("cursor"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedFilter:
    """A `ConversationFilter` whose values passed their checks; the cursor as (microseconds, id)."""

    agent_name: str | None
    columns: Mapping[str, Any]
    updated_after: datetime | None
    updated_before: datetime | None
    cursor: tuple[int, str] | None


def conversation_cursor(conversation: Conversation[Any]) -> str:
    """Where the next page starts: after this conversation in most-recent-first order."""
    return f"{microseconds(conversation.updated_at)}.{conversation.id}"


def parse_cursor(text: object) -> tuple[int, str]:
    if isinstance(text, str) and len(text) <= 60:
        stamp, _, identifier = text.partition(".")
        if stamp.isascii() and stamp.isdigit() and len(stamp) <= 18 and len(identifier) == 36:
            try:
                return int(stamp), str(uuid.UUID(identifier))
            except ValueError:
                pass
    raise InvalidFilterError("cursor")


def microseconds(moment: datetime) -> int:
    """Microseconds since the Unix epoch, exact."""
    return (moment - _EPOCH) // timedelta(microseconds=1)


def from_microseconds(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def _aware(moment: object, parameter: str) -> datetime | None:
    if moment is None:
        return None
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise InvalidFilterError(parameter)
    return moment


def _parse_time(params: Mapping[str, str], parameter: str) -> datetime | None:
    text = params.get(parameter)
    if text is None:
        return None
    if len(text) > 40 or not text.isascii():
        raise InvalidFilterError(parameter)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidFilterError(parameter) from None
    return _aware(moment, parameter)
