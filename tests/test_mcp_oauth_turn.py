"""A turn that needs a user's OAuth connection pauses with a Connect card and resumes after the callback,
over real HTTP: a real authorization server and the MCP server it protects, the chat route under uvicorn."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from psycopg_pool import AsyncConnectionPool

from bastion import AgentTools, define_agent
from bastion.auth import SupabaseEnv
from bastion.chat.endpoint import chat_routes
from bastion.chat.turn import ChatTurn
from bastion.mcp import McpConnectionDefinition, McpConnectionError, McpTransport
from bastion.mcp.oauth import McpOAuth, McpOAuthConnection
from bastion.mcp.oauth_routes import oauth_connection_routes
from bastion.mcp.sign_in import create_mcp_connections_with_sign_in
from bastion.stores import SqliteStore, StoreIdentity
from bastion.stores.credentials import CredentialKeyring
from bastion.worker import create_agent_worker
from tests.live_server import live_server
from tests.oauth_db import NAME, REDIRECT, build_oauth, sign_in
from tests.oauth_servers import OAuthServers, serve_oauth
from tests.scripted import Call, ScriptedModel
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"
CONNECT = f"connect_{NAME}"
SEARCH = f"{NAME}__search"


@pytest.fixture(scope="module")
def servers() -> Iterator[OAuthServers]:
    with serve_oauth() as running:
        yield running


@dataclass
class Chat:
    http: httpx2.AsyncClient
    store: SqliteStore
    signing: SigningKeys
    env: SupabaseEnv
    model: ScriptedModel
    alice: str

    def headers(self, sub: str | None = None) -> dict[str, str]:
        token = es256(self.signing, user_claims(self.env.issuer, time.time(), sub=sub or self.alice))
        return {"Authorization": f"Bearer {token}"}

    async def post(self, conversation: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        body = {"id": conversation, "messages": messages, "trigger": "submit-message"}
        response = await self.http.post("/api/chat", json=body, headers=self.headers())
        assert response.status_code == 200, response.text
        return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]

    async def stored(self, conversation: str) -> list[dict[str, Any]]:
        identity = StoreIdentity(user_id=self.alice, tenant_id="tenant-a")
        return [record.message for record in await self.store.list_messages(identity, conversation)]

    async def callback(self, answer: dict[str, str], sub: str | None = None) -> httpx2.Response:
        body = {key: answer[key] for key in ("state", "code", "error") if key in answer}
        return await self.http.post(
            f"/api/connections/{NAME}/oauth/callback", json=body, headers=self.headers(sub)
        )


def _user(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


def _answered(
    messages: list[dict[str, Any]], approved: bool, reason: str | None = None
) -> list[dict[str, Any]]:
    """What the page sends back once the sign-in is over: the paused call answered."""
    answered = json.loads(json.dumps(messages))
    [part] = [p for p in answered[-1]["parts"] if p.get("state") == "approval-requested"]
    part["state"] = "approval-responded"
    part["approval"] = {**part["approval"], "approved": approved, **({"reason": reason} if reason else {})}
    return answered


async def _chat(
    tmp_path: Path,
    pool: AsyncConnectionPool[Any],
    keys: CredentialKeyring,
    servers: OAuthServers,
    *,
    steps: tuple[list[Any], ...] = (
        [Call(CONNECT, {})],
        [Call(SEARCH, {"query": "pricing"})],
        ["The pricing page is there."],
    ),
    alice: str | None = None,
    **connection: Any,
) -> AsyncIterator[Chat]:
    oauth = build_oauth(
        pool,
        keys,
        servers,
        connection=McpOAuthConnection(
            name=NAME, server_url=servers.mcp_url, redirect_uri=REDIRECT, **connection
        ),
    )
    definition: McpConnectionDefinition[Any] = McpConnectionDefinition(
        name=NAME, transport=McpTransport(type="http", url=servers.mcp_url), auth=oauth.auth(NAME)
    )

    async def tools(turn: ChatTurn) -> AgentTools:
        # An McpConnectionError raised here reaches the client as 403 `authorization_required`.
        connections = await create_mcp_connections_with_sign_in(
            [definition], context=turn.principal, oauth=oauth, conversation_id=turn.conversation_id
        )
        return AgentTools(tools=connections.tools, close=connections.close)

    agent = define_agent(name="docs", instructions="Help with the documents.", tools=tools)
    model = ScriptedModel(*steps)
    signing = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=signing.jwks())
    async with await SqliteStore.open(tmp_path / "chat.sqlite3") as store:
        await store.migrate()
        routes = chat_routes(agent=agent, store=store, model=model, context=lambda turn: turn)
        app = create_agent_worker(env=env, routes=[*routes, *oauth_connection_routes(oauth)])
        with live_server(app) as base:
            async with httpx2.AsyncClient(base_url=base, timeout=30) as http:
                yield Chat(http, store, signing, env, model, alice or str(uuid.uuid4()))


@pytest.fixture
async def chat(
    tmp_path: Path, oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> AsyncIterator[Chat]:
    async for running in _chat(tmp_path, oauth_pool, oauth_keys, servers):
        yield running


def _card(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    [available] = [c for c in chunks if c["type"] == "tool-input-available" and c["toolName"] == CONNECT]
    [asked] = [c for c in chunks if c["type"] == "tool-approval-request"]
    assert asked["toolCallId"] == available["toolCallId"]
    card: dict[str, Any] = available["toolMetadata"]["authorization"]
    return card


async def test_a_turn_pauses_with_a_connect_card_and_resumes_with_the_tools_answer_after_the_callback(
    chat: Chat, servers: OAuthServers
) -> None:
    conversation = str(uuid.uuid4())
    paused = await chat.post(conversation, [_user("find the pricing page")])
    card = _card(paused)
    assert card["connection"] == NAME
    assert chat.model.calls == 1  # the turn stopped at the card
    messages = await chat.stored(conversation)
    [waiting] = [p for p in messages[-1]["parts"] if p.get("state") == "approval-requested"]
    assert waiting["toolMetadata"]["authorization"]["url"] == card["url"]

    answer = await sign_in(card["url"])
    done = await chat.callback(answer)
    assert (done.status_code, done.json()["status"]) == (200, "connected"), done.text

    resumed = await chat.post(conversation, _answered(messages, approved=True))
    outputs = {c["toolCallId"]: c["output"] for c in resumed if c["type"] == "tool-output-available"}
    assert outputs[waiting["toolCallId"]] == {"connection": NAME, "connected": True}
    assert list(outputs.values())[1:] == [{"result": "found: pricing"}], outputs
    text = "".join(c["delta"] for c in resumed if c["type"] == "text-delta")
    assert text == "The pricing page is there."
    assert chat.model.calls == 3
    told = " ".join(str(request.messages) for request in chat.model.requests)
    assert answer["state"] not in told and answer["code"] not in told  # the card is the page's alone
    issued = [*servers.authorization.access, *servers.authorization.refresh]
    assert not any(token in json.dumps(resumed) + json.dumps(paused) for token in issued)

    replayed = await chat.callback(answer)
    assert (replayed.status_code, replayed.json()["code"]) == (400, "authorization_state_invalid")


async def test_a_user_who_is_refused_at_the_server_sees_it_and_the_model_is_told(
    chat: Chat, servers: OAuthServers
) -> None:
    conversation = str(uuid.uuid4())
    chat.model.steps = [[Call(CONNECT, {})], ["I could not reach your documents."]]
    card = _card(await chat.post(conversation, [_user("find the pricing page")]))
    servers.authorization.refuse_sign_in = True
    try:
        answer = await sign_in(card["url"])
    finally:
        servers.authorization.refuse_sign_in = False
    refused = await chat.callback(answer)
    assert (refused.status_code, refused.json()["code"]) == (400, "authorization_denied")
    assert refused.json()["message"] == f"The {NAME} connection was not authorized."
    reason = f"The {NAME} connection was not authorized."
    resumed = await chat.post(conversation, _answered(await chat.stored(conversation), False, reason))
    assert [c["type"] for c in resumed if c["type"].startswith("tool-output")] == ["tool-output-denied"]
    told = str(chat.model.requests[-1].messages[-1])
    assert f"The user denied this tool call. Reason: {reason}" in told
    listed = await chat.http.get("/api/connections", headers=chat.headers())
    assert listed.json()["connections"][0]["status"] == "not_connected"


async def test_an_approval_without_a_finished_sign_in_grants_nothing(chat: Chat) -> None:
    conversation = str(uuid.uuid4())
    chat.model.steps = [[Call(CONNECT, {})], ["Please connect first."]]
    _card(await chat.post(conversation, [_user("find the pricing page")]))
    resumed = await chat.post(conversation, _answered(await chat.stored(conversation), approved=True))
    [failed] = [c for c in resumed if c["type"] == "tool-output-error"]
    assert failed["errorText"] == f"The {NAME} connection was not authorized."


async def test_another_users_callback_for_the_cards_state_is_refused_and_stores_nothing(chat: Chat) -> None:
    conversation = str(uuid.uuid4())
    card = _card(await chat.post(conversation, [_user("find the pricing page")]))
    answer = await sign_in(card["url"])
    mallory = str(uuid.uuid4())
    foreign = await chat.callback(answer, sub=mallory)
    assert (foreign.status_code, foreign.json()["code"]) == (400, "authorization_state_invalid")
    for who in (mallory, chat.alice):
        listed = await chat.http.get("/api/connections", headers=chat.headers(who))
        assert listed.json()["connections"][0]["status"] == "not_connected"
    mine = await chat.callback(answer)
    assert mine.status_code == 200, mine.text


async def test_a_connection_that_is_not_interactive_answers_authorization_required_without_a_card(
    tmp_path: Path, oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> None:
    async for chat in _chat(tmp_path, oauth_pool, oauth_keys, servers, interactive=False):
        body = {"id": str(uuid.uuid4()), "messages": [_user("find it")], "trigger": "submit-message"}
        response = await chat.http.post("/api/chat", json=body, headers=chat.headers())
        assert (response.status_code, response.json()["code"]) == (403, "authorization_required")
        assert chat.model.calls == 0


async def test_a_contact_never_gets_a_card(
    oauth_pool: AsyncConnectionPool[Any], oauth_keys: CredentialKeyring, servers: OAuthServers
) -> None:
    oauth: McpOAuth = build_oauth(oauth_pool, oauth_keys, servers)
    definition: McpConnectionDefinition[Any] = McpConnectionDefinition(
        name=NAME, transport=McpTransport(type="http", url=servers.mcp_url), auth=oauth.auth(NAME)
    )
    contact = {"contact_id": "c-1", "channel": "inbox"}
    with pytest.raises(McpConnectionError) as raised:
        await create_mcp_connections_with_sign_in(
            [definition], context=contact, oauth=oauth, conversation_id="conversation-1"
        )
    assert (raised.value.code, raised.value.can_authorize) == ("authorization_required", False)


async def test_the_callback_and_the_continuation_land_on_another_worker_after_the_first_stopped(
    tmp_path: Path,
    oauth_pool: AsyncConnectionPool[Any],
    oauth_keys: CredentialKeyring,
    servers: OAuthServers,
) -> None:
    """Nothing of the pause lives in a process: the card is in the stored message, the pending sign-in in
    Postgres; a fresh worker over the same stores finishes the sign-in and runs the paused call."""
    conversation, alice = str(uuid.uuid4()), str(uuid.uuid4())
    first = _chat(tmp_path, oauth_pool, oauth_keys, servers, steps=([Call(CONNECT, {})],), alice=alice)
    chat = await anext(first)
    card = _card(await chat.post(conversation, [_user("find the pricing page")]))
    messages = await chat.stored(conversation)
    await first.aclose()

    answer = await sign_in(card["url"])
    later = (
        [Call(SEARCH, {"query": "pricing"})],
        ["The pricing page is there."],
    )
    second = _chat(tmp_path, oauth_pool, oauth_keys, servers, steps=later, alice=alice)
    chat = await anext(second)
    try:
        done = await chat.callback(answer)
        assert done.status_code == 200, done.text
        resumed = await chat.post(conversation, _answered(messages, approved=True))
    finally:
        await second.aclose()
    outputs = [c["output"] for c in resumed if c["type"] == "tool-output-available"]
    assert outputs == [{"connection": NAME, "connected": True}, {"result": "found: pricing"}]
    assert "".join(c["delta"] for c in resumed if c["type"] == "text-delta") == "The pricing page is there."
