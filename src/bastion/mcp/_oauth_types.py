"""What an application declares and stores for users' OAuth connections: the connection, a pending
sign-in, where pending sign-ins and tokens are kept, and how a user's connection stands."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from mcp.shared.auth import OAuthClientInformationFull
from pydantic import AnyUrl

from bastion.auth import Principal
from bastion.credentials import CredentialRef


@dataclass(frozen=True, kw_only=True)
class McpOAuthConnection:
    """One MCP server users sign in to.

    - `redirect_uri`: the application's page the authorization server sends the user back to; it reads
      `code` and `state` from its URL and posts them to the callback route with the user's session.
    - `scopes`: requested when the server's challenge and metadata name none.
    - `client_id` / `client_secret`: a client registered with the authorization server beforehand; without
      one, the connection registers a client dynamically (RFC 7591), which the server must offer.
    - `interactive`: False keeps a turn's answer `authorization_required` (jobs, the inbox), without
      offering the user to connect.
    """

    name: str
    server_url: str = field(repr=False)
    redirect_uri: str = field(repr=False)
    client_name: str = "bastion"
    scopes: Sequence[str] | None = None
    client_id: str | None = None
    client_secret: str | None = field(default=None, repr=False)
    interactive: bool = True

    def configured_client(self) -> OAuthClientInformationFull | None:
        if self.client_id is None:
            return None
        return OAuthClientInformationFull(
            client_id=self.client_id,
            client_secret=self.client_secret,
            token_endpoint_auth_method="client_secret_post" if self.client_secret else "none",
            redirect_uris=[AnyUrl(self.redirect_uri)],
        )


@dataclass(frozen=True, kw_only=True)
class PendingAuthorization:
    """A started authorization as stored: where it belongs, until when, and its flow (encrypted at rest)."""

    connection: str
    conversation_id: str | None
    tool_call_id: str | None
    expires_at: datetime
    flow: str = field(repr=False)


class AuthorizationStates(Protocol):
    """Where pending authorizations wait for their callback: each only its user's, each taken once."""

    async def save(self, principal: Principal, state: str, pending: PendingAuthorization) -> None: ...

    async def take(self, principal: Principal, state: str) -> PendingAuthorization | None: ...


class LockedValue(Protocol):
    @property
    def value(self) -> str | None: ...

    async def replace(self, value: str) -> None: ...

    async def delete(self) -> None: ...


class LockableCredentials(Protocol):
    """A user's credential store that can hold a credential under a lock (`PostgresCredentialProvider`)."""

    @property
    def name(self) -> str: ...

    async def get(self, ref: CredentialRef, *, owner_id: str | None) -> str | None: ...

    async def put(self, ref: CredentialRef, value: str, *, owner_id: str | None) -> None: ...

    async def delete(self, ref: CredentialRef, *, owner_id: str | None) -> None: ...

    def locked(self, ref: CredentialRef, *, owner_id: str) -> Any: ...


@dataclass(frozen=True, kw_only=True)
class ConnectionStatus:
    """How a user's connection stands: `connected`, `not_connected` or `expired` (connect again)."""

    name: str
    status: Literal["connected", "not_connected", "expired"]
    scopes: tuple[str, ...] = ()
    connected_at: datetime | None = None
