"""Fixtures and helpers for the OAuth connection tests: the credentials keyring, a pool connected as the
application's role, an `McpOAuth` over them, and a browser's sign-in at the test authorization server."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx2
import pytest
from psycopg_pool import AsyncConnectionPool

from bastion.auth import Principal
from bastion.mcp.oauth import McpOAuth, McpOAuthConnection
from bastion.stores.credentials import CredentialKeyring, PostgresCredentialProvider
from bastion.stores.oauth_states import PostgresAuthorizationStates
from tests.oauth_servers import OAuthServers
from tests.pg import ClusterDatabase

REDIRECT = "http://127.0.0.1:1/connections/callback"
NAME = "docs"


def principal(user_id: str | None = None) -> Principal:
    return Principal(
        id=user_id or str(uuid.uuid4()),
        role="authenticated",
        email=None,
        is_anonymous=False,
        aal=None,
        session_id=None,
        tenant_id=None,
        roles=(),
        claims={},
    )


def keyring(text: str) -> CredentialKeyring:
    return CredentialKeyring.from_environment(environ={"BASTION_CREDENTIALS_KEY": text})


@pytest.fixture
async def oauth_pool(migrated_database: ClusterDatabase) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        migrated_database.app_dsn, min_size=1, max_size=6, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    yield pool
    await pool.close()


@pytest.fixture
def oauth_keys() -> CredentialKeyring:
    return keyring(f"k1:{base64.b64encode(os.urandom(32)).decode()}")


def build_oauth(
    pool: AsyncConnectionPool[Any],
    keys: CredentialKeyring,
    servers: OAuthServers,
    **options: Any,
) -> McpOAuth:
    connection = options.pop("connection", None) or McpOAuthConnection(
        name=NAME, server_url=servers.mcp_url, redirect_uri=REDIRECT
    )
    return McpOAuth(
        [connection],
        credentials=lambda who: PostgresCredentialProvider(pool, keys=keys, tenant_id=who.tenant_id),
        states=PostgresAuthorizationStates(pool, keys=keys),
        **options,
    )


async def sign_in(url: str) -> dict[str, str]:
    """What a browser does: open the authorization URL, and read where the server sends it back."""
    async with httpx2.AsyncClient() as client:
        response = await client.get(url)
    assert response.status_code == 302, response.text
    location = response.headers["location"]
    assert location.startswith(REDIRECT)
    return {key: values[0] for key, values in parse_qs(urlparse(location).query).items()}
