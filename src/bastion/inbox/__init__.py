"""The inbox as a channel: support conversations answered by an agent acting as the contact, with handoff.

- `PostgresInbox`: contacts, conversations (`bot_mode` bot | human) and messages (contact | bot |
  staff) under row-level security: staff of a tenant see its inbox, a contact only its conversation.
- `ContactPrincipal`: a contact, never a user; `ContactTokens` sign one into a web widget.
- `InboxChannel` / `InboxChannels`: channel adapters and the secret each proves itself with.
- `inbox_routes`: the adapters' webhook, the widget's routes and the staff's.

The inbox needs Postgres (`bastion[postgres]`).
"""

from bastion.inbox.channels import InboxChannel, InboxChannels
from bastion.inbox.entities import (
    Author,
    BotMode,
    InboundMessage,
    InboxConversation,
    InboxMessage,
    ReplyOutcome,
)
from bastion.inbox.errors import ChannelUnauthorizedError, ContactTokenError, ThreadConflictError
from bastion.inbox.principal import CONTACT_ROLE, ContactPrincipal
from bastion.inbox.store import PostgresInbox, ReplyJob, ReplyRouter, apply_inbox_migrations
from bastion.inbox.tokens import ContactTokens

__all__ = [
    "CONTACT_ROLE",
    "Author",
    "BotMode",
    "ChannelUnauthorizedError",
    "ContactPrincipal",
    "ContactTokenError",
    "ContactTokens",
    "InboundMessage",
    "InboxChannel",
    "InboxChannels",
    "InboxConversation",
    "InboxMessage",
    "PostgresInbox",
    "ReplyJob",
    "ReplyOutcome",
    "ReplyRouter",
    "ThreadConflictError",
    "apply_inbox_migrations",
]
