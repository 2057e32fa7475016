"""Stores implementing `bastion.persistence.AgentPersistence`, with an entity API over conversations.

Storage only: nothing here knows of agents, HTTP turns or durable workflows (`bastion.chat` serves a
store; the `Store` protocol is what it asks of one, declared once for both stores).

`PostgresStore` is the production store (row-level security in the database); `SqliteStore` keeps the
same contract in one SQLite file for one process (rules in its queries). The shapes in
`bastion.stores.entities` and the errors in `bastion.stores.errors` are shared by every store, and so is
what an application adds to conversations (`ConversationSchema`: typed state, `AppColumn`s to filter on).

SQLite needs nothing beyond Python. The Postgres names (`PostgresStore`, `PostgresAgentPersistence`,
`grant_application_role`, `ApplicationRoleError`) load on first use and need `bastion[postgres]`;
without it they raise `MissingExtraError`, an `ImportError` naming the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bastion._moved import moved_names
from bastion.stores._migrations import (
    Migration,
    MigrationChangedError,
    apply_application_migrations,
    apply_migrations,
    available_migrations,
)
from bastion.stores._turn_persistence import check_storable_message
from bastion.stores.entities import (
    Conversation,
    Feedback,
    Rating,
    RunEvent,
    StoredMessage,
    StoreIdentity,
    TurnContext,
    TurnState,
)
from bastion.stores.errors import (
    ConversationBusyError,
    InvalidInputError,
    NotFoundError,
    StoreError,
    ToolOperationConflictError,
    ToolOperationError,
    ToolOperationMismatchError,
    ToolOperationUncertainError,
    TooManyFollowersError,
    TurnConflictError,
)
from bastion.stores.filters import (
    AppColumn,
    ColumnKind,
    ConversationFilter,
    InvalidFilterError,
    conversation_cursor,
)
from bastion.stores.followers import FollowerLimits
from bastion.stores.protocol import LiveTurnStore, Store
from bastion.stores.schema import ConversationSchema, InvalidStateError
from bastion.stores.sqlite import SqliteAgentPersistence, SqliteStore

if TYPE_CHECKING:
    from bastion.stores.postgres import PostgresAgentPersistence, PostgresStore
    from bastion.stores.roles import ApplicationRoleError, grant_application_role

_POSTGRES_NAMES = {
    "ApplicationRoleError": "bastion.stores.roles",
    "PostgresAgentPersistence": "bastion.stores.postgres",
    "PostgresStore": "bastion.stores.postgres",
    "grant_application_role": "bastion.stores.roles",
}


def _postgres_name(name: str) -> Any:
    """Import a Postgres name when it is first used, so SQLite alone needs no Postgres driver."""
    module = _POSTGRES_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'bastion.stores' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


# `run_agent` and its types moved to `bastion.chat`: a turn is not storage.
__getattr__ = moved_names(
    __name__,
    dict.fromkeys(
        ("AgentRunContext", "AgentRunResult", "ConversationNotFoundError", "RunStore", "run_agent"),
        "bastion.chat",
    ),
    others=_postgres_name,
)


__all__ = [
    "AgentRunContext",
    "AgentRunResult",
    "AppColumn",
    "ApplicationRoleError",
    "ColumnKind",
    "Conversation",
    "ConversationBusyError",
    "ConversationFilter",
    "ConversationNotFoundError",
    "ConversationSchema",
    "Feedback",
    "FollowerLimits",
    "InvalidFilterError",
    "InvalidInputError",
    "InvalidStateError",
    "LiveTurnStore",
    "Migration",
    "MigrationChangedError",
    "NotFoundError",
    "PostgresAgentPersistence",
    "PostgresStore",
    "Rating",
    "RunEvent",
    "RunStore",
    "SqliteAgentPersistence",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoreIdentity",
    "StoredMessage",
    "TooManyFollowersError",
    "ToolOperationConflictError",
    "ToolOperationError",
    "ToolOperationMismatchError",
    "ToolOperationUncertainError",
    "TurnConflictError",
    "TurnContext",
    "TurnState",
    "apply_application_migrations",
    "apply_migrations",
    "available_migrations",
    "check_storable_message",
    "conversation_cursor",
    "grant_application_role",
    "run_agent",
]
