"""The conversation statements that vary with an application's schema and a listing's filter.

Identifiers come only from bastion's own column list and the application's registered columns
(`AppColumn` names, checked when registered); every value is a parameter. The Postgres statements
rely on row-level security for the caller's rows; the SQLite ones add the owner and tenant clause.
Statements are plain text, so the SQLite store needs no Postgres driver.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

from bastion.stores._turn_persistence import check_title
from bastion.stores.entities import Conversation, check_text
from bastion.stores.errors import InvalidInputError
from bastion.stores.filters import CheckedFilter, InvalidFilterError, from_microseconds, microseconds
from bastion.stores.schema import ConversationSchema

__all__ = [
    "conversation_from_row",
    "new_conversation_values",
    "postgres_insert",
    "postgres_list",
    "postgres_select",
    "sqlite_insert",
    "sqlite_list",
    "sqlite_select",
]

_BASTION_COLUMNS: Final = (
    "title",
    "tenant_id",
    "revision",
    "created_at",
    "updated_at",
    "agent_name",
    "state",
)


def new_conversation_values(
    schema: ConversationSchema[Any],
    *,
    title: str | None,
    agent_name: str | None,
    state: object,
    columns: Mapping[str, object] | None,
) -> dict[str, Any]:
    """The checked values a new conversation is inserted with (state as validated JSON text)."""
    check_title(title)
    values: dict[str, Any] = {"title": title}
    if agent_name is not None:
        values["agent_name"] = check_text(agent_name)
    if state is not None:
        values["state"] = schema.dump_state(state)
    try:
        values |= schema.check_columns(columns or {})
    except InvalidFilterError:
        raise InvalidInputError() from None
    return values


def conversation_from_row(
    schema: ConversationSchema[Any],
    row: tuple[Any, ...],
    *,
    time: Callable[[Any], datetime] = lambda value: value,
    stored_json: Callable[[Any], Any] = lambda value: value,
) -> Conversation[Any]:
    """A row of the select list as a `Conversation`, its state as the application's type."""
    conversation_id, title, tenant_id, revision, created_at, updated_at, agent_name, state = row[:8]
    return Conversation(
        id=conversation_id,
        title=title,
        tenant_id=tenant_id,
        revision=revision,
        created_at=time(created_at),
        updated_at=time(updated_at),
        agent_name=agent_name,
        state=schema.load_state(stored_json(state) if state is not None else None),
        columns={
            name: column.read(value)
            for (name, column), value in zip(schema.columns.items(), row[8:], strict=True)
        },
    )


def sqlite_json(text: str) -> Any:
    return json.loads(text)


def postgres_select(schema: ConversationSchema[Any]) -> str:
    """The select list `conversation_from_row` reads: bastion's columns, then the registered ones."""
    return ", ".join(["id::text", *(_quoted(name) for name in (*_BASTION_COLUMNS, *schema.columns))])


def postgres_insert(
    schema: ConversationSchema[Any], values: Mapping[str, Any], *, if_absent: bool = False
) -> str:
    """Insert the given columns only, so the others keep their defaults (owner, tenant, times).
    `if_absent`: an id that is taken (whoever's it is) inserts and returns nothing, and fails nothing."""
    names = ", ".join(_quoted(name) for name in ("id", *values))
    placeholders = ["coalesce(%(id)s::uuid, gen_random_uuid())"]
    placeholders += [f"%({name})s::jsonb" if name == "state" else f"%({name})s" for name in values]
    conflict = "on conflict (id) do nothing " if if_absent else ""
    return (
        f"insert into bastion.conversations ({names}) values ({', '.join(placeholders)}) "
        f"{conflict}returning {postgres_select(schema)}"
    )


def postgres_list(schema: ConversationSchema[Any], where: CheckedFilter) -> tuple[str, dict[str, Any]]:
    """The caller's conversations matching `where`, most recent first; row-level security scopes it."""
    condition, params = _condition(
        where, placeholder=lambda name: f"%({name})s", time=lambda value: value, identifier=_quoted
    )
    statement = (
        f"select {postgres_select(schema)} from bastion.conversations where {condition} "
        "order by updated_at desc, id limit %(limit)s"
    )
    return statement, params


def sqlite_select(schema: ConversationSchema[Any]) -> str:
    # Unquoted: SQLite reads a double-quoted name that is no column as a string, silently.
    return ", ".join(["id", *_BASTION_COLUMNS, *schema.columns])


def sqlite_insert(schema: ConversationSchema[Any], values: Mapping[str, Any]) -> str:
    names = ["id", "owner_id", "tenant_id", "created_at", "updated_at", *values]
    placeholders = [":id", ":owner", ":tenant", ":now", ":now", *(f":{name}" for name in values)]
    return (
        f"insert into bastion_conversations ({', '.join(names)}) "
        f"values ({', '.join(placeholders)}) returning {sqlite_select(schema)}"
    )


def sqlite_list(schema: ConversationSchema[Any], where: CheckedFilter) -> tuple[str, dict[str, Any]]:
    """The same listing for SQLite, inside the caller's owner and tenant."""
    condition, params = _condition(
        where, placeholder=lambda name: f":{name}", time=microseconds, identifier=lambda name: name
    )
    statement = (
        f"select {sqlite_select(schema)} from bastion_conversations "
        f"where owner_id = :owner and tenant_id is :tenant and {condition} "
        "order by updated_at desc, id limit :limit"
    )
    return statement, params


def _condition(
    where: CheckedFilter,
    *,
    placeholder: Callable[[str], str],
    time: Callable[[datetime], Any],
    identifier: Callable[[str], str],
) -> tuple[str, dict[str, Any]]:
    """The filter as `and`-ed clauses over named parameters (`f_...`, never a name from input)."""
    clauses = ["true"]
    params: dict[str, Any] = {}
    if where.agent_name is not None:
        clauses.append(f"agent_name = {placeholder('f_agent')}")
        params["f_agent"] = where.agent_name
    for index, (name, value) in enumerate(where.columns.items()):
        key = f"f_column_{index}"
        clauses.append(f"{identifier(name)} = {placeholder(key)}")
        params[key] = value
    if where.updated_after is not None:
        clauses.append(f"updated_at > {placeholder('f_after')}")
        params["f_after"] = time(where.updated_after)
    if where.updated_before is not None:
        clauses.append(f"updated_at < {placeholder('f_before')}")
        params["f_before"] = time(where.updated_before)
    if where.cursor is not None:
        stamp, last_id = where.cursor
        at, after_id = placeholder("f_cursor_at"), placeholder("f_cursor_id")
        clauses.append(f"(updated_at < {at} or (updated_at = {at} and id > {after_id}))")
        params["f_cursor_at"] = time(from_microseconds(stamp))
        params["f_cursor_id"] = last_id
    return " and ".join(clauses), params


def _quoted(name: str) -> str:
    """A bastion column name or a registered one (checked `[a-z][a-z0-9_]*` when registered, so it
    needs no escaping), quoted."""
    return f'"{name}"'
