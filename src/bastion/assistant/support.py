"""The assistant's support inbox: its bot (an agent acting as the contact), who staffs it, and its tokens.

The assistant is a single-tenant application: its inbox belongs to `INBOX_TENANT`, and every signed-in,
non-anonymous user without a tenant of their own staffs it (a user with a tenant staffs that tenant's
inbox). With development sign-in anyone on this machine may open a widget conversation at `/widget`.
"""

from __future__ import annotations

from typing import Final

from bastion import Agent, define_agent
from bastion.auth import Principal
from bastion.inbox import InboxTurn, handoff_to_human
from bastion.stores import StoreIdentity

__all__ = ["INBOX_TENANT", "inbox_staff", "support_agent"]

INBOX_TENANT: Final = "assistant"

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
    """The identity a user staffs the inbox as: in their own tenant, else the assistant's; anonymous
    users staff nothing."""
    if principal.is_anonymous:
        return None
    identity = StoreIdentity.from_principal(principal)
    if identity.tenant_id is None:
        return StoreIdentity(user_id=identity.user_id, tenant_id=INBOX_TENANT, claims=identity.claims)
    return identity
