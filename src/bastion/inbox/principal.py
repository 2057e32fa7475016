"""Who a contact is to bastion: `ContactPrincipal`, never a user.

A contact writes to a tenant's support inbox from a channel (a messaging app, the web widget). Its
identity comes only from what the server verified: a channel's secret or a contact token the
application signed. It carries the tenant, the contact and the one conversation it may reach, and no
user id: whatever looks for a signed-in user (per-user credentials, per-user memory, user-only tools)
finds none, so it stays closed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar, Final, Literal

from bastion.stores.entities import check_text, parse_uuid

__all__ = ["CONTACT_ROLE", "ContactPrincipal"]

CONTACT_ROLE: Final = "bastion_contact"
"""The database role the server switches to while it acts for a contact."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContactPrincipal:
    """A verified contact: `tenant_id`, `contact_id` and the `conversation_id` it is scoped to."""

    principal_type: ClassVar[Literal["contact"]] = "contact"

    tenant_id: str
    contact_id: str
    conversation_id: str

    def __post_init__(self) -> None:
        check_text(self.tenant_id)
        object.__setattr__(self, "contact_id", parse_uuid(self.contact_id))
        object.__setattr__(self, "conversation_id", parse_uuid(self.conversation_id))

    def database_claims(self) -> str:
        """The JSON set as `request.jwt.claims` for the contact's role: no `sub`, so no user."""
        return json.dumps(
            {
                "role": CONTACT_ROLE,
                "principal_type": self.principal_type,
                "inbox_contact": {
                    "tenant_id": self.tenant_id,
                    "contact_id": self.contact_id,
                    "conversation_id": self.conversation_id,
                },
            },
            separators=(",", ":"),
        )
