"""Pending OAuth authorizations of MCP connections in Postgres (migration 0011), each its user's own.

A pending authorization is found by the SHA-256 of its `state` and taken exactly once: `take` deletes the
row and returns it in one statement, so a replayed callback finds nothing. Row-level security keeps each
row to the user who started it, in their tenant: another user's state is simply not found. What the
callback needs to finish (`PendingAuthorization.flow`) is encrypted under the credentials key, bound to
the state, owner, tenant and connection, so a row moved anywhere else does not decrypt.
"""

from __future__ import annotations

import hashlib
import json
from typing import Final

from bastion.auth import Principal
from bastion.mcp.oauth import PendingAuthorization
from bastion.stores.credentials import CredentialKeyring, Pool
from bastion.stores.entities import StoreIdentity
from bastion.stores.postgres import caller_transaction

__all__ = ["PostgresAuthorizationStates"]

_FORMAT: Final = "bastion.mcp_oauth_authorizations.v1"
_SET_CALLER: Final = (
    "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)"
)
_INSERT: Final = """
insert into bastion.mcp_oauth_authorizations
  (state_hash, connection, conversation_id, tool_call_id, key_id, nonce, ciphertext, expires_at)
values (%s, %s, %s, %s, %s, %s, %s, %s)
"""
_TAKE: Final = """
delete from bastion.mcp_oauth_authorizations
 where state_hash = %s
returning connection, conversation_id, tool_call_id, key_id, nonce, ciphertext, expires_at, owner_id::text,
          tenant_id
"""
_FORGET_EXPIRED: Final = "delete from bastion.mcp_oauth_authorizations where expires_at <= now()"


class PostgresAuthorizationStates:
    """`bastion.mcp.oauth.AuthorizationStates` over `bastion.mcp_oauth_authorizations`, as the signed-in user.

    `pool` connects as the application's role (no BYPASSRLS, member of `authenticated` and
    `bastion_runtime`), as for `PostgresCredentialProvider`; `keys` is the credentials keyring.
    """

    def __init__(self, pool: Pool, *, keys: CredentialKeyring) -> None:
        self._pool = pool
        self._keys = keys

    async def save(self, principal: Principal, state: str, pending: PendingAuthorization) -> None:
        identity = StoreIdentity.from_principal(principal)
        digest = _digest(state)
        aad = _aad(digest, self._keys.current_key_id, identity, pending.connection)
        key_id, nonce, ciphertext = self._keys.encrypt(pending.flow.encode(), aad)
        async with caller_transaction(self._pool, _SET_CALLER, (identity.database_claims(),)) as conn:
            await conn.execute(_FORGET_EXPIRED)
            await conn.execute(
                _INSERT,
                (
                    digest,
                    pending.connection,
                    pending.conversation_id,
                    pending.tool_call_id,
                    key_id,
                    nonce,
                    ciphertext,
                    pending.expires_at,
                ),
            )

    async def take(self, principal: Principal, state: str) -> PendingAuthorization | None:
        """The caller's pending authorization for `state`, deleted as it is read; None when there is none."""
        identity = StoreIdentity.from_principal(principal)
        digest = _digest(state)
        async with caller_transaction(self._pool, _SET_CALLER, (identity.database_claims(),)) as conn:
            cursor = await conn.execute(_TAKE, (digest,))
            row = await cursor.fetchone()
        if row is None:
            return None
        connection, conversation_id, tool_call_id, key_id, nonce, ciphertext, expires_at, owner, tenant = row
        stored_identity = StoreIdentity(user_id=owner, tenant_id=tenant)
        aad = _aad(digest, key_id, stored_identity, connection)
        flow = self._keys.decrypt(key_id, bytes(nonce), bytes(ciphertext), aad).decode()
        return PendingAuthorization(
            connection=connection,
            conversation_id=conversation_id,
            tool_call_id=tool_call_id,
            expires_at=expires_at,
            flow=flow,
        )


def _digest(state: str) -> bytes:
    return hashlib.sha256(state.encode()).digest()


def _aad(digest: bytes, key_id: str, identity: StoreIdentity, connection: str) -> bytes:
    fields = [_FORMAT, key_id, digest.hex(), identity.user_id, identity.tenant_id, connection]
    return json.dumps(fields, separators=(",", ":")).encode()
