"""The assistant's support inbox: its bot (an agent acting as the contact), who staffs it, and its tokens.

The assistant is a single-tenant application: its inbox belongs to `INBOX_TENANT`. Staff are named:
a signed-in user whose token's `app_metadata.roles` holds `inbox_staff` staffs it (or, with a tenant of
their own, that tenant's inbox); any other user is refused. Development sign-in names every development
user staff, so the first session on this machine shows the inbox. With development sign-in anyone on
this machine may open a widget conversation at `/widget`.

`BASTION_INBOX_SECRET` turns on a channel adapter's webhook (`/v1/inbox/channels/webhook/messages`,
with that bearer secret). `BASTION_INBOX_TOKEN_SECRET` signs contact tokens; without it each process
signs with a key of its own, so a token lasts as long as the process that issued it.
"""

from __future__ import annotations

from typing import Any, Final

from bastion import Agent, define_agent
from bastion.assistant.config import AssistantConfig
from bastion.auth import Principal
from bastion.inbox import InboxChannel, InboxChannels, InboxTurn, handoff_to_human, is_inbox_staff
from bastion.stores import StoreIdentity

__all__ = ["INBOX_CHANNEL", "INBOX_TENANT", "inbox_settings", "inbox_staff", "support_agent"]

INBOX_TENANT: Final = "assistant"
INBOX_CHANNEL: Final = "webhook"

SUPPORT_INSTRUCTIONS = """You answer the support conversations of bastion's reference assistant.
Be brief and kind. When the contact asks for a person, or you cannot help, call handoff_to_human with
the reason and tell the contact that a member of staff will follow up."""


def support_agent() -> Agent[InboxTurn]:
    """The bot of the support inbox: it answers as the contact and may hand the conversation to staff."""
    return define_agent(
        name="support",
        instructions=SUPPORT_INSTRUCTIONS,
        tools=lambda turn: [handoff_to_human(turn)],
        max_steps=4,
    )


def inbox_staff(principal: Principal) -> StoreIdentity | None:
    """The identity a user named staff (`INBOX_STAFF_ROLE`) staffs the inbox as: in their own tenant,
    else the assistant's; any other user staffs nothing."""
    if not is_inbox_staff(principal):
        return None
    identity = StoreIdentity.from_principal(principal)
    if identity.tenant_id is None:
        return StoreIdentity(user_id=identity.user_id, tenant_id=INBOX_TENANT, claims=identity.claims)
    return identity


def inbox_settings(config: AssistantConfig) -> dict[str, Any]:
    """The `AssistantApp` settings of the inbox: its adapter's channel and the contact tokens' secret."""
    settings: dict[str, Any] = {}
    if config.inbox_secret is not None:
        channel = InboxChannel(name=INBOX_CHANNEL, tenant_id=INBOX_TENANT, secret=config.inbox_secret)
        settings["inbox_channels"] = InboxChannels([channel])
    if config.inbox_token_secret is not None:
        settings["inbox_token_secret"] = config.inbox_token_secret.encode()
    return settings
