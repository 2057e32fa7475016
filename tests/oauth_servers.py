"""A real OAuth authorization server and a real MCP server it protects, each on 127.0.0.1, for tests.

The authorization server is the `mcp` SDK's own (`mcp.server.auth.routes.create_auth_routes`: metadata,
dynamic registration, authorize, token with PKCE, revocation) over an in-memory provider that approves
every sign-in at once (a test "user"), unless told to refuse. It issues tokens bound to the `resource`
the client asked for, rotates refresh tokens, and counts what it was asked. The MCP server is an SDK
`MCPServer` with `AuthSettings`: it answers 401 with `resource_metadata`, serves its protected-resource
metadata (RFC 9728), and accepts only live access tokens issued for itself.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from mcp.server.auth.handlers import revoke
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl
from starlette.applications import Starlette

from tests.live_server import base_url, live_server, reserve_socket

SCOPE = "docs:read"


class _PublicClientRevocation(revoke.RevocationRequest):
    """RFC 7009 lets a public client revoke with its `client_id` alone; the SDK's handler (mcp 2.3) requires a
    `client_secret` field even when the client has none, so the test server accepts its absence."""

    client_secret: str | None = None


revoke.RevocationRequest = _PublicClientRevocation  # type: ignore[misc]


class _ResourceNamingToken(OAuthToken):
    """A token response that names the resource it was issued for (as some servers do, as `aud`)."""

    aud: str | None = None


@dataclass
class AuthorizationServerLog:
    registrations: int = 0
    codes_exchanged: int = 0
    refreshes: int = 0
    refresh_attempts: int = 0
    revoked: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class InMemoryAuthorizationServer:
    """The SDK's `OAuthAuthorizationServerProvider`, in memory; settings a test changes between steps."""

    def __init__(self) -> None:
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.log = AuthorizationServerLog()
        self.access_ttl = 3600
        self.rotate_refresh = True
        self.refuse_sign_in = False
        self.issue_for_resource: str | None = None
        self.refresh_delay = 0.0
        self.exchange_delay = 0.0

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info
        with self.log.lock:
            self.log.registrations += 1

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        if self.refuse_sign_in:
            return construct_redirect_uri(str(params.redirect_uri), error="access_denied", state=params.state)
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id or "",
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject="test-user",
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        if self.exchange_delay:
            time.sleep(self.exchange_delay)  # the server thread stalls, as a slow server would
        with self.log.lock:
            self.log.codes_exchanged += 1
        return self._issue(
            client.client_id or "", authorization_code.scopes, authorization_code.resource, refresh=None
        )

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        with self.log.lock:
            self.log.refresh_attempts += 1
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        if refresh_token.token not in self.refresh:
            raise TokenError("invalid_grant", "refresh token was revoked")
        if self.refresh_delay:
            time.sleep(self.refresh_delay)  # the server thread stalls, as a slow server would
        with self.log.lock:
            self.log.refreshes += 1
        if self.rotate_refresh:
            self.refresh.pop(refresh_token.token, None)
        kept = None if self.rotate_refresh else refresh_token.token
        return self._issue(client.client_id or "", scopes, refresh_token.resource, refresh=kept)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        with self.log.lock:
            self.log.revoked.append(token.token)
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def expire_access_tokens(self) -> None:
        for token in self.access.values():
            token.expires_at = int(time.time()) - 1

    def revoke_refresh_tokens(self) -> None:
        self.refresh.clear()

    def _issue(
        self, client_id: str, scopes: list[str], resource: str | None, *, refresh: str | None
    ) -> OAuthToken:
        access = secrets.token_urlsafe(24)
        refresh_token = refresh or secrets.token_urlsafe(24)
        bound = self.issue_for_resource or resource
        self.access[access] = AccessToken(
            token=access,
            client_id=client_id,
            scopes=scopes,
            expires_at=int(time.time()) + self.access_ttl,
            resource=bound,
            subject="test-user",
        )
        self.refresh[refresh_token] = RefreshToken(
            token=refresh_token, client_id=client_id, scopes=scopes, resource=resource, subject="test-user"
        )
        return _ResourceNamingToken(
            access_token=access,
            expires_in=self.access_ttl,
            scope=" ".join(scopes),
            refresh_token=refresh_token,
            aud=self.issue_for_resource,
        )


class _TokenVerifier:
    def __init__(self, provider: InMemoryAuthorizationServer) -> None:
        self._provider = provider

    async def verify_token(self, token: str) -> AccessToken | None:
        return await self._provider.load_access_token(token)


@dataclass
class OAuthServers:
    authorization: InMemoryAuthorizationServer
    issuer: str
    mcp_url: str
    mcp: MCPServer


def _documents_server(issuer: str, resource: str, verifier: _TokenVerifier) -> MCPServer:
    server = MCPServer(
        "documents",
        log_level="WARNING",
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(resource),
            validate_token_resource=True,
            required_scopes=[SCOPE],
        ),
        token_verifier=verifier,
    )

    @server.tool(description="Search the documents.")
    def search(query: str) -> str:
        return f"found: {query}"

    return server


@contextmanager
def serve_oauth(*, registration: bool = True, revocation: bool = True) -> Iterator[OAuthServers]:
    """An authorization server and the MCP server it protects, until the block exits."""
    provider = InMemoryAuthorizationServer()
    auth_socket, mcp_socket = reserve_socket(), reserve_socket()
    issuer = base_url(auth_socket)
    mcp_url = f"{base_url(mcp_socket)}/mcp"
    auth_app = Starlette(
        routes=create_auth_routes(
            provider,
            AnyHttpUrl(issuer),
            client_registration_options=ClientRegistrationOptions(enabled=registration, valid_scopes=[SCOPE]),
            revocation_options=RevocationOptions(enabled=revocation),
        )
    )
    server = _documents_server(issuer, mcp_url, _TokenVerifier(provider))
    with (
        live_server(auth_app, sock=auth_socket),
        live_server(server.streamable_http_app(streamable_http_path="/mcp"), sock=mcp_socket),
    ):
        yield OAuthServers(authorization=provider, issuer=issuer, mcp_url=mcp_url, mcp=server)
