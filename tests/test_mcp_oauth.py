"""OAuth for a user's MCP connection, against a real authorization server and a real protected MCP server.

Both servers are the `mcp` SDK's own server-side auth on 127.0.0.1 (`tests/oauth_servers.py`); the tokens
are stored in Postgres through the encrypted credential store, the pending authorizations in
`bastion.mcp_oauth_authorizations`, each under row-level security as the signed-in user.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import psycopg
import pytest
from mcp.shared.auth import OAuthClientInformationFull
from psycopg_pool import AsyncConnectionPool
from pydantic import AnyUrl

from bastion.auth import Principal
from bastion.credentials import ConnectionAuthorizationRequiredError, CredentialRef
from bastion.inbox.principal import ContactPrincipal
from bastion.mcp import McpConnectionDefinition, McpConnectionError, McpTransport, create_mcp_connections
from bastion.mcp.oauth import (
    AuthorizationCodeRefusedError,
    AuthorizationDeniedError,
    AuthorizationIssuerMismatchError,
    AuthorizationResourceMismatchError,
    AuthorizationStateExpiredError,
    AuthorizationStateInvalidError,
    AuthorizationUnavailableError,
    McpOAuth,
    McpOAuthConnection,
)
from bastion.stores import StoreIdentity
from bastion.stores.credentials import CredentialKeyring, PostgresCredentialProvider
from bastion.tools import ToolCall
from tests.conftest import MigratedDatabase
from tests.oauth_db import NAME, REDIRECT, build_oauth, keyring, principal, sign_in
from tests.oauth_servers import SCOPE, OAuthServers, serve_oauth

FOUND = {"result": "found: q"}


@pytest.fixture(scope="module")
def servers() -> Iterator[OAuthServers]:
    with serve_oauth() as running:
        yield running


@pytest.fixture(autouse=True)
def reset_servers(servers: OAuthServers) -> None:
    server = servers.authorization
    server.access_ttl = 3600
    server.rotate_refresh = True
    server.refuse_sign_in = False
    server.issue_for_resource = None
    server.refresh_delay = 0.0
    server.exchange_delay = 0.0


@pytest.fixture
def oauth(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> McpOAuth:
    return build_oauth(oauth_pool, oauth_keys, servers)


async def connect(oauth: McpOAuth, who: Principal) -> None:
    answer = await sign_in(await oauth.start(who, NAME, conversation_id="c1", tool_call_id="call-1"))
    pending = await oauth.complete(who, NAME, state=answer["state"], code=answer["code"])
    # The callback says which conversation and call waited for it, so the paused turn can resume.
    assert (pending.connection, pending.conversation_id, pending.tool_call_id) == (NAME, "c1", "call-1")


async def search(oauth: McpOAuth, who: Principal, servers: OAuthServers) -> Any:
    definition: McpConnectionDefinition[Principal] = McpConnectionDefinition(
        name=NAME, transport=McpTransport(type="http", url=servers.mcp_url), auth=oauth.auth(NAME)
    )
    connections = await create_mcp_connections([definition], context=who)
    try:
        tool = next(tool for tool in connections.tools if tool.name == f"{NAME}__search")
        assert tool.execute is not None
        return await tool.execute(ToolCall(tool_call_id="t1", tool_name=tool.name, input={"query": "q"}))
    finally:
        await connections.close()


async def stored_tokens(admin_dsn: str, who: Principal) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "select key_id, ciphertext from bastion.credentials where owner_id = %s and secret = %s",
            (who.id, f"mcp-oauth:{NAME}"),
        )
        return await cursor.fetchall()


async def stored_connection(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, who: Principal
) -> dict[str, Any]:
    store = PostgresCredentialProvider(oauth_pool, keys=oauth_keys)
    ref = CredentialRef(provider=store.name, secret=f"mcp-oauth:{NAME}", scope="user")
    value = await store.get(ref, owner_id=who.id)
    assert value is not None
    loaded: dict[str, Any] = json.loads(value)
    return loaded


async def pending_rows(admin_dsn: str, who: Principal) -> int:
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        cursor = await conn.execute(
            "select count(*) from bastion.mcp_oauth_authorizations where owner_id = %s", (who.id,)
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])


# Connecting


async def test_the_authorization_url_comes_from_discovery_with_pkce_resource_and_scope(
    oauth: McpOAuth, servers: OAuthServers, migrated_database: MigratedDatabase
) -> None:
    alice = principal()
    url = await oauth.start(alice, NAME, conversation_id="c1", tool_call_id="call-1")
    params = {key: values[0] for key, values in parse_qs(urlparse(url).query).items()}
    assert url.startswith(f"{servers.issuer}/authorize?")
    assert params["code_challenge_method"] == "S256"
    assert params["resource"] == servers.mcp_url
    assert params["scope"] == SCOPE
    assert params["redirect_uri"] == REDIRECT
    assert params["client_id"] in servers.authorization.clients  # registered dynamically
    assert await pending_rows(migrated_database.admin_dsn, alice) == 1


async def test_a_sign_in_that_starts_as_expected_logs_no_error(
    oauth: McpOAuth, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await oauth.start(principal(), NAME)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []


async def test_a_connection_with_a_configured_client_signs_in_without_registering(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring
) -> None:
    with serve_oauth(registration=False) as servers:
        client = OAuthClientInformationFull(
            client_id="bastion-app",
            client_secret="configured-secret",
            token_endpoint_auth_method="client_secret_post",
            redirect_uris=[AnyUrl(REDIRECT)],
            scope=SCOPE,
        )
        servers.authorization.clients["bastion-app"] = client
        connection = McpOAuthConnection(
            name=NAME,
            server_url=servers.mcp_url,
            redirect_uri=REDIRECT,
            client_id="bastion-app",
            client_secret="configured-secret",
        )
        oauth = build_oauth(oauth_pool, oauth_keys, servers, connection=connection)
        alice = principal()
        await connect(oauth, alice)
        assert await search(oauth, alice, servers) == FOUND
        assert servers.authorization.log.registrations == 0


async def test_a_connected_user_calls_the_protected_server_with_their_own_token(
    oauth: McpOAuth,
    servers: OAuthServers,
    migrated_database: MigratedDatabase,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    alice = principal()
    await connect(oauth, alice)
    assert await search(oauth, alice, servers) == FOUND
    [status] = await oauth.connections(alice)
    assert (status.status, status.scopes) == ("connected", (SCOPE,))
    assert status.connected_at is not None
    [(key_id, ciphertext)] = await stored_tokens(migrated_database.admin_dsn, alice)
    issued = list(servers.authorization.access) + list(servers.authorization.refresh)
    assert key_id == "k1"
    assert not any(token.encode() in bytes(ciphertext) for token in issued)
    assert not any(token in caplog.text for token in issued)
    assert await pending_rows(migrated_database.admin_dsn, alice) == 0


async def test_a_user_who_never_connected_is_asked_to_and_can_be_sent_to_sign_in(
    oauth: McpOAuth, servers: OAuthServers
) -> None:
    with pytest.raises(McpConnectionError) as raised:
        await search(oauth, principal(), servers)
    assert (raised.value.code, raised.value.can_authorize) == ("authorization_required", True)


async def test_a_connection_that_is_not_interactive_keeps_answering_authorization_required(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> None:
    connection = McpOAuthConnection(
        name=NAME, server_url=servers.mcp_url, redirect_uri=REDIRECT, interactive=False
    )
    oauth = build_oauth(oauth_pool, oauth_keys, servers, connection=connection)
    with pytest.raises(McpConnectionError) as raised:
        await search(oauth, principal(), servers)
    assert (raised.value.code, raised.value.can_authorize) == ("authorization_required", False)


async def test_a_contact_is_never_offered_to_sign_in(oauth: McpOAuth, servers: OAuthServers) -> None:
    contact = ContactPrincipal(
        tenant_id="tenant-a", contact_id=str(uuid.uuid4()), conversation_id=str(uuid.uuid4())
    )
    definition: McpConnectionDefinition[Any] = McpConnectionDefinition(
        name=NAME, transport=McpTransport(type="http", url=servers.mcp_url), auth=oauth.auth(NAME)
    )
    with pytest.raises(McpConnectionError) as raised:
        await create_mcp_connections([definition], context=contact)
    assert (raised.value.code, raised.value.can_authorize) == ("authorization_required", False)


async def test_the_callback_may_land_on_another_worker(
    oauth_pool: AsyncConnectionPool[Any],
    oauth_keys: CredentialKeyring,
    servers: OAuthServers,
    migrated_database: MigratedDatabase,
) -> None:
    first, second = build_oauth(oauth_pool, oauth_keys, servers), build_oauth(oauth_pool, oauth_keys, servers)
    alice = principal()
    answer = await sign_in(await first.start(alice, NAME))
    del first
    await second.complete(alice, NAME, state=answer["state"], code=answer["code"])
    assert await search(second, alice, servers) == FOUND


# Refused callbacks store nothing


async def test_a_callback_for_another_users_state_is_refused_and_stores_nothing(
    oauth: McpOAuth, servers: OAuthServers, migrated_database: MigratedDatabase
) -> None:
    alice, mallory = principal(), principal()
    answer = await sign_in(await oauth.start(alice, NAME))
    with pytest.raises(AuthorizationStateInvalidError):
        await oauth.complete(mallory, NAME, state=answer["state"], code=answer["code"])
    assert await stored_tokens(migrated_database.admin_dsn, mallory) == []
    assert await pending_rows(migrated_database.admin_dsn, alice) == 1  # mallory could not even consume it
    await oauth.complete(alice, NAME, state=answer["state"], code=answer["code"])


async def test_a_replayed_callback_is_refused(
    oauth: McpOAuth, servers: OAuthServers, migrated_database: MigratedDatabase
) -> None:
    alice = principal()
    answer = await sign_in(await oauth.start(alice, NAME))
    await oauth.complete(alice, NAME, state=answer["state"], code=answer["code"])
    exchanged = servers.authorization.log.codes_exchanged
    with pytest.raises(AuthorizationStateInvalidError) as raised:
        await oauth.complete(alice, NAME, state=answer["state"], code=answer["code"])
    assert raised.value.code == "authorization_state_invalid"
    assert servers.authorization.log.codes_exchanged == exchanged


async def test_an_expired_state_is_refused_and_stores_nothing(
    oauth_pool: AsyncConnectionPool[Any],
    oauth_keys: CredentialKeyring,
    servers: OAuthServers,
    migrated_database: MigratedDatabase,
) -> None:
    oauth = build_oauth(oauth_pool, oauth_keys, servers, state_ttl=timedelta(seconds=-1))
    alice = principal()
    answer = await sign_in(await oauth.start(alice, NAME))
    with pytest.raises(AuthorizationStateExpiredError) as raised:
        await oauth.complete(alice, NAME, state=answer["state"], code=answer["code"])
    assert raised.value.code == "authorization_state_expired"
    assert await stored_tokens(migrated_database.admin_dsn, alice) == []


async def test_a_code_issued_for_another_pkce_challenge_is_refused_and_stores_nothing(
    oauth: McpOAuth, servers: OAuthServers, migrated_database: MigratedDatabase
) -> None:
    alice = principal()
    first = await sign_in(await oauth.start(alice, NAME))
    second = await sign_in(await oauth.start(alice, NAME))
    with pytest.raises(AuthorizationCodeRefusedError) as raised:
        await oauth.complete(alice, NAME, state=second["state"], code=first["code"])
    assert raised.value.code == "authorization_code_refused"
    assert await stored_tokens(migrated_database.admin_dsn, alice) == []


async def test_tokens_issued_for_another_resource_are_refused_and_stored_nowhere(
    oauth: McpOAuth, servers: OAuthServers, migrated_database: MigratedDatabase
) -> None:
    servers.authorization.issue_for_resource = "http://127.0.0.1:9/elsewhere"
    alice = principal()
    answer = await sign_in(await oauth.start(alice, NAME))
    with pytest.raises(AuthorizationResourceMismatchError) as raised:
        await oauth.complete(alice, NAME, state=answer["state"], code=answer["code"])
    assert raised.value.code == "authorization_resource_mismatch"
    assert await stored_tokens(migrated_database.admin_dsn, alice) == []


async def test_an_answer_naming_another_issuer_is_refused_and_stores_nothing(
    oauth: McpOAuth, migrated_database: MigratedDatabase
) -> None:
    alice = principal()
    answer = await sign_in(await oauth.start(alice, NAME))
    with pytest.raises(AuthorizationIssuerMismatchError) as raised:
        await oauth.complete(
            alice, NAME, state=answer["state"], code=answer["code"], iss="http://127.0.0.1:9"
        )
    assert raised.value.code == "authorization_issuer_mismatch"
    assert await stored_tokens(migrated_database.admin_dsn, alice) == []


async def test_a_token_endpoint_that_does_not_answer_in_time_is_a_stable_error(
    oauth_pool: AsyncConnectionPool[Any],
    oauth_keys: CredentialKeyring,
    servers: OAuthServers,
    migrated_database: MigratedDatabase,
) -> None:
    oauth = build_oauth(oauth_pool, oauth_keys, servers, timeout=0.3)
    alice = principal()
    answer = await sign_in(await oauth.start(alice, NAME))
    servers.authorization.exchange_delay = 1.0
    with pytest.raises(AuthorizationUnavailableError) as raised:
        await oauth.complete(alice, NAME, state=answer["state"], code=answer["code"])
    assert (raised.value.code, raised.value.status) == ("authorization_unavailable", 502)
    assert await stored_tokens(migrated_database.admin_dsn, alice) == []


async def test_a_user_refused_at_the_server_is_told_so(
    oauth: McpOAuth, servers: OAuthServers, migrated_database: MigratedDatabase
) -> None:
    servers.authorization.refuse_sign_in = True
    alice = principal()
    answer = await sign_in(await oauth.start(alice, NAME))
    assert answer["error"] == "access_denied"
    with pytest.raises(AuthorizationDeniedError) as raised:
        await oauth.complete(alice, NAME, state=answer["state"], error=answer["error"])
    assert "not authorized" in raised.value.message
    assert await stored_tokens(migrated_database.admin_dsn, alice) == []


# Refresh


async def test_an_expiring_token_is_refreshed_and_the_rotated_refresh_token_replaces_the_old(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> None:
    oauth = build_oauth(oauth_pool, oauth_keys, servers, refresh_margin=600)
    alice = principal()
    servers.authorization.access_ttl = 60  # stale at once under a 600 s margin
    await connect(oauth, alice)
    first = await stored_connection(oauth_pool, oauth_keys, alice)
    servers.authorization.access_ttl = 3600
    servers.authorization.expire_access_tokens()  # only a refreshed token gets through now
    assert await search(oauth, alice, servers) == FOUND
    second = await stored_connection(oauth_pool, oauth_keys, alice)
    assert second["token"]["refresh_token"] != first["token"]["refresh_token"]
    assert second["token"]["refresh_token"] in servers.authorization.refresh
    assert first["token"]["refresh_token"] not in servers.authorization.refresh  # rotated away


async def test_two_turns_refreshing_at_once_refresh_once(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> None:
    oauth = build_oauth(oauth_pool, oauth_keys, servers, refresh_margin=600)
    alice = principal()
    servers.authorization.access_ttl = 60  # stale at once under a 600 s margin
    await connect(oauth, alice)
    servers.authorization.access_ttl = 3600
    servers.authorization.refresh_delay = 0.3
    before = servers.authorization.log.refreshes
    headers = oauth.auth(NAME)
    first, second = await asyncio.gather(headers(alice), headers(alice))
    assert first == second
    assert servers.authorization.log.refreshes == before + 1


async def test_a_refused_refresh_asks_to_connect_again_and_is_not_retried(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> None:
    oauth = build_oauth(oauth_pool, oauth_keys, servers, refresh_margin=600)
    alice = principal()
    servers.authorization.access_ttl = 60
    await connect(oauth, alice)
    servers.authorization.revoke_refresh_tokens()
    attempts = servers.authorization.log.refresh_attempts
    headers = oauth.auth(NAME)
    with pytest.raises(ConnectionAuthorizationRequiredError):
        await headers(alice)
    with pytest.raises(ConnectionAuthorizationRequiredError):
        await headers(alice)
    assert servers.authorization.log.refresh_attempts == attempts + 1
    [status] = await oauth.connections(alice)
    assert status.status == "expired"


async def test_stored_tokens_outlive_a_key_rotation_and_a_refresh_seals_them_with_the_new_key(
    oauth_pool: AsyncConnectionPool[Any], servers: OAuthServers, migrated_database: MigratedDatabase
) -> None:
    alice = principal()
    old = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
    servers.authorization.access_ttl = 60
    await connect(build_oauth(oauth_pool, keyring(old), servers), alice)
    servers.authorization.access_ttl = 3600
    rotated = keyring(f"k2:{base64.b64encode(os.urandom(32)).decode()},{old}")
    refreshing = build_oauth(oauth_pool, rotated, servers, refresh_margin=600)
    assert await search(refreshing, alice, servers) == FOUND
    [(key_id, _)] = await stored_tokens(migrated_database.admin_dsn, alice)
    assert key_id == "k2"


# Disconnecting


async def test_disconnect_deletes_the_tokens_and_revokes_them_at_the_server(
    oauth: McpOAuth, servers: OAuthServers, migrated_database: MigratedDatabase
) -> None:
    alice = principal()
    await connect(oauth, alice)
    [(_, _)] = await stored_tokens(migrated_database.admin_dsn, alice)
    issued_before = set(servers.authorization.access)
    await oauth.disconnect(alice, NAME)
    assert await stored_tokens(migrated_database.admin_dsn, alice) == []
    assert set(servers.authorization.log.revoked) & issued_before
    [status] = await oauth.connections(alice)
    assert status.status == "not_connected"
    with pytest.raises(McpConnectionError):
        await search(oauth, alice, servers)


# Row-level security


async def as_direct_client(dsn: str, who: Principal, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """What a user's own client with a valid token (a Data API: `authenticated` only) gets."""
    claims = StoreIdentity(user_id=who.id).database_claims()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(
            "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)",
            (claims,),
        )
        cursor = await conn.execute(sql, params)
        return await cursor.fetchall()


async def test_a_users_own_client_sees_neither_their_pending_sign_ins_nor_their_tokens(
    oauth: McpOAuth, migrated_database: MigratedDatabase
) -> None:
    alice = principal()
    await oauth.start(alice, NAME)
    assert await pending_rows(migrated_database.admin_dsn, alice) == 1
    direct = migrated_database.direct_dsn
    assert await as_direct_client(direct, alice, "select * from bastion.mcp_oauth_authorizations") == []
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_direct_client(direct, alice, "select * from bastion.mcp_tools")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_direct_client(direct, alice, "select bastion.mcp_check_tools('a', 'b', 'accept', '[]')")
