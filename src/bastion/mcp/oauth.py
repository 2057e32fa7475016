"""MCP connections that sign each user in with OAuth (the MCP authorization specification), server-side.

`McpOAuth` holds an application's OAuth connections (`McpOAuthConnection`) and does, per signed-in user:

- `start`: ask the MCP server (its 401 names its protected-resource metadata, RFC 9728), read its
  authorization server's metadata (RFC 8414), register a client (RFC 7591) unless the connection has a
  configured one, and return the URL to send the user to (PKCE S256, `resource` per RFC 8707, scopes from
  the server's challenge or the connection). The pending authorization is stored server-side
  (`AuthorizationStates`), bound to the user, the conversation and the pending call, single use, and
  expiring after `state_ttl`.
- `complete`: the callback. Only the user who started it can finish it, once, before it expires; the
  authorization server's refusal, a mismatched PKCE verifier (the server refuses the code), an issuer that
  is not the one discovered (RFC 9207) or a token response naming another resource is refused with a
  stable code and stores nothing. The tokens are stored encrypted in the user's credential store.
- `auth(connection)`: the headers resolver for an `McpConnectionDefinition`: the stored access token,
  refreshed first when it expires within `refresh_margin` seconds. The refresh runs under the stored
  credential's row lock, so two turns refreshing at once refresh once and a rotated refresh token
  replaces the old one in the same transaction; a refused refresh (`invalid_grant`) marks the connection
  expired and asks the user to connect again, without trying again.
- `connections`: each connection's status for the user (`connected`, `not_connected`, `expired`), its
  scopes and since when; `disconnect`: deletes the tokens and revokes them at the server (RFC 7009)
  when it offers revocation.

Tokens never appear in an error, a log line, a repr or anything returned, except the `Authorization`
header `auth` builds for the MCP transport.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import httpx2
from mcp.client.auth import OAuthFlowError
from mcp.client.auth.utils import validate_authorization_response_iss
from pydantic import ValidationError

from bastion.auth import Principal
from bastion.credentials import (
    ConnectionAuthorizationRequiredError,
    CredentialError,
    CredentialRef,
)
from bastion.mcp._oauth_errors import (
    AuthorizationCodeRefusedError,
    AuthorizationDeniedError,
    AuthorizationIssuerMismatchError,
    AuthorizationNotNeededError,
    AuthorizationResourceMismatchError,
    AuthorizationStateExpiredError,
    AuthorizationStateInvalidError,
    AuthorizationUnavailableError,
    McpOAuthError,
    OAuthConnectionNotFoundError,
)
from bastion.mcp._oauth_flow import (
    AuthorizationRedirect,
    FlowState,
    PendingFlow,
    ServerSideOAuth,
    StoredConnection,
)
from bastion.mcp._oauth_types import (
    AuthorizationStates,
    ConnectionStatus,
    LockableCredentials,
    McpOAuthConnection,
    PendingAuthorization,
)

__all__ = [
    "AuthorizationCodeRefusedError",
    "AuthorizationDeniedError",
    "AuthorizationIssuerMismatchError",
    "AuthorizationNotNeededError",
    "AuthorizationResourceMismatchError",
    "AuthorizationStateExpiredError",
    "AuthorizationStateInvalidError",
    "AuthorizationStates",
    "AuthorizationUnavailableError",
    "ConnectionStatus",
    "LockableCredentials",
    "McpOAuth",
    "McpOAuthConnection",
    "McpOAuthError",
    "OAuthConnectionNotFoundError",
    "PendingAuthorization",
]

logger = logging.getLogger("bastion.mcp.oauth")

_PROBE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bastion", "version": "1"},
    },
}


class McpOAuth:
    """OAuth for an application's MCP connections, per user; see the module docstring."""

    def __init__(
        self,
        connections: Sequence[McpOAuthConnection],
        *,
        credentials: Callable[[Principal], LockableCredentials],
        states: AuthorizationStates,
        state_ttl: timedelta = timedelta(minutes=10),
        refresh_margin: float = 60.0,
        timeout: float = 15.0,
    ) -> None:
        self._connections: Mapping[str, McpOAuthConnection] = {c.name: c for c in connections}
        if len(self._connections) != len(connections):
            raise ValueError("Two OAuth connections share a name.")
        self._credentials = credentials
        self._states = states
        self._state_ttl = state_ttl
        self._margin = refresh_margin
        self._timeout = timeout

    def connection(self, name: str) -> McpOAuthConnection:
        found = self._connections.get(name)
        if found is None:
            raise OAuthConnectionNotFoundError("No such connection.")
        return found

    async def start(
        self,
        principal: Principal,
        name: str,
        *,
        conversation_id: str | None = None,
        tool_call_id: str | None = None,
    ) -> str:
        """The URL to send the user to; the pending authorization is stored for the callback."""
        connection = self.connection(name)
        provider = ServerSideOAuth(
            server_url=connection.server_url,
            redirect_uri=connection.redirect_uri,
            client_name=connection.client_name,
            scopes=connection.scopes,
            client=connection.configured_client(),
        )
        try:
            async with httpx2.AsyncClient(auth=provider, timeout=self._timeout) as client:
                await client.post(connection.server_url, json=_PROBE, headers=_PROBE_HEADERS)
        except AuthorizationRedirect as redirect:
            flow = PendingFlow(
                **provider.flow_state().model_dump(),
                code_verifier=redirect.code_verifier,
                redirect_uri=connection.redirect_uri,
            )
            pending = PendingAuthorization(
                connection=name,
                conversation_id=conversation_id,
                tool_call_id=tool_call_id,
                expires_at=datetime.now(UTC) + self._state_ttl,
                flow=flow.model_dump_json(),
            )
            await self._states.save(principal, redirect.state, pending)
            return redirect.url
        except (OAuthFlowError, ValidationError):
            logger.warning("Discovering how to authorize the %s connection failed.", name, exc_info=True)
            raise AuthorizationUnavailableError(f"The {name} connection cannot be authorized.") from None
        except httpx2.HTTPError:
            logger.warning("The %s connection's server could not be reached.", name, exc_info=True)
            raise AuthorizationUnavailableError(f"The {name} connection cannot be reached.") from None
        raise AuthorizationNotNeededError(f"The {name} connection does not ask to authorize.")

    async def complete(
        self,
        principal: Principal,
        name: str,
        *,
        state: str,
        code: str | None = None,
        error: str | None = None,
        iss: str | None = None,
    ) -> PendingAuthorization:
        """Finish the caller's pending authorization: refused with a stable code, or the tokens stored."""
        connection = self.connection(name)
        pending = await self._states.take(principal, state)
        if pending is None or pending.connection != name:
            raise AuthorizationStateInvalidError("This authorization is unknown or was used.")
        if pending.expires_at <= datetime.now(UTC):
            raise AuthorizationStateExpiredError("This authorization expired. Connect again.")
        if error is not None or not code:
            raise AuthorizationDeniedError(f"The {name} connection was not authorized.")
        flow = PendingFlow.model_validate_json(pending.flow)
        try:
            validate_authorization_response_iss(iss, flow.authorization_server)
        except OAuthFlowError:
            raise AuthorizationIssuerMismatchError("The answer came from another server.") from None
        provider = ServerSideOAuth.resumed(
            server_url=connection.server_url,
            redirect_uri=flow.redirect_uri,
            client_name=connection.client_name,
            state=flow,
        )
        try:
            async with httpx2.AsyncClient(timeout=self._timeout) as client:
                response = await client.send(await provider.token_request(code, flow.code_verifier))
                await response.aread()
        except httpx2.HTTPError:
            logger.warning("The %s connection's token endpoint could not be reached.", name)
            raise AuthorizationUnavailableError(f"The {name} connection cannot be reached.") from None
        if response.status_code != 200:
            raise AuthorizationCodeRefusedError(f"The {name} connection refused the sign-in.")
        if not _for_resource(response, provider.resource):
            raise AuthorizationResourceMismatchError("The tokens are for another server.")
        try:
            token = await provider.finish(response)
        except (OAuthFlowError, ValidationError):
            raise AuthorizationCodeRefusedError(f"The {name} connection refused the sign-in.") from None
        stored = StoredConnection(
            **FlowState.model_validate(flow.model_dump()).model_dump(),
            token=token,
            expires_at=_expiry(token.expires_in),
            connected_at=time.time(),
        )
        store = self._credentials(principal)
        await store.put(_ref(store, name), stored.model_dump_json(), owner_id=principal.id)
        return pending

    def auth(self, name: str) -> Callable[[Principal], Awaitable[dict[str, str]]]:
        """The headers resolver for the connection's `McpConnectionDefinition.auth`: the signed-in user's
        access token, or `ConnectionAuthorizationRequiredError` (`can_authorize` for an interactive
        connection in a signed-in user's turn; never for a context that is not a `Principal`)."""
        connection = self.connection(name)

        async def headers(principal: Principal) -> dict[str, str]:
            if not isinstance(principal, Principal):  # a job or a contact: nobody to sign in
                raise ConnectionAuthorizationRequiredError(name)
            try:
                return {"Authorization": f"Bearer {await self._access_token(principal, name)}"}
            except ConnectionAuthorizationRequiredError:
                raise ConnectionAuthorizationRequiredError(
                    name, can_authorize=connection.interactive
                ) from None

        return headers

    async def connections(self, principal: Principal) -> list[ConnectionStatus]:
        return [await self._status(principal, name) for name in self._connections]

    async def status(self, principal: Principal, name: str) -> ConnectionStatus:
        """How the user's connection `name` stands."""
        self.connection(name)
        return await self._status(principal, name)

    async def disconnect(self, principal: Principal, name: str) -> None:
        """Delete the user's tokens, and revoke them at the server when it offers revocation."""
        connection = self.connection(name)
        store = self._credentials(principal)
        stored = await self._read(principal, name)
        await store.delete(_ref(store, name), owner_id=principal.id)
        if stored is not None:
            await self._revoke(connection, stored)

    async def _access_token(self, principal: Principal, name: str) -> str:
        stored = await self._read(principal, name)
        if stored is None or stored.reconnect:
            raise ConnectionAuthorizationRequiredError(name)
        if stored.fresh(margin=self._margin):
            return stored.token.access_token
        token, refused = await self._refresh(principal, name)
        if refused or token is None:
            raise ConnectionAuthorizationRequiredError(name)
        return token

    async def _refresh(self, principal: Principal, name: str) -> tuple[str | None, bool]:
        """Refresh under the stored credential's lock: (the access token, whether the user must reconnect).

        The second of two turns waits for the first, finds the token fresh and uses it. A refusal is
        recorded inside the block and raised after it, so the record commits.
        """
        connection = self.connection(name)
        store = self._credentials(principal)
        async with store.locked(_ref(store, name), owner_id=principal.id) as held:
            stored = _parse(held.value)
            if stored is None or stored.reconnect:
                return None, True
            if stored.fresh(margin=self._margin):
                return stored.token.access_token, False
            if stored.token.refresh_token is None:
                await held.replace(stored.model_copy(update={"reconnect": True}).model_dump_json())
                return None, True
            provider = ServerSideOAuth.resumed(
                server_url=connection.server_url,
                redirect_uri=connection.redirect_uri,
                client_name=connection.client_name,
                state=stored,
            )
            async with httpx2.AsyncClient(timeout=self._timeout) as client:
                response = await client.send(await provider.refresh_request(stored))
                await response.aread()
            if response.status_code >= 500:
                raise OSError(
                    f"The {name} connection's authorization server failed ({response.status_code})."
                )
            refreshed = await provider.read_refresh(response)
            if refreshed is None:
                await held.replace(stored.model_copy(update={"reconnect": True}).model_dump_json())
                return None, True
            renewed = stored.model_copy(
                update={"token": refreshed, "expires_at": _expiry(refreshed.expires_in)}
            )
            await held.replace(renewed.model_dump_json())
            return refreshed.access_token, False

    async def _status(self, principal: Principal, name: str) -> ConnectionStatus:
        stored = await self._read(principal, name)
        if stored is None:
            return ConnectionStatus(name=name, status="not_connected")
        expired = stored.reconnect or (stored.token.refresh_token is None and not stored.fresh(margin=0))
        return ConnectionStatus(
            name=name,
            status="expired" if expired else "connected",
            scopes=tuple((stored.token.scope or "").split()),
            connected_at=datetime.fromtimestamp(stored.connected_at, UTC),
        )

    async def _read(self, principal: Principal, name: str) -> StoredConnection | None:
        try:
            store = self._credentials(principal)
            value = await store.get(_ref(store, name), owner_id=principal.id)
        except CredentialError:
            logger.warning("The %s connection's stored tokens cannot be read.", name)
            return None
        return _parse(value)

    async def _revoke(self, connection: McpOAuthConnection, stored: StoredConnection) -> None:
        server = stored.authorization_server
        if server is None or server.revocation_endpoint is None:
            return
        client = stored.client
        for token, hint in (
            (stored.token.refresh_token, "refresh_token"),
            (stored.token.access_token, "access_token"),
        ):
            if token is None:
                continue
            data = {"token": token, "token_type_hint": hint, "client_id": client.client_id}
            if client.client_secret:
                data["client_secret"] = client.client_secret
            try:
                async with httpx2.AsyncClient(timeout=self._timeout) as http:
                    await http.post(str(server.revocation_endpoint), data=data)
            except httpx2.HTTPError:
                logger.warning("Revoking the %s connection's tokens failed.", connection.name)


_PROBE_HEADERS = {"Accept": "application/json, text/event-stream"}


def _ref(store: LockableCredentials, name: str) -> CredentialRef:
    """Where a user's tokens for the connection are stored in their credential store."""
    return CredentialRef(provider=store.name, secret=f"mcp-oauth:{name}", scope="user")


def _parse(value: str | None) -> StoredConnection | None:
    if value is None:
        return None
    try:
        return StoredConnection.model_validate_json(value)
    except ValidationError:
        logger.warning("A stored OAuth connection cannot be read.")
        return None


def _expiry(expires_in: int | None) -> float | None:
    return time.time() + expires_in if expires_in is not None else None


def _for_resource(response: httpx2.Response, resource: str) -> bool:
    """False when the token response names a resource (`resource`, or `aud`) other than the one requested."""
    try:
        body = response.json()
    except ValueError:
        return True
    if not isinstance(body, dict):
        return True
    for key in ("resource", "aud"):
        named = body.get(key)
        if named is None:
            continue
        names = named if isinstance(named, list) else [named]
        if not any(_same_resource(str(item), resource) for item in names):
            return False
    return True


def _same_resource(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")
