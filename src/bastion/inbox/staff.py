"""Who staffs an inbox: a signed-in user whose token names them staff, never every user of a tenant.

Staff read every contact's conversation of their tenant and answer as the tenant, so the role is
explicit: `inbox_staff` in the token's server-controlled `app_metadata.roles` (Supabase: set it with
the Auth admin API, `app_metadata: {"roles": ["inbox_staff"]}`; users cannot edit `app_metadata`). The
routes check it (`inbox_staff_identity`, the default of `inbox_routes(staff=...)`) and so does the
database (`bastion.inbox_staff_tenant()`, inbox migration 0002), which reads the same claim.
"""

from __future__ import annotations

from typing import Final

from bastion.auth import Principal
from bastion.stores.entities import StoreIdentity

__all__ = ["INBOX_STAFF_ROLE", "inbox_staff_identity", "is_inbox_staff"]

INBOX_STAFF_ROLE: Final = "inbox_staff"
"""The role in `app_metadata.roles` that makes a signed-in user staff of their tenant's inbox."""


def is_inbox_staff(principal: Principal) -> bool:
    """Whether the verified token names this signed-in, non-anonymous user inbox staff."""
    return not principal.is_anonymous and INBOX_STAFF_ROLE in principal.roles


def inbox_staff_identity(principal: Principal) -> StoreIdentity | None:
    """The identity a user staffs the inbox as: their own, in their token's tenant, when the token
    names them staff; None (refused) otherwise."""
    if not is_inbox_staff(principal):
        return None
    return StoreIdentity.from_principal(principal)
