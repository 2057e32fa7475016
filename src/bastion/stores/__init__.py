"""Stores implementing `bastion.persistence.AgentPersistence`, with an entity API over conversations.

`PostgresStore` is the production store (row-level security in the database); `SqliteStore` keeps the
same contract in one SQLite file for one process (rules in its queries). The shapes in
`bastion.stores.entities` and the errors in `bastion.stores.errors` are shared by every store.
"""

from bastion.stores._migrations import (
    Migration,
    MigrationChangedError,
    apply_application_migrations,
    apply_migrations,
    available_migrations,
)
from bastion.stores._turns import check_storable_message
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
    TurnConflictError,
)
from bastion.stores.postgres import PostgresAgentPersistence, PostgresStore
from bastion.stores.sqlite import SqliteAgentPersistence, SqliteStore

__all__ = [
    "Conversation",
    "ConversationBusyError",
    "Feedback",
    "InvalidInputError",
    "Migration",
    "MigrationChangedError",
    "NotFoundError",
    "PostgresAgentPersistence",
    "PostgresStore",
    "Rating",
    "RunEvent",
    "SqliteAgentPersistence",
    "SqliteStore",
    "StoreError",
    "StoreIdentity",
    "StoredMessage",
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
]
