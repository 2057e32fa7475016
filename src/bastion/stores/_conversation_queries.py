"""The conversation statements that vary with an application's schema and a listing's filter.

Identifiers come only from bastion's own column list and the application's registered columns
(`AppColumn` names, checked when registered); every value is a parameter. The Postgres statements
rely on row-level security for the caller's rows; the SQLite ones add the owner and tenant clause.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

from psycopg import sql

from bastion.stores._turns import check_title
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


def postgres_select(schema: ConversationSchema[Any]) -> sql.Composed:
    """The select list `_conversation_row` reads: bastion's columns, then the registered ones."""
    names = [sql.SQL("id::text"), *(sql.Identifier(name) for name in (*_BASTION_COLUMNS, *schema.columns))]
    return sql.SQL(", ").join(names)


def postgres_insert(schema: ConversationSchema[Any], values: Mapping[str, Any]) -> sql.Composed:
    """Insert the given columns only, so the others keep their defaults (owner, tenant, times)."""
    names = ["id", *values]
    placeholders: list[sql.Composable] = [sql.SQL("coalesce(%(id)s::uuid, gen_random_uuid())")]
    for name in values:
        cast = "::jsonb" if name == "state" else ""
        placeholders.append(sql.SQL("{}" + cast).format(sql.Placeholder(name)))
    return sql.SQL("insert into bastion.conversations ({}) values ({}) returning {}").format(
        sql.SQL(", ").join(sql.Identifier(name) for name in names),
        sql.SQL(", ").join(placeholders),
        postgres_select(schema),
    )


def postgres_list(
    schema: ConversationSchema[Any], where: CheckedFilter
) -> tuple[sql.Composed, dict[str, Any]]:
    """The caller's conversations matching `where`, most recent first; row-level security scopes it."""
    clauses, params = _clauses(
        where, placeholder=lambda name: sql.Placeholder(name), time=lambda value: value
    )
    statement = sql.SQL(
        "select {} from bastion.conversations where {} order by updated_at desc, id limit %(limit)s"
    ).format(postgres_select(schema), sql.SQL(" and ").join(clauses))
    return statement, params


def sqlite_select(schema: ConversationSchema[Any]) -> str:
    return ", ".join(["id", *_BASTION_COLUMNS, *(_quoted(name) for name in schema.columns)])


def sqlite_insert(schema: ConversationSchema[Any], values: Mapping[str, Any]) -> str:
    names = ["id", "owner_id", "tenant_id", "created_at", "updated_at", *values]
    placeholders = [":id", ":owner", ":tenant", ":now", ":now", *(f":{name}" for name in values)]
    return (
        f"insert into bastion_conversations ({', '.join(_quoted(name) for name in names)}) "
        f"values ({', '.join(placeholders)}) returning {sqlite_select(schema)}"
    )


def sqlite_list(schema: ConversationSchema[Any], where: CheckedFilter) -> tuple[str, dict[str, Any]]:
    """The same listing for SQLite, inside the caller's owner and tenant."""
    clauses, params = _clauses(where, placeholder=lambda name: sql.SQL(f":{name}"), time=microseconds)
    condition = " and ".join(clause.as_string(None) for clause in clauses)
    statement = (
        f"select {sqlite_select(schema)} from bastion_conversations "
        f"where owner_id = :owner and tenant_id is :tenant and {condition} "
        "order by updated_at desc, id limit :limit"
    )
    return statement, params


def _clauses(
    where: CheckedFilter, *, placeholder: Any, time: Any
) -> tuple[list[sql.Composable], dict[str, Any]]:
    """The filter as `and`-ed clauses over named parameters (`f_...`, never a column name from input)."""
    clauses: list[sql.Composable] = [sql.SQL("true")]
    params: dict[str, Any] = {}
    if where.agent_name is not None:
        clauses.append(sql.SQL("agent_name = {}").format(placeholder("f_agent")))
        params["f_agent"] = where.agent_name
    for index, (name, value) in enumerate(where.columns.items()):
        key = f"f_column_{index}"
        clauses.append(sql.SQL("{} = {}").format(_identifier(name), placeholder(key)))
        params[key] = value
    if where.updated_after is not None:
        clauses.append(sql.SQL("updated_at > {}").format(placeholder("f_after")))
        params["f_after"] = time(where.updated_after)
    if where.updated_before is not None:
        clauses.append(sql.SQL("updated_at < {}").format(placeholder("f_before")))
        params["f_before"] = time(where.updated_before)
    if where.cursor is not None:
        stamp, last_id = where.cursor
        clauses.append(
            sql.SQL("(updated_at < {at} or (updated_at = {at} and id > {id}))").format(
                at=placeholder("f_cursor_at"), id=placeholder("f_cursor_id")
            )
        )
        params["f_cursor_at"] = time(from_microseconds(stamp))
        params["f_cursor_id"] = last_id
    return clauses, params


def _identifier(name: str) -> sql.Composable:
    return sql.SQL(_quoted(name))


def _quoted(name: str) -> str:
    """A registered or bastion column name, quoted; such names are `[a-z][a-z0-9_]*`, so no escaping."""
    return f'"{name}"'
