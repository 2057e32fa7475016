"""The inbox as a channel: support conversations answered by an agent acting as the contact, with handoff.

- `PostgresInbox`: contacts, conversations (`bot_mode` bot | human) and messages (contact | bot |
  staff) under row-level security: staff of a tenant see its inbox, a contact only its conversation.
- `ContactPrincipal`: a contact, never a user; `ContactTokens` sign one into a web widget.
- `InboxChannel` / `InboxChannels`: channel adapters and the secret each proves itself with.
- `InboxReplies`: the bot's replies as durable jobs (DBOS), the agent running as the contact
  (`InboxTurn`), with `handoff_to_human` and `user_only_policy`.
- `inbox_routes`: the adapters' webhook, the widget's routes and the staff's; staff are the users whose
  token names them (`INBOX_STAFF_ROLE` in `app_metadata.roles`, `inbox_staff_identity`).

The inbox needs Postgres (`bastion[postgres]`).
"""

from bastion.inbox.bot_turn import InboxTurn, answer_as_contact, handoff_to_human, user_only_policy
from bastion.inbox.channels import InboxChannel, InboxChannels
from bastion.inbox.entities import (
    Author,
    BotMode,
    InboundMessage,
    InboxConversation,
    InboxMessage,
    OutboundMessage,
    ReplyOutcome,
)
from bastion.inbox.errors import (
    ChannelUnauthorizedError,
    ContactTokenError,
    NotInboxStaffError,
    ThreadConflictError,
)
from bastion.inbox.principal import CONTACT_ROLE, ContactPrincipal
from bastion.inbox.replies import REPLY_QUEUE, REPLY_WORKFLOW, InboxReplies, JobOutcome, reply_job_id
from bastion.inbox.routes import inbox_routes
from bastion.inbox.staff import INBOX_STAFF_ROLE, inbox_staff_identity, is_inbox_staff
from bastion.inbox.store import PostgresInbox, ReplyJob, ReplyRouter, apply_inbox_migrations
from bastion.inbox.tokens import ContactTokens

__all__ = [
    "CONTACT_ROLE",
    "INBOX_STAFF_ROLE",
    "REPLY_QUEUE",
    "REPLY_WORKFLOW",
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
    "InboxReplies",
    "InboxTurn",
    "JobOutcome",
    "NotInboxStaffError",
    "OutboundMessage",
    "PostgresInbox",
    "ReplyJob",
    "ReplyOutcome",
    "ReplyRouter",
    "ThreadConflictError",
    "answer_as_contact",
    "apply_inbox_migrations",
    "handoff_to_human",
    "inbox_routes",
    "inbox_staff_identity",
    "is_inbox_staff",
    "reply_job_id",
    "user_only_policy",
]
