"""`Store`: what every store provides (`PostgresStore` and `SqliteStore`), declared once.

The entity API (conversations, messages, feedback, events) and the persistence a turn runs through.
What serves a store over HTTP or runs turns on it (`bastion.chat`) asks for a `Store`; a store of an
application's own satisfies this protocol to be served the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from bastion.persistence import AgentPersistence
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
from bastion.stores.filters import ConversationFilter
from bastion.stores.live import LiveTurns
from bastion.stores.schema import ConversationSchema

__all__ = ["LiveTurnStore", "Store"]


class Store(Protocol):
    """Conversations as entities, each call as the verified caller, and the persistence of their turns."""

    @property
    def schema(self) -> ConversationSchema[Any]:
        """The application's conversation state type and registered columns."""

    def persistence(self, *, history_window: int = 100) -> AgentPersistence[TurnContext, TurnState]:
        """The `AgentPersistence` a turn of this store's conversations runs through."""

    async def create_conversation(
        self,
        identity: StoreIdentity,
        *,
        title: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        state: object = None,
        columns: Mapping[str, object] | None = None,
    ) -> Conversation[Any]:
        """A new conversation owned by `identity` (and its tenant); the owner is never an input."""

    async def list_conversations(
        self, identity: StoreIdentity, *, limit: int = 50, filter: ConversationFilter | None = None
    ) -> list[Conversation[Any]]:
        """The caller's conversations, most recently active first, narrowed by `filter`."""

    async def get_conversation(self, identity: StoreIdentity, conversation_id: str) -> Conversation[Any]:
        """One of the caller's conversations; `NotFoundError` for a missing one and anyone else's."""

    async def update_conversation(
        self, identity: StoreIdentity, conversation_id: str, *, title: str | None
    ) -> Conversation[Any]:
        """Rename a conversation: the only column a user may change."""

    async def set_conversation_state(
        self, identity: StoreIdentity, conversation_id: str, state: object
    ) -> Conversation[Any]:
        """Replace the conversation's application state (validated by the schema; None clears it)."""

    async def delete_conversation(self, identity: StoreIdentity, conversation_id: str) -> None:
        """Delete a conversation with its messages, runs, events, tool executions and feedback."""

    async def list_messages(
        self, identity: StoreIdentity, conversation_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[StoredMessage]:
        """A conversation's messages in order, from after position `after_seq`."""

    async def add_feedback(
        self,
        identity: StoreIdentity,
        conversation_id: str,
        message_id: str,
        *,
        rating: Rating,
        comment: str | None = None,
    ) -> Feedback:
        """Rate a message of one of the caller's conversations; rating it again replaces the rating."""

    async def list_events(
        self, identity: StoreIdentity, conversation_id: str, *, after: int = 0, limit: int = 100
    ) -> list[RunEvent]:
        """The conversation's run events with a cursor greater than `after`, in order."""


@runtime_checkable
class LiveTurnStore(Protocol):
    """A store whose turns can be stopped and their streams resumed, from any process (`PostgresStore`)."""

    def live_turns(self) -> LiveTurns:
        """Stream logs, followers and stop requests of the store's running turns."""


if TYPE_CHECKING:
    from bastion.stores.postgres import PostgresStore
    from bastion.stores.sqlite import SqliteStore

    def _both_stores_are_stores(postgres: PostgresStore, sqlite: SqliteStore) -> tuple[Store, Store]:
        """Checked by mypy: each store implements the protocol."""
        return postgres, sqlite
