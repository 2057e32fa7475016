"""bastion's tables for applications that keep their own data with SQLAlchemy (`bastion[sqlalchemy]`).

`bastion_tables(metadata)` puts bastion's Postgres tables, as SQLAlchemy `Table` objects, on the
application's `MetaData`, so its queries can join conversations with its own tables (and its columns,
such as a `project_id` its own migration added, are declared with `conversation_columns`). The tables
stay bastion's: its migrations create and change them, so exclude them from Alembic's autogenerate with
`include_object=exclude_bastion_tables`.

`caller_session(engine, identity)` runs the application's own queries as the verified caller: one
transaction that first sets the role and the caller's claims with `set_config(..., true)` (that is,
`SET LOCAL`), exactly as `PostgresStore` does, so row-level security decides what every statement
in it reads and writes. A session that does not go through it, on an engine connecting as the owner
or any role with BYPASSRLS, bypasses those rules: fine for trusted code (migrations, admin jobs),
never for reads on a user's behalf.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Final

from bastion._extras import missing_extra
from bastion.stores.entities import StoreIdentity

try:
    from sqlalchemy import (
        BigInteger,
        Column,
        DateTime,
        Engine,
        ForeignKeyConstraint,
        MetaData,
        Table,
        Text,
        Uuid,
        text,
    )
    from sqlalchemy.dialects.postgresql import JSONB
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
    from sqlalchemy.orm import Session
except ImportError as error:
    raise missing_extra("bastion.sqlalchemy", "sqlalchemy", error) from error


__all__ = [
    "BastionTables",
    "bastion_tables",
    "caller_session",
    "exclude_bastion_tables",
    "sync_caller_session",
]

SCHEMA: Final = "bastion"
_SET_CALLER: Final = text(
    "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', :claims, true)"
)


@dataclass(frozen=True)
class BastionTables:
    """bastion's tables on the application's `MetaData`."""

    conversations: Table
    messages: Table
    runs: Table
    run_events: Table
    tool_executions: Table
    feedback: Table


def bastion_tables(metadata: MetaData, *, conversation_columns: Iterable[Column[Any]] = ()) -> BastionTables:
    """Declare bastion's tables (schema `bastion`) on `metadata`, with the application's own columns on
    conversations. Ids are UUID text, times timezone-aware, JSON is `jsonb`."""

    def owned(name: str, *columns: Any) -> Table:
        return Table(
            name,
            metadata,
            *columns,
            Column("owner_id", _uuid(), nullable=False),
            Column("tenant_id", Text),
            ForeignKeyConstraint(
                ["conversation_id", "owner_id"],
                [f"{SCHEMA}.conversations.id", f"{SCHEMA}.conversations.owner_id"],
                ondelete="CASCADE",
            ),
            schema=SCHEMA,
        )

    conversations = Table(
        "conversations",
        metadata,
        Column("id", _uuid(), primary_key=True),
        Column("owner_id", _uuid(), nullable=False),
        Column("tenant_id", Text),
        Column("title", Text),
        Column("revision", BigInteger, nullable=False),
        Column("active_run_id", _uuid()),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
        Column("agent_name", Text),
        Column("state", JSONB),
        *conversation_columns,
        schema=SCHEMA,
    )
    messages = owned(
        "messages",
        Column("conversation_id", _uuid(), primary_key=True),
        Column("seq", BigInteger, primary_key=True),
        Column("id", Text, nullable=False),
        Column("role", Text, nullable=False),
        Column("message", JSONB, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
    )
    runs = owned(
        "runs",
        Column("id", _uuid(), primary_key=True),
        Column("conversation_id", _uuid(), nullable=False),
        Column("request_id", Text, nullable=False),
        Column("status", Text, nullable=False),
        Column("lease_expires_at", DateTime(timezone=True), nullable=False),
        Column("started_at", DateTime(timezone=True), nullable=False),
        Column("finished_at", DateTime(timezone=True)),
    )
    run_events = owned(
        "run_events",
        Column("id", BigInteger, primary_key=True),
        Column("conversation_id", _uuid(), nullable=False),
        Column("run_id", _uuid(), nullable=False),
        Column("type", Text, nullable=False),
        Column("data", JSONB, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
    )
    tool_executions = owned(
        "tool_executions",
        Column("conversation_id", _uuid(), primary_key=True),
        Column("tool_call_id", Text, primary_key=True),
        Column("run_id", _uuid(), nullable=False),
        Column("tool_name", Text, nullable=False),
        Column("input", JSONB),
        Column("status", Text, nullable=False),
        Column("output", JSONB),
        Column("started_at", DateTime(timezone=True), nullable=False),
        Column("finished_at", DateTime(timezone=True)),
    )
    feedback = owned(
        "feedback",
        Column("conversation_id", _uuid(), primary_key=True),
        Column("message_id", Text, primary_key=True),
        Column("rating", Text, nullable=False),
        Column("comment", Text),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
    )
    return BastionTables(
        conversations=conversations,
        messages=messages,
        runs=runs,
        run_events=run_events,
        tool_executions=tool_executions,
        feedback=feedback,
    )


def exclude_bastion_tables(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic's `include_object`: leave bastion's schema to bastion's migrations."""
    table = obj if type_ == "table" else getattr(obj, "table", None)
    return getattr(table, "schema", None) != SCHEMA


@asynccontextmanager
async def caller_session(engine: AsyncEngine, identity: StoreIdentity) -> AsyncIterator[AsyncSession]:
    """One transaction as `identity` under row-level security; it commits when the block ends."""
    async with AsyncSession(engine) as session, session.begin():
        await session.execute(_SET_CALLER, {"claims": identity.database_claims()})
        yield session


@contextmanager
def sync_caller_session(engine: Engine, identity: StoreIdentity) -> Iterator[Session]:
    """`caller_session` for a synchronous engine."""
    with Session(engine) as session, session.begin():
        session.execute(_SET_CALLER, {"claims": identity.database_claims()})
        yield session


def _uuid() -> Uuid[str]:
    return Uuid(as_uuid=False)
