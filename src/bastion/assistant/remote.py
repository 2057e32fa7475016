"""The assistant's optional MCP connection: one server, an allowlist of its tools, and either the app's
credential (`BASTION_MCP_AUTH=app`), each user's own pasted token (`user`), or each user's own sign-in at
the server (`oauth`: `bastion.mcp.oauth`; a turn that needs it pauses on a Connect card, see
`bastion.mcp.sign_in`, and the page at `/connections/mcp/callback` finishes the sign-in).

Remote tools are exposed as `mcp__<tool>` and each needs the user's approval, since the assistant cannot
know what a remote tool changes. The connection is opened per turn and closed with it. A user's own
credential is encrypted by this process (`BASTION_CREDENTIALS_KEY`) and stored in Postgres, read and
written as that user under row-level security, so a turn can only ever send its own user's credential.
"""

from __future__ import annotations

import base64
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import ClassVar, Final

from bastion import AgentTools
from bastion.api import InvalidRequestError
from bastion.assistant.config import AssistantConfig, ConfigError
from bastion.auth import Principal
from bastion.credentials import (
    CredentialError,
    CredentialInvalidError,
    CredentialRef,
    CredentialStorageError,
    credential_auth,
)
from bastion.errors import BastionError
from bastion.mcp import McpConnectionDefinition, McpConnectionError, McpTransport, create_mcp_connections
from bastion.mcp.oauth import McpOAuth, McpOAuthConnection
from bastion.mcp.sign_in import CONNECT_TOOL_PREFIX, create_mcp_connections_with_sign_in
from bastion.stores.credentials import (
    CREDENTIALS_KEY_VARIABLE,
    CredentialKeyring,
    Pool,
    PostgresCredentialProvider,
)
from bastion.stores.oauth_states import PostgresAuthorizationStates

__all__ = [
    "CREDENTIALS_KEY_FILE",
    "ConnectionFailedError",
    "ConnectionNeedsAuthorizationError",
    "CredentialsUnavailableError",
    "UserCredentials",
    "credentials_keyring",
    "remote_tool_names",
    "remote_tools",
    "sign_in_tool_names",
    "user_oauth",
]

logger = logging.getLogger(__name__)

CONNECTION_NAME = "mcp"
CREDENTIALS_KEY_FILE: Final = "credentials-key"
USER_CREDENTIAL: Final = CredentialRef(provider="postgres", secret=CONNECTION_NAME, scope="user")
# A bearer token is sent in a header: visible ASCII without spaces, and not unboundedly long.
_TOKEN: Final = re.compile(r"[\x21-\x7e]{1,4096}")


class ConnectionNeedsAuthorizationError(BastionError):
    """The MCP server refused the credential, or the user has not connected it: the operator renews the
    app's credential, a user connects their own (`PUT /api/connections/mcp`)."""

    code: ClassVar[str] = "authorization_required"
    status: ClassVar[int] = 403


class CredentialsUnavailableError(BastionError):
    """The credential store failed; the cause is logged, never shown."""

    code: ClassVar[str] = "credentials_unavailable"
    status: ClassVar[int] = 503


class ConnectionFailedError(BastionError):
    """The MCP server could not be reached or answered wrongly."""

    code: ClassVar[str] = "connection_failed"
    status: ClassVar[int] = 502


def remote_tool_names(config: AssistantConfig) -> tuple[str, ...]:
    return tuple(f"{CONNECTION_NAME}__{name}" for name in config.mcp_tools) if config.mcp_url else ()


def sign_in_tool_names(config: AssistantConfig) -> tuple[str, ...]:
    """The tool that asks a user to sign in to the server from the conversation (`oauth` only)."""
    return (f"{CONNECT_TOOL_PREFIX}{CONNECTION_NAME}",) if config.mcp_auth == "oauth" else ()


def user_oauth(config: AssistantConfig, *, pool: Pool, keys: CredentialKeyring) -> McpOAuth:
    """Each user's sign-in at the MCP server, their tokens and pending sign-ins kept as they are (RLS)."""
    if config.mcp_url is None:
        raise ValueError("BASTION_MCP_AUTH=oauth needs BASTION_MCP_URL.")
    connection = McpOAuthConnection(
        name=CONNECTION_NAME,
        server_url=config.mcp_url,
        redirect_uri=f"{config.base_url}/connections/{CONNECTION_NAME}/callback",
        client_name="bastion assistant",
    )
    return McpOAuth(
        [connection],
        credentials=lambda who: PostgresCredentialProvider(pool, keys=keys, tenant_id=who.tenant_id),
        states=PostgresAuthorizationStates(pool, keys=keys),
    )


@dataclass(frozen=True)
class UserCredentials:
    """Each user's own credential for the MCP server, kept in Postgres and handled as that user."""

    pool: Pool
    keys: CredentialKeyring

    def provider(self, principal: Principal) -> PostgresCredentialProvider:
        """The store as seen from the principal's tenant; a user's credential is found only there."""
        return PostgresCredentialProvider(self.pool, keys=self.keys, tenant_id=principal.tenant_id)

    async def connect(self, principal: Principal, token: object) -> None:
        """Store the principal's token for the MCP server, replacing the one stored before."""
        value = _checked_token(token)
        with _storage_errors():
            await self.provider(principal).put(USER_CREDENTIAL, value, owner_id=principal.id)

    async def disconnect(self, principal: Principal) -> None:
        with _storage_errors():
            await self.provider(principal).delete(USER_CREDENTIAL, owner_id=principal.id)

    async def connected(self, principal: Principal) -> bool:
        """Whether a usable credential is stored. One sealed with a key that is no longer configured
        counts as not connected, as it does in a turn, so the page asks for it again and it is replaced."""
        with _storage_errors():
            try:
                stored = await self.provider(principal).get(USER_CREDENTIAL, owner_id=principal.id)
            except CredentialInvalidError:
                logger.warning("A stored MCP credential cannot be decrypted with the configured keys.")
                return False
        return stored is not None


