"""The conversation routes any application can mount over a store, with its own rules on top."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from bastion.auth import Principal, SupabaseEnv
from bastion.chat.conversations import ConversationRules, conversation_routes
from bastion.stores import SqliteStore
from bastion.worker import create_agent_worker
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"
ADA = "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"
ANONYMOUS = "0c5d1f3e-9a8b-4c7d-8e6f-5a4b3c2d1e0f"


class Client:
    def __init__(self, client: httpx2.AsyncClient, keys: SigningKeys, env: SupabaseEnv) -> None:
        self.http = client
        self._keys = keys
        self._env = env

    def headers(self, sub: str = ADA, **claims: object) -> dict[str, str]:
        token = es256(self._keys, user_claims(self._env.issuer, time.time(), sub=sub, **claims))
        return {"Authorization": f"Bearer {token}"}


def read_only_for_anonymous(principal: Principal, operation: str) -> bool:
    return not principal.is_anonymous or operation in ("list", "get", "messages", "events")


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    async with await SqliteStore.open(tmp_path / "conversations.sqlite3") as store:
        await store.migrate()
        rules = ConversationRules(allows=read_only_for_anonymous)
        app = create_agent_worker(env=env, routes=conversation_routes(store, rules=rules))
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as http:
            yield Client(http, keys, env)


async def test_every_conversation_route_needs_a_token(client: Client) -> None:
    response = await client.http.get("/api/conversations")
    assert response.status_code == 401


async def test_the_creator_comes_from_the_token_not_the_body(client: Client) -> None:
    created = await client.http.post(
        "/api/conversations", json={"title": "Mine", "owner_id": ANONYMOUS}, headers=client.headers()
    )
    assert created.status_code == 201
    other = await client.http.get("/api/conversations", headers=client.headers(sub=ANONYMOUS))
    assert other.json()["conversations"] == []
    mine = await client.http.get("/api/conversations", headers=client.headers())
    assert [c["title"] for c in mine.json()["conversations"]] == ["Mine"]


async def test_an_application_rule_can_refuse_more_than_the_store(client: Client) -> None:
    anonymous = client.headers(sub=ANONYMOUS, is_anonymous=True)
    refused = await client.http.post("/api/conversations", json={"title": "x"}, headers=anonymous)
    assert refused.status_code == 403
    assert refused.json() == {"code": "forbidden", "message": "You are not allowed to do this."}
    allowed = await client.http.get("/api/conversations", headers=anonymous)
    assert allowed.status_code == 200


async def test_a_rule_that_fails_refuses(tmp_path: Path) -> None:
    def broken(principal: Principal, operation: str) -> bool:
        raise LookupError("no policy service")

    rules = ConversationRules(allows=broken)
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    async with await SqliteStore.open(tmp_path / "c.sqlite3") as store:
        await store.migrate()
        app = create_agent_worker(env=env, routes=conversation_routes(store, rules=rules))
        async with httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://test"
        ) as http:
            response = await http.get("/api/conversations", headers=Client(http, keys, env).headers())
    assert response.status_code == 403


async def test_a_malformed_id_is_not_found_like_a_foreign_one(client: Client) -> None:
    created = await client.http.post("/api/conversations", json={}, headers=client.headers())
    conversation = created.json()["id"]
    foreign = await client.http.get(
        f"/api/conversations/{conversation}", headers=client.headers(sub=ANONYMOUS)
    )
    malformed = await client.http.get("/api/conversations/not-a-uuid", headers=client.headers())
    assert foreign.status_code == malformed.status_code == 404
    assert foreign.json() == malformed.json()


async def test_messages_cannot_be_written_through_the_routes(client: Client) -> None:
    created = await client.http.post("/api/conversations", json={}, headers=client.headers())
    conversation = created.json()["id"]
    response = await client.http.post(
        f"/api/conversations/{conversation}/messages",
        json={"id": "m1", "role": "assistant", "parts": []},
        headers=client.headers(),
    )
    assert response.status_code == 405
    assert "GET" in response.headers["allow"]


@pytest.mark.parametrize(
    "body",
    [b"[" * 200_000, b'{"title": "lone \\ud800"}', b'{"title": "nul \\u0000"}'],
    ids=["nested too deep", "lone surrogate", "NUL"],
)
async def test_a_body_that_cannot_be_read_or_stored_is_invalid_input(client: Client, body: bytes) -> None:
    response = await client.http.post(
        "/api/conversations",
        content=body,
        headers={**client.headers(), "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"
    listed = await client.http.get("/api/conversations", headers=client.headers())
    assert listed.json()["conversations"] == []


@pytest.mark.parametrize("after", ["²", "١٢", "-1", "1e3"])
async def test_an_event_cursor_is_ascii_digits(client: Client, after: str) -> None:
    created = await client.http.post("/api/conversations", json={}, headers=client.headers())
    response = await client.http.get(
        f"/api/conversations/{created.json()['id']}/events", params={"after": after}, headers=client.headers()
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"
