"""The OAuth connection routes over real HTTP: a signed-in user connects, lists and disconnects, and a
callback that is not the caller's own, or comes twice, is refused with a stable code."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from psycopg_pool import AsyncConnectionPool

from bastion.auth import Principal, SupabaseEnv
from bastion.mcp import create_mcp_connections
from bastion.mcp.oauth_routes import oauth_connection_routes
from bastion.stores.credentials import CredentialKeyring
from bastion.tools import ToolCall
from bastion.worker import create_agent_worker
from tests.live_server import live_server
from tests.oauth_db import NAME, REDIRECT, build_oauth, sign_in
from tests.oauth_servers import SCOPE, OAuthServers, serve_oauth
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"


class Users:
    def __init__(self, http: httpx2.AsyncClient, signing: SigningKeys, env: SupabaseEnv) -> None:
        self.http = http
        self._keys = signing
        self._env = env

    def headers(self, sub: str) -> dict[str, str]:
        token = es256(self._keys, user_claims(self._env.issuer, time.time(), sub=sub))
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def servers() -> Iterator[OAuthServers]:
    with serve_oauth() as running:
        yield running


@pytest.fixture
async def users(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> AsyncIterator[Users]:
    signing = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=signing.jwks())
    app = create_agent_worker(
        env=env, routes=oauth_connection_routes(build_oauth(oauth_pool, oauth_keys, servers))
    )
    with live_server(app) as base:
        async with httpx2.AsyncClient(base_url=base) as http:
            yield Users(http, signing, env)


async def start(users: Users, who: str) -> dict[str, str]:
    response = await users.http.post(
        f"/v1/connections/{NAME}/oauth/authorize",
        json={"conversation_id": "c1", "tool_call_id": "call-1"},
        headers=users.headers(who),
    )
    assert response.status_code == 200, response.text
    return await sign_in(response.json()["authorization_url"])


async def test_a_user_connects_lists_and_disconnects_through_the_routes(
    users: Users, servers: OAuthServers
) -> None:
    alice = str(uuid.uuid4())
    listed = await users.http.get("/v1/connections", headers=users.headers(alice))
    assert listed.json() == {
        "connections": [{"name": NAME, "status": "not_connected", "scopes": [], "connected_at": None}]
    }
    answer = await start(users, alice)
    done = await users.http.post(
        f"/v1/connections/{NAME}/oauth/callback",
        json={"state": answer["state"], "code": answer["code"]},
        headers=users.headers(alice),
    )
    assert done.status_code == 200, done.text
    assert (done.json()["status"], done.json()["scopes"]) == ("connected", [SCOPE])
    issued = [*servers.authorization.access, *servers.authorization.refresh]
    assert not any(token in done.text for token in issued)
    gone = await users.http.delete(f"/v1/connections/{NAME}/oauth", headers=users.headers(alice))
    assert gone.status_code == 204
    listed = await users.http.get("/v1/connections", headers=users.headers(alice))
    assert listed.json()["connections"][0]["status"] == "not_connected"


async def test_a_callback_for_another_user_or_a_second_time_is_refused(users: Users) -> None:
    alice, mallory = str(uuid.uuid4()), str(uuid.uuid4())
    answer = await start(users, alice)
    body = {"state": answer["state"], "code": answer["code"]}
    foreign = await users.http.post(
        f"/v1/connections/{NAME}/oauth/callback", json=body, headers=users.headers(mallory)
    )
    assert (foreign.status_code, foreign.json()["code"]) == (400, "authorization_state_invalid")
    listed = await users.http.get("/v1/connections", headers=users.headers(mallory))
    assert listed.json()["connections"][0]["status"] == "not_connected"
    first = await users.http.post(
        f"/v1/connections/{NAME}/oauth/callback", json=body, headers=users.headers(alice)
    )
    again = await users.http.post(
        f"/v1/connections/{NAME}/oauth/callback", json=body, headers=users.headers(alice)
    )
    assert first.status_code == 200
    assert (again.status_code, again.json()["code"]) == (400, "authorization_state_invalid")


async def test_a_user_refused_at_the_server_gets_a_stable_code(users: Users, servers: OAuthServers) -> None:
    servers.authorization.refuse_sign_in = True
    try:
        alice = str(uuid.uuid4())
        answer = await start(users, alice)
    finally:
        servers.authorization.refuse_sign_in = False
    refused = await users.http.post(
        f"/v1/connections/{NAME}/oauth/callback",
        json={"state": answer["state"], "error": answer["error"]},
        headers=users.headers(alice),
    )
    assert (refused.status_code, refused.json()["code"]) == (400, "authorization_denied")


async def test_the_routes_need_a_signed_in_user_and_a_known_connection(users: Users) -> None:
    anonymous = await users.http.post(f"/v1/connections/{NAME}/oauth/authorize", json={})
    assert anonymous.status_code == 401
    unknown = await users.http.post(
        "/v1/connections/elsewhere/oauth/authorize", json={}, headers=users.headers(str(uuid.uuid4()))
    )
    assert (unknown.status_code, unknown.json()["code"]) == (404, "connection_not_found")
    malformed = await users.http.post(
        f"/v1/connections/{NAME}/oauth/callback", json={"code": "x"}, headers=users.headers(str(uuid.uuid4()))
    )
    assert malformed.status_code == 400


async def test_the_guides_connection_signs_a_user_in_and_pins_its_tools(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> None:
    guide = (Path(__file__).resolve().parents[1] / "docs" / "mcp.md").read_text()
    [block] = [
        b for b in re.findall(r"```py\n(.*?)```", guide, flags=re.DOTALL) if "def docs_connection(" in b
    ]
    namespace: dict[str, Any] = {}
    exec(block, namespace)
    definition, routes = namespace["docs_connection"](
        oauth_pool, oauth_keys, server_url=servers.mcp_url, redirect_uri=REDIRECT
    )
    signing = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=signing.jwks())
    alice = str(uuid.uuid4())
    with live_server(create_agent_worker(env=env, routes=routes)) as base:
        async with httpx2.AsyncClient(base_url=base) as http:
            users = Users(http, signing, env)
            answer = await start(users, alice)
            done = await http.post(
                f"/v1/connections/{NAME}/oauth/callback",
                json={"state": answer["state"], "code": answer["code"]},
                headers=users.headers(alice),
            )
            assert done.json()["status"] == "connected"
    principal = Principal(
        id=alice,
        role="authenticated",
        email=None,
        is_anonymous=False,
        aal=None,
        session_id=None,
        tenant_id="tenant-a",  # the tenant in the test tokens' app_metadata
        roles=(),
        claims={},
    )
    connections = await create_mcp_connections([definition], context=principal)
    try:
        [search] = connections.tools
        assert search.execute is not None
        assert await search.execute(
            ToolCall(tool_call_id="t", tool_name=search.name, input={"query": "q"})
        ) == {"result": "found: q"}
    finally:
        await connections.close()