def credentials_keyring(config: AssistantConfig) -> tuple[CredentialKeyring, bool]:
    """The key users' credentials are encrypted with, and whether it was just generated.

    `BASTION_CREDENTIALS_KEY` when set. Development sign-in otherwise generates one into the data
    directory (readable only by this user) and keeps using it; Supabase sign-in needs the variable,
    since a key that only one machine holds would lose every credential with that machine.
    """
    if config.credentials_key is not None:
        return _keyring(config.credentials_key, CREDENTIALS_KEY_VARIABLE), False
    if config.supabase_url is not None:
        raise ConfigError(
            f"BASTION_MCP_AUTH=user needs {CREDENTIALS_KEY_VARIABLE}, the base64-encoded 32-byte key users' "
            "credentials are encrypted with. Generate one with: "
            "python -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())'"
        )
    path = config.data_dir / CREDENTIALS_KEY_FILE
    if path.exists():
        return _keyring(path.read_text(), f"The development credentials key in {path}"), False
    path.parent.mkdir(parents=True, exist_ok=True)
    encoded = base64.b64encode(os.urandom(32)).decode()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(encoded + "\n")
    return _keyring(encoded, str(path)), True


def _keyring(text: str, source: str) -> CredentialKeyring:
    try:
        return CredentialKeyring.from_environment(environ={CREDENTIALS_KEY_VARIABLE: text})
    except ValueError as error:
        reason = str(error).replace(CREDENTIALS_KEY_VARIABLE, source, 1)
        raise ConfigError(f"{reason} Use 'id:base64,...' or one base64-encoded 32-byte key.") from None


def remote_tools(
    config: AssistantConfig, *, user_credentials: UserCredentials | None = None, oauth: McpOAuth | None = None
) -> Callable[[Principal, str], Callable[[], Awaitable[AgentTools]]] | None:
    """A per-turn opener of the configured MCP server (for a user and a conversation), or None when none
    is configured.

    With `BASTION_MCP_AUTH=user` each turn sends the signed-in user's stored credential, read afresh
    when the connection opens; a user without one is asked to connect before anything reaches the server.
    With `oauth` a user who has not signed in gets the `connect_mcp` tool, whose call pauses the turn on a
    Connect card until they have.
    """
    if config.mcp_url is None:
        return None
    if config.mcp_auth == "user" and user_credentials is None:
        raise ValueError("BASTION_MCP_AUTH=user needs the users' credential store.")
    if config.mcp_auth == "oauth" and oauth is None:
        raise ValueError("BASTION_MCP_AUTH=oauth needs the users' OAuth connections.")
    headers = {"Authorization": f"Bearer {config.mcp_token}"} if config.mcp_token else {}
    shared: McpConnectionDefinition[Principal] = McpConnectionDefinition(
        name=CONNECTION_NAME,
        transport=McpTransport(
            type="sse" if config.mcp_transport == "sse" else "http", url=config.mcp_url, headers=headers
        ),
        allowlist=list(config.mcp_tools),
    )

    def definition_for(principal: Principal) -> McpConnectionDefinition[Principal]:
        if oauth is not None:
            return replace(shared, auth=oauth.auth(CONNECTION_NAME))
        if config.mcp_auth != "user" or user_credentials is None:
            return shared
        auth = credential_auth(
            provider=user_credentials.provider(principal),
            ref=USER_CREDENTIAL,
            owner="user",
            connection=CONNECTION_NAME,
        )
        return replace(shared, auth=auth)

    def for_user(principal: Principal, conversation_id: str) -> Callable[[], Awaitable[AgentTools]]:
        definition = definition_for(principal)

        async def open_tools() -> AgentTools:
            try:
                if oauth is not None:
                    connections = await create_mcp_connections_with_sign_in(
                        [definition], context=principal, oauth=oauth, conversation_id=conversation_id
                    )
                else:
                    connections = await create_mcp_connections([definition], context=principal)
            except McpConnectionError as error:
                raise _client_error(error) from None
            return AgentTools(
                tools=connections.tools, close=connections.close, instructions=connections.instructions
            )

        return open_tools

    return for_user


def _client_error(error: McpConnectionError) -> BastionError:
    if error.code == "authorization_required":
        return ConnectionNeedsAuthorizationError(str(error))
    return ConnectionFailedError(str(error))


def _checked_token(token: object) -> str:
    value = token.strip() if isinstance(token, str) else ""
    if not _TOKEN.fullmatch(value):
        raise InvalidRequestError(
            "token must be the MCP server's bearer token: 1 to 4096 visible characters without spaces."
        )
    return value


@contextmanager
def _storage_errors() -> Iterator[None]:
    """A store failure becomes `CredentialsUnavailableError`, its cause kept for the log only."""
    try:
        yield
    except CredentialError as error:
        raise CredentialsUnavailableError(CredentialStorageError.message) from error
