"""The MCP SDK's OAuth client, split where a server needs it split: discovery and registration in one
request, the token exchange in another, refresh under the store's lock.

`OAuthClientProvider` runs the whole flow inside one httpx auth flow and waits for a local browser in
between (its redirect and callback handlers). Here the redirect step raises `AuthorizationRedirect`
instead, carrying the authorization URL and the PKCE verifier, and the flow's discovered state
(`FlowState`: the client, the authorization server's metadata, the protected resource's metadata, the
scope) is kept so that the callback, on any worker, can finish with the SDK's own token request.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from urllib.parse import urlencode

import httpx2
from mcp.client.auth import OAuthClientProvider, PKCEParameters
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from mcp_types import LATEST_PROTOCOL_VERSION
from pydantic import AnyUrl, BaseModel


class FlowState(BaseModel):
    """What a started authorization found out, kept for its callback and for later refreshes."""

    client: OAuthClientInformationFull
    authorization_server: OAuthMetadata | None = None
    protected_resource: ProtectedResourceMetadata | None = None
    scope: str | None = None


class PendingFlow(FlowState):
    """A started authorization: the flow's state and the PKCE verifier the token request proves."""

    code_verifier: str
    redirect_uri: str


class StoredConnection(FlowState):
    """A user's connection as stored (encrypted): the tokens, when they expire and since when it is connected.

    `reconnect` is set when the refresh token was refused (`invalid_grant`): the connection stays listed,
    as expired, and no turn tries it again until the user connects anew.
    """

    token: OAuthToken
    expires_at: float | None = None
    connected_at: float
    reconnect: bool = False

    def fresh(self, *, margin: float) -> bool:
        return not self.reconnect and (self.expires_at is None or time.time() + margin < self.expires_at)


class AuthorizationRedirect(BaseException):
    """Raised where the SDK would send a local browser away: the URL to send the user to, and the verifier.

    A `BaseException`, so that it passes the SDK's `except Exception` (which logs every failure of the flow
    as an error) as the expected outcome it is.
    """

    def __init__(self, url: str, state: str, code_verifier: str) -> None:
        super().__init__("The user must authorize the connection.")
        self.url = url
        self.state = state
        self.code_verifier = code_verifier


class MemoryTokenStorage:
    """The SDK's `TokenStorage` for one flow: what it registers and obtains, kept until bastion stores it."""

    def __init__(self, client: OAuthClientInformationFull | None = None) -> None:
        self.client = client
        self.tokens: OAuthToken | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class ServerSideOAuth(OAuthClientProvider):
    """The SDK's provider, with the browser step replaced by `AuthorizationRedirect`."""

    def __init__(
        self,
        *,
        server_url: str,
        redirect_uri: str,
        client_name: str,
        scopes: Sequence[str] | None,
        client: OAuthClientInformationFull | None,
    ) -> None:
        metadata = OAuthClientMetadata(
            redirect_uris=[AnyUrl(redirect_uri)],
            client_name=client_name,
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
            application_type="web",
            scope=" ".join(scopes) if scopes else None,
        )
        self.storage = MemoryTokenStorage(client)
        self._default_scope = metadata.scope
        super().__init__(server_url=server_url, client_metadata=metadata, storage=self.storage)
        self._initialized = True
        self.context.client_info = client
        # The MCP revision bastion speaks sends the resource indicator (RFC 8707) on every request.
        self.context.protocol_version = LATEST_PROTOCOL_VERSION

    @classmethod
    def resumed(
        cls, *, server_url: str, redirect_uri: str, client_name: str, state: FlowState
    ) -> ServerSideOAuth:
        """A provider that continues a flow started earlier (maybe by another worker)."""
        provider = cls(
            server_url=server_url,
            redirect_uri=redirect_uri,
            client_name=client_name,
            scopes=None,
            client=state.client,
        )
        provider.context.oauth_metadata = state.authorization_server
        provider.context.protected_resource_metadata = state.protected_resource
        provider.context.client_metadata.scope = state.scope
        return provider

    def flow_state(self) -> FlowState:
        client = self.context.client_info
        if client is None:
            raise RuntimeError("The authorization flow registered no client.")
        return FlowState(
            client=client,
            authorization_server=self.context.oauth_metadata,
            protected_resource=self.context.protected_resource_metadata,
            scope=self.context.client_metadata.scope,
        )

    @property
    def resource(self) -> str:
        return self.context.get_resource_url()

    async def _perform_authorization_code_grant(self) -> tuple[str, str]:
        """Build the authorization URL (PKCE S256, state, resource, scope) and stop the flow with it."""
        context = self.context
        if context.client_metadata.scope is None:
            context.client_metadata.scope = self._default_scope
        if context.client_info is None:
            raise RuntimeError("The authorization flow registered no client.")
        if context.oauth_metadata is not None and context.oauth_metadata.authorization_endpoint:
            endpoint = str(context.oauth_metadata.authorization_endpoint)
        else:
            endpoint = context.get_authorization_base_url(context.server_url) + "/authorize"
        pkce = PKCEParameters.generate()
        state = secrets.token_urlsafe(32)
        params = {
            "response_type": "code",
            "client_id": context.client_info.client_id,
            "redirect_uri": str(context.client_metadata.redirect_uris[0])
            if context.client_metadata.redirect_uris
            else "",
            "state": state,
            "code_challenge": pkce.code_challenge,
            "code_challenge_method": "S256",
            "resource": context.get_resource_url(),
        }
        if context.client_metadata.scope:
            params["scope"] = context.client_metadata.scope
        raise AuthorizationRedirect(f"{endpoint}?{urlencode(params)}", state, pkce.code_verifier)

    async def token_request(self, code: str, code_verifier: str) -> httpx2.Request:
        """The SDK's authorization-code token request (with `resource` and the client's authentication)."""
        return await self._exchange_token_authorization_code(code, code_verifier)

    async def finish(self, response: httpx2.Response) -> OAuthToken:
        """Read the token response with the SDK (an error status raises `OAuthTokenError`)."""
        await self._handle_token_response(response)
        if self.storage.tokens is None:
            raise RuntimeError("The token response held no tokens.")
        return self.storage.tokens

    async def refresh_request(self, stored: StoredConnection) -> httpx2.Request:
        """The SDK's refresh request for a stored connection (with `resource` and client authentication)."""
        self.context.current_tokens = stored.token
        return await self._refresh_token()

    async def read_refresh(self, response: httpx2.Response) -> OAuthToken | None:
        """The refreshed tokens (an omitted refresh token or scope carried over), or None when refused."""
        if not await self._handle_refresh_response(response):
            return None
        return self.context.current_tokens
