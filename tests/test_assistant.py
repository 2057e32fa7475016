"""The reference assistant served for real: Postgres, development sign-in and its Supabase-shaped Auth API,
the demo model, the HTTP API, the page's files, and the real AI SDK client through an approval round trip
(the page itself runs in headless Chromium in test_web_page.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx2
import psycopg
import pytest
import uvicorn
from dbos import DBOS

from bastion import ToolCall
from bastion.assistant.agent import AssistantContext, _local_tools
from bastion.assistant.app import AssistantApp
from bastion.assistant.config import AssistantConfig, ConfigError
from bastion.assistant.database import Database, migrate
from bastion.assistant.dev_auth import DevelopmentSignIn
from bastion.assistant.notes import PostgresNoteBook
from bastion.assistant.server import running_assistant
from bastion.auth import Principal
from bastion.durable import DurableEngine
from bastion.stores import PostgresStore, StoreIdentity, apply_migrations
from bastion.worker import Route
from tests.ai_sdk import ai_sdk_dir, approve, run_chat, send
from tests.fake_openai import FakeProvider, fake_openai
from tests.live_server import live_server
from tests.mcp_servers import Behavior, serve_mcp
from tests.pg import PostgresCluster
from tests.scripted import ScriptedModel


@dataclass
class Served:
    url: str
    config: AssistantConfig
    client: httpx2.AsyncClient
    app: AssistantApp

    async def sign_in(self, user: str) -> dict[str, str]:
        response = await self.client.post(f"{self.url}/auth/dev/token", json={"user": user})
        assert response.status_code == 200, response.text
        return {"Authorization": f"Bearer {response.json()['access_token']}"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def serve_assistant(
    pg_cluster: PostgresCluster, data_dir: Path, **settings: Any
) -> AsyncIterator[Served]:
    """The assistant on a fresh database, migrated as the owner and served as the application role.

    Durable chat turns are off unless asked for (`durable=True`): they are tested on their own."""
    settings.setdefault("durable", False)
    database = pg_cluster.database("assistant")
    config = AssistantConfig(
        port=free_port(),
        data_dir=data_dir,
        database_url=pg_cluster.dsn(database),
        app_database_url=pg_cluster.dsn(database, user="bastion_app"),
        **settings,
    )
    await apply_migrations(pg_cluster.dsn(database))
    pg_cluster.create_login_roles()
    async with running_assistant(config) as running:
        server = uvicorn.Server(
            uvicorn.Config(
                running.asgi, host="127.0.0.1", port=config.port, log_level="warning", lifespan="off"
            )
        )
        task = asyncio.ensure_future(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            async with httpx2.AsyncClient(timeout=30) as client:
                yield Served(url=config.base_url, config=config, client=client, app=running.app)
        finally:
            server.should_exit = True
            await task


@pytest.fixture
async def served(pg_cluster: PostgresCluster, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve_assistant(pg_cluster, tmp_path) as running:
        yield running


def user_message(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


async def chat(
    served: Served, headers: dict[str, str], conversation: str, messages: list[Any]
) -> httpx2.Response:
    body = {"id": conversation, "messages": messages, "trigger": "submit-message"}
    return await served.client.post(f"{served.url}/api/chat", json=body, headers=headers)


def stream_chunks(response: httpx2.Response) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in response.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def stream_types(response: httpx2.Response) -> list[str]:
    return [
        json.loads(line[6:])["type"]
        for line in response.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def streamed_text(response: httpx2.Response) -> str:
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return "".join(chunk["delta"] for chunk in chunks if chunk["type"] == "text-delta")


# The HTTP API


async def test_health_and_info_are_public_and_say_the_model_is_a_demo(served: Served) -> None:
    health = await served.client.get(f"{served.url}/health")
    info = await served.client.get(f"{served.url}/api/info")
    assert health.json() == {"status": "ok"}
    assert info.json() == {
        "demo_model": True,
        "model": "demo",
        "development_sign_in": True,
        "auth": {"mode": "development", "url": None, "publishable_key": None},
    }


async def test_a_stopping_assistant_is_not_ready_and_refuses_a_chat_storing_nothing(served: Served) -> None:
    headers = await served.sign_in("ada")
    assert (await served.client.get(f"{served.url}/ready")).json() == {"status": "ready"}
    served.app.drain.start()  # what SIGTERM does to `bastion serve`
    ready = await served.client.get(f"{served.url}/ready")
    assert (ready.status_code, ready.json()["code"], ready.headers["Retry-After"]) == (503, "draining", "1")
    response = await chat(served, headers, str(uuid.uuid4()), [user_message("hello")])
    assert (response.status_code, response.json()["code"]) == (503, "draining")
    listed = await served.client.get(f"{served.url}/api/conversations", headers=headers)
    assert listed.json()["conversations"] == []
    assert (await served.client.get(f"{served.url}/health")).json() == {"status": "ok"}  # still alive


async def test_api_routes_need_a_token(served: Served) -> None:
    response = await served.client.get(f"{served.url}/api/conversations")
    assert response.status_code == 401
    assert response.json()["code"] == "missing_token"


async def test_a_chat_creates_the_conversation_for_the_caller_and_streams_the_demo_reply(
    served: Served,
) -> None:
    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    response = await chat(served, headers, conversation, [user_message("hello")])
    assert response.status_code == 200
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert stream_types(response)[:3] == ["start", "start-step", "text-start"]
    assert "offline demo model" in streamed_text(response)
    listed = await served.client.get(f"{served.url}/api/conversations", headers=headers)
    [created] = listed.json()["conversations"]
    assert created["id"] == conversation
    assert created["title"] == "hello"
    assert created["agent_name"] == "assistant"


async def test_the_assistant_streams_the_turns_token_usage_and_stores_it_with_the_message(
    served: Served,
) -> None:
    served.app.active_model = ScriptedModel(["Hello ", "Ada."])
    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    response = await chat(served, headers, conversation, [user_message("hello there")])
    assert response.status_code == 200, response.text
    [finish] = [chunk for chunk in stream_chunks(response) if chunk["type"] == "finish"]
    usage = finish["messageMetadata"]["usage"]
    assert usage["inputTokens"] > 0 and usage["outputTokens"] > 0
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    assert [request["outputTokens"] for request in finish["messageMetadata"]["requestUsage"]] == [
        usage["outputTokens"]
    ]
    stored = await served.client.get(
        f"{served.url}/v1/conversations/{conversation}/messages", headers=headers
    )
    assistant = stored.json()["messages"][-1]
    assert assistant["role"] == "assistant"
    assert assistant["metadata"]["usage"] == usage


async def test_a_foreign_and_a_missing_conversation_are_404_alike(served: Served) -> None:
    ada = await served.sign_in("ada")
    bob = await served.sign_in("bob")
    conversation = str(uuid.uuid4())
    await chat(served, ada, conversation, [user_message("private")])
    for path in ("", "/messages", "/events"):
        foreign = await served.client.get(f"{served.url}/api/conversations/{conversation}{path}", headers=bob)
        missing = await served.client.get(f"{served.url}/api/conversations/{uuid.uuid4()}{path}", headers=bob)
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json() == missing.json()
    hijack = await chat(served, bob, conversation, [user_message("let me in")])
    assert hijack.status_code == 404
    rename = await served.client.patch(
        f"{served.url}/api/conversations/{conversation}", json={"title": "mine"}, headers=bob
    )
    assert rename.status_code == 404
    messages = await served.client.get(f"{served.url}/api/conversations/{conversation}/messages", headers=ada)
    assert [m["role"] for m in messages.json()["messages"]] == ["user", "assistant"]


async def test_conversations_can_be_created_renamed_and_deleted(served: Served) -> None:
    headers = await served.sign_in("ada")
    created = await served.client.post(
        f"{served.url}/api/conversations", json={"title": "Plans"}, headers=headers
    )
    assert created.status_code == 201
    conversation = created.json()["id"]
    renamed = await served.client.patch(
        f"{served.url}/api/conversations/{conversation}", json={"title": "Launch plans"}, headers=headers
    )
    assert renamed.json()["title"] == "Launch plans"
    deleted = await served.client.delete(f"{served.url}/api/conversations/{conversation}", headers=headers)
    assert deleted.status_code == 204
    gone = await served.client.get(f"{served.url}/api/conversations/{conversation}", headers=headers)
    assert gone.status_code == 404


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"id": "not-a-uuid", "messages": [], "trigger": "submit-message"}, "invalid_input"),
        ({"id": str(uuid.uuid4()), "messages": [], "trigger": "submit-message"}, "invalid_input"),
        ({"id": str(uuid.uuid4()), "messages": [{"role": "user"}], "trigger": "resume"}, "invalid_input"),
    ],
)
async def test_bad_chat_requests_get_a_clear_error(served: Served, body: dict[str, Any], code: str) -> None:
    headers = await served.sign_in("ada")
    response = await served.client.post(f"{served.url}/api/chat", json=body, headers=headers)
    assert response.status_code == 400
    assert response.json()["code"] == code


async def test_a_malformed_body_is_refused_and_nothing_is_stored(served: Served) -> None:
    headers = await served.sign_in("ada")
    response = await served.client.post(f"{served.url}/api/chat", content=b"{not json", headers=headers)
    assert response.status_code == 400
    listed = await served.client.get(f"{served.url}/api/conversations", headers=headers)
    assert listed.json()["conversations"] == []


def _unstorable_first_messages() -> dict[str, list[Any]]:
    long_id = user_message("hi") | {"id": "m" * 201}
    return {
        "NUL in the text": [user_message("bad\x00text")],
        "lone surrogate in the text": [user_message("bad \ud800 text")],
        "id over 200 characters": [long_id],
        "not a message": ["hello"],
    }


@pytest.mark.parametrize("case", list(_unstorable_first_messages()))
async def test_a_first_message_that_cannot_be_stored_is_refused_and_creates_no_conversation(
    served: Served, case: str
) -> None:
    headers = await served.sign_in("ada")
    body = {
        "id": str(uuid.uuid4()),
        "messages": _unstorable_first_messages()[case],
        "trigger": "submit-message",
    }
    response = await served.client.post(
        f"{served.url}/api/chat",
        content=json.dumps(body).encode(),
        headers={**headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"
    listed = await served.client.get(f"{served.url}/api/conversations", headers=headers)
    assert listed.json()["conversations"] == []


async def test_an_event_cursor_must_be_a_number(served: Served) -> None:
    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    await chat(served, headers, conversation, [user_message("hi")])
    response = await served.client.get(
        f"{served.url}/api/conversations/{conversation}/events?after=x", headers=headers
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"


async def test_feedback_is_recorded_for_a_message(served: Served) -> None:
    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    await chat(served, headers, conversation, [user_message("hi")])
    messages = await served.client.get(
        f"{served.url}/api/conversations/{conversation}/messages", headers=headers
    )
    reply = messages.json()["messages"][-1]["id"]
    response = await served.client.post(
        f"{served.url}/api/conversations/{conversation}/feedback",
        json={"message_id": reply, "rating": "up"},
        headers=headers,
    )
    assert response.status_code == 201
    assert response.json()["rating"] == "up"
    refused = await served.client.post(
        f"{served.url}/api/conversations/{conversation}/feedback",
        json={"message_id": reply, "rating": "great"},
        headers=headers,
    )
    assert refused.status_code == 400


async def test_development_sign_in_refuses_bad_user_names(served: Served) -> None:
    response = await served.client.post(f"{served.url}/auth/dev/token", json={"user": "../admin"})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_input"


async def test_the_openapi_document_matches_the_routes(served: Served) -> None:
    from bastion.assistant.app import build_routes

    document = (await served.client.get(f"{served.url}/v1/openapi.json")).json()
    assert (await served.client.get(f"{served.url}/openapi.json")).json() == document
    documented = {(path, method.upper()) for path, methods in document["paths"].items() for method in methods}

    routes: list[Route] = build_routes(served.app)
    api = {(route.path, route.method) for route in routes if route.path.startswith("/api/")}
    ai_sdk = {("/api/chat", "POST"), ("/api/chat/{id}/stop", "POST"), ("/api/chat/{id}/stream", "GET")}
    assert ai_sdk <= api
    expected = {
        *((route.path, route.method) for route in routes if not route.path.startswith("/api/")),
        *(("/v1" + path.removeprefix("/api"), method) for path, method in api),
        *ai_sdk,
    }
    assert documented == expected
    for path in ("/api/chat", "/v1/chat"):
        assert document["paths"][path]["post"]["security"] == [{"bearerAuth": []}]
    assert document["paths"]["/health"]["get"]["security"] == []
    assert "/api/conversations" not in document["paths"]
    description = document["info"]["description"]
    assert (
        "`/v1`" in description
        and "`/api/chat`" in description
        and "x-vercel-ai-ui-message-stream" in description
    )


async def test_the_api_answers_under_v1_and_at_the_paths_the_page_uses(served: Served) -> None:
    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    body = {"id": conversation, "messages": [user_message("hello")], "trigger": "submit-message"}
    streamed = await served.client.post(f"{served.url}/v1/chat", json=body, headers=headers)
    assert streamed.status_code == 200
    assert streamed.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert streamed.headers["x-bastion-api-version"] == "1"
    for prefix in ("/v1", "/api"):
        listed = await served.client.get(f"{served.url}{prefix}/conversations", headers=headers)
        assert [item["id"] for item in listed.json()["conversations"]] == [conversation]
        assert listed.headers["x-bastion-api-version"] == "1"
        info = await served.client.get(f"{served.url}{prefix}/info")
        assert info.json()["demo_model"] is True
    renamed = await served.client.patch(
        f"{served.url}/v1/conversations/{conversation}", json={"title": "Renamed"}, headers=headers
    )
    assert renamed.json()["title"] == "Renamed"
    old = await served.client.get(f"{served.url}/api/conversations/{conversation}", headers=headers)
    assert old.json()["title"] == "Renamed"


async def test_the_page_and_its_assets_are_served(served: Served) -> None:
    page = await served.client.get(f"{served.url}/")
    script = await served.client.get(f"{served.url}/static/app.js")
    icon = await served.client.get(f"{served.url}/static/favicon.svg")
    missing = await served.client.get(f"{served.url}/static/..%2Fapp.py")
    assert page.status_code == 200 and "bastion assistant" in page.text
    assert '<script type="module" crossorigin src="/static/app.js">' in page.text
    assert script.headers["content-type"].startswith("text/javascript")
    assert icon.headers["content-type"] == "image/svg+xml"
    assert missing.status_code == 404
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self';" in policy
    assert "frame-ancestors 'none'" in policy


async def test_a_wrong_address_is_a_page_for_a_browser_and_json_for_an_api_client(served: Served) -> None:
    html = {"accept": "text/html,application/xhtml+xml"}
    page = await served.client.get(f"{served.url}/no-such-page", headers=html)
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert "Nothing here" in page.text and 'href="/"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    shown = await served.client.get(f"{served.url}/%3Cscript%3E", headers=html)
    assert "<script>" not in shown.text and "&lt;script&gt;" in shown.text
    for path, accept in (("/api/no-such-route", html), ("/no-such-page", {"accept": "application/json"})):
        answer = await served.client.get(f"{served.url}{path}", headers=accept)
        assert answer.status_code == 404 and answer.json()["code"] == "not_found"


async def test_the_api_reference_is_served_from_the_package_under_the_strict_policy(served: Served) -> None:
    docs = await served.client.get(f"{served.url}/docs")
    assert docs.status_code == 200 and 'src="/static/docs.js"' in docs.text
    policy = docs.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "style-src 'self';" in policy and "unsafe" not in policy
    script = await served.client.get(f"{served.url}/static/docs.js")
    assert script.status_code == 200 and "swagger" in script.text.lower()


# The development Auth API: the part of Supabase Auth that supabase-js uses


async def test_development_auth_signs_in_refreshes_and_names_the_user_like_supabase(served: Served) -> None:
    auth = f"{served.url}/auth/v1"
    signed_in = await served.client.post(
        f"{auth}/token?grant_type=password", json={"email": "Ada@localhost", "password": "anything"}
    )
    assert signed_in.status_code == 200, signed_in.text
    session = signed_in.json()
    assert session["token_type"] == "bearer" and session["expires_at"] > session["expires_in"]
    assert session["user"]["email"] == "ada@localhost"
    headers = {"Authorization": f"Bearer {session['access_token']}"}
    assert (await served.client.get(f"{served.url}/api/conversations", headers=headers)).status_code == 200
    user = await served.client.get(f"{auth}/user", headers=headers)
    assert user.json()["id"] == session["user"]["id"]

    refreshed = await served.client.post(
        f"{auth}/token?grant_type=refresh_token", json={"refresh_token": session["refresh_token"]}
    )
    assert refreshed.status_code == 200
    assert refreshed.json()["user"]["id"] == session["user"]["id"]
    assert refreshed.json()["access_token"] != session["access_token"]
    logout = await served.client.post(f"{auth}/logout?scope=global", headers=headers)
    assert logout.status_code == 204
    settings = await served.client.get(f"{auth}/settings")
    assert settings.json()["external"]["anonymous_users"] is False


async def test_development_auth_refuses_what_it_did_not_issue(served: Served) -> None:
    auth = f"{served.url}/auth/v1"
    session = (
        await served.client.post(f"{auth}/token?grant_type=password", json={"email": "ada@localhost"})
    ).json()
    # A refresh token is no access token, and an access token is no refresh token.
    as_access = {"Authorization": f"Bearer {session['refresh_token']}"}
    api = await served.client.get(f"{served.url}/api/conversations", headers=as_access)
    assert api.status_code == 401
    assert (await served.client.get(f"{auth}/user", headers=as_access)).status_code == 401
    as_refresh = await served.client.post(
        f"{auth}/token?grant_type=refresh_token", json={"refresh_token": session["access_token"]}
    )
    assert as_refresh.status_code == 400
    for email in ("ada@example.com", "../admin@localhost", 42):
        refused = await served.client.post(f"{auth}/token?grant_type=password", json={"email": email})
        assert refused.status_code == 400 and refused.json()["code"] == "invalid_input"
    grant = await served.client.post(f"{auth}/token?grant_type=id_token", json={})
    assert grant.status_code == 400


async def test_with_supabase_the_development_auth_is_gone_and_the_page_gets_the_project(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with serve_assistant(
        pg_cluster,
        tmp_path,
        supabase_url="https://project-ref.supabase.co",
        supabase_publishable_key="sb_publishable_abc",
    ) as served:
        info = (await served.client.get(f"{served.url}/api/info")).json()
        token = await served.client.post(
            f"{served.url}/auth/v1/token?grant_type=password", json={"email": "ada@localhost"}
        )
        page = await served.client.get(f"{served.url}/")
    assert info["auth"] == {
        "mode": "supabase",
        "url": "https://project-ref.supabase.co",
        "publishable_key": "sb_publishable_abc",
    }
    assert token.status_code == 404
    assert "connect-src 'self' https://project-ref.supabase.co;" in page.headers["content-security-policy"]


# The real AI SDK client, through an approval round trip, with events replayed by cursor


@pytest.mark.parametrize("sdk", ["7", "6"])
async def test_the_ai_sdk_client_approves_a_note_and_the_stored_history_matches(
    served: Served, sdk: str
) -> None:
    ai_sdk_dir()
    headers = await served.sign_in(f"ada{sdk}")
    conversation = str(uuid.uuid4())
    actions = [send("remember that the launch is on Friday"), approve(True), send("show my notes")]
    asked, approved, listed = await run_chat(
        sdk, f"{served.url}/api/chat", actions, headers=headers, chat_id=conversation
    )
    for state in (asked, approved, listed):
        assert state["status"] == "ready", state["error"]
    [saved] = [p for p in approved["messages"][-1]["parts"] if p["type"] == "tool-save_note"]
    assert saved["state"] == "output-available"
    assert saved["output"]["text"] == "the launch is on Friday"
    [notes] = [p for p in listed["messages"][-1]["parts"] if p["type"] == "tool-list_notes"]
    assert [note["text"] for note in notes["output"]["notes"]] == ["the launch is on Friday"]

    stored = await served.client.get(
        f"{served.url}/api/conversations/{conversation}/messages", headers=headers
    )
    assert stored.json()["messages"] == listed["messages"]

    first = await served.client.get(f"{served.url}/api/conversations/{conversation}/events", headers=headers)
    events = first.json()["events"]
    types = [event["type"] for event in events]
    assert types[:3] == ["run.started", "approval.requested", "run.waiting_for_approval"]
    assert "approval.responded" in types and types[-1] == "run.completed"
    middle = events[2]["cursor"]
    rest = await served.client.get(
        f"{served.url}/api/conversations/{conversation}/events?after={middle}", headers=headers
    )
    assert rest.json()["events"] == events[3:]
    assert "the launch is on Friday" not in json.dumps(events)


async def test_a_provider_that_names_every_call_call_0_lists_and_saves_each_time(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    """The review's reproduction: a second `list_notes` saw the first one's stored (empty) output and
    a later approved `save_note` failed as `operation_mismatch`, because every call was `call_0`."""
    with live_server(fake_openai()) as provider:
        settings = {"model": "fake", "model_base_url": f"{provider}/v1"}
        async with serve_assistant(pg_cluster, tmp_path, **settings) as served:
            headers = await served.sign_in("grace")
            actions = [
                send("remember that the launch is on Friday"),
                approve(True),
                send("show my notes"),
                send("remember that the review is on Monday"),
                approve(True),
                send("show my notes"),
            ]
            states = await run_chat(
                "7", f"{served.url}/api/chat", actions, headers=headers, chat_id=str(uuid.uuid4())
            )
    for state in states:
        assert state["status"] == "ready", state["error"]
    saved = [
        part
        for state in (states[1], states[4])
        for part in state["messages"][-1]["parts"]
        if part["type"] == "tool-save_note"
    ]
    assert [part["state"] for part in saved] == ["output-available", "output-available"]
    assert [part["output"]["text"] for part in saved] == [
        "the launch is on Friday",
        "the review is on Monday",
    ]
    listed = [
        next(part for part in state["messages"][-1]["parts"] if part["type"] == "tool-list_notes")
        for state in (states[2], states[5])
    ]
    assert [part["toolCallId"] for part in listed] == ["call_0", "call_0"]
    assert [[note["text"] for note in part["output"]["notes"]] for part in listed] == [
        ["the launch is on Friday"],
        ["the review is on Monday", "the launch is on Friday"],
    ]


async def test_a_chat_on_a_conversation_whose_turn_is_running_is_a_409_with_retry_after(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    fake = FakeProvider()
    with live_server(fake_openai(fake)) as provider:
        settings = {"model": "fake", "model_base_url": f"{provider}/v1"}
        async with serve_assistant(pg_cluster, tmp_path, **settings) as served:
            headers = await served.sign_in("lin")
            conversation = str(uuid.uuid4())
            running = asyncio.ensure_future(chat(served, headers, conversation, [user_message("hold on")]))
            try:
                assert await asyncio.to_thread(fake.holding.wait, 30)
                busy = await chat(served, headers, conversation, [user_message("show my notes")])
            finally:
                fake.release.set()
            assert (await running).status_code == 200
            after = await chat(served, headers, conversation, [user_message("show my notes")])
    assert busy.status_code == 409
    assert busy.json()["code"] == "turn_conflict"
    assert 1 <= int(busy.headers["retry-after"]) <= 30
    assert after.status_code == 200


# The web page in real headless Chromium


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("Chromium is not installed: the test command installs it where it can")


# An MCP server, configured for the whole assistant


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_a_configured_mcp_tool_needs_approval_and_runs_with_the_apps_credential(
    pg_cluster: PostgresCluster, tmp_path: Path, transport: Literal["http", "sse"]
) -> None:
    with serve_mcp(transport, Behavior(tokens=frozenset({"app-token"}))) as mcp:
        async with serve_assistant(
            pg_cluster,
            tmp_path,
            mcp_url=mcp.url,
            mcp_transport=transport,
            mcp_tools=("search",),
            mcp_token="app-token",
        ) as served:
            headers = await served.sign_in("ada")
            conversation = str(uuid.uuid4())
            asked = await chat(served, headers, conversation, [user_message("search bastion")])
            assert "tool-approval-request" in stream_types(asked)
            assert mcp.log.tool_calls("search") == []
            stored = await served.client.get(
                f"{served.url}/api/conversations/{conversation}/messages", headers=headers
            )
            messages = stored.json()["messages"]
            [pending] = [p for p in messages[-1]["parts"] if p.get("toolName") == "mcp__search"]
            assert pending["type"] == "dynamic-tool"
            pending["state"] = "approval-responded"
            pending["approval"]["approved"] = True
            answered = await chat(served, headers, conversation, messages)
            assert answered.status_code == 200
            assert "doc-bastion" in answered.text
            [call] = mcp.log.tool_calls("search")
            assert call.authorization == "Bearer app-token"


async def test_a_refused_mcp_credential_is_a_clear_error_before_the_stream(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    with serve_mcp("http", Behavior(tokens=frozenset({"app-token"}))) as mcp:
        async with serve_assistant(
            pg_cluster, tmp_path, mcp_url=mcp.url, mcp_tools=("search",), mcp_token="expired"
        ) as served:
            headers = await served.sign_in("ada")
            response = await chat(served, headers, str(uuid.uuid4()), [user_message("search bastion")])
    assert response.status_code == 403
    assert response.json()["code"] == "authorization_required"
    assert "expired" not in response.text and mcp.url not in response.text


# An MCP server reached with each user's own credential


def user_mcp(mcp_url: str) -> dict[str, Any]:
    return {"mcp_url": mcp_url, "mcp_tools": ("search",), "mcp_auth": "user"}


async def connect_mcp(served: Served, headers: dict[str, str], token: str) -> None:
    response = await served.client.put(
        f"{served.url}/api/connections/mcp", json={"token": token}, headers=headers
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"connected": True}


async def approved_search(served: Served, headers: dict[str, str], query: str) -> httpx2.Response:
    """Ask for a remote search, approve it, and return the turn that ran it."""
    conversation = str(uuid.uuid4())
    asked = await chat(served, headers, conversation, [user_message(f"search {query}")])
    assert asked.status_code == 200, asked.text
    stored = await served.client.get(
        f"{served.url}/api/conversations/{conversation}/messages", headers=headers
    )
    messages = stored.json()["messages"]
    [pending] = [p for p in messages[-1]["parts"] if p.get("toolName") == "mcp__search"]
    pending["state"] = "approval-responded"
    pending["approval"]["approved"] = True
    return await chat(served, headers, conversation, messages)


async def test_each_user_reaches_the_mcp_server_with_only_their_own_credential(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    with serve_mcp("http", Behavior(tokens=frozenset({"ada-token", "bob-token"}))) as mcp:
        async with serve_assistant(pg_cluster, tmp_path, **user_mcp(mcp.url)) as served:
            ada, bob = await served.sign_in("ada"), await served.sign_in("bob")
            await connect_mcp(served, ada, "ada-token")
            await connect_mcp(served, bob, "bob-token")
            answers = await asyncio.gather(
                approved_search(served, ada, "ada-plans"), approved_search(served, bob, "bob-plans")
            )
    assert [answer.status_code for answer in answers] == [200, 200]
    assert "doc-ada-plans" in answers[0].text and "doc-bob-plans" in answers[1].text
    calls = {(call.arguments["query"], call.authorization) for call in mcp.log.tool_calls("search")}
    assert calls == {("ada-plans", "Bearer ada-token"), ("bob-plans", "Bearer bob-token")}
    sessions: dict[str, set[str | None]] = {}
    for request in mcp.log.requests:
        assert request.authorization in ("Bearer ada-token", "Bearer bob-token")
        if request.session_id is not None:
            sessions.setdefault(request.session_id, set()).add(request.authorization)
    assert sessions and all(len(seen) == 1 for seen in sessions.values())


async def test_a_user_without_an_mcp_credential_is_asked_to_connect_and_nothing_reaches_the_server(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    with serve_mcp("http", Behavior(tokens=frozenset({"ada-token"}))) as mcp:
        async with serve_assistant(pg_cluster, tmp_path, **user_mcp(mcp.url)) as served:
            await connect_mcp(served, await served.sign_in("ada"), "ada-token")
            response = await chat(
                served, await served.sign_in("bob"), str(uuid.uuid4()), [user_message("search plans")]
            )
    assert response.status_code == 403
    assert response.json()["code"] == "authorization_required"
    assert mcp.log.requests == []


async def test_the_connection_status_never_shows_the_token(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with serve_assistant(pg_cluster, tmp_path, **user_mcp("http://127.0.0.1:9/mcp")) as served:
        headers = await served.sign_in("ada")
        url = f"{served.url}/api/connections/mcp"
        before = await served.client.get(url, headers=headers)
        await connect_mcp(served, headers, "ada-secret-token")
        after = await served.client.get(url, headers=headers)
        other = await served.client.get(url, headers=await served.sign_in("bob"))
    assert before.json() == {"connected": False}
    assert after.json() == {"connected": True}
    assert other.json() == {"connected": False}
    assert "ada-secret-token" not in after.text


@pytest.mark.parametrize(
    "body", [{}, {"token": ""}, {"token": 42}, {"token": "two words"}, {"token": "x" * 4097}, ["ada-token"]]
)
async def test_a_bad_mcp_credential_is_refused_and_nothing_is_stored(
    pg_cluster: PostgresCluster, tmp_path: Path, body: Any
) -> None:
    async with serve_assistant(pg_cluster, tmp_path, **user_mcp("http://127.0.0.1:9/mcp")) as served:
        headers = await served.sign_in("ada")
        url = f"{served.url}/api/connections/mcp"
        refused = await served.client.put(url, json=body, headers=headers)
        status = await served.client.get(url, headers=headers)
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_input"
    assert status.json() == {"connected": False}


async def test_a_disconnected_user_is_asked_to_connect_again(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    with serve_mcp("http", Behavior(tokens=frozenset({"ada-token"}))) as mcp:
        async with serve_assistant(pg_cluster, tmp_path, **user_mcp(mcp.url)) as served:
            headers = await served.sign_in("ada")
            url = f"{served.url}/api/connections/mcp"
            await connect_mcp(served, headers, "ada-token")
            deleted = await served.client.delete(url, headers=headers)
            status = await served.client.get(url, headers=headers)
            response = await chat(served, headers, str(uuid.uuid4()), [user_message("search plans")])
    assert deleted.status_code == 204
    assert status.json() == {"connected": False}
    assert response.status_code == 403
    assert response.json()["code"] == "authorization_required"
    assert mcp.log.requests == []


async def test_a_credential_sealed_with_a_retired_key_asks_the_user_to_connect_again(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    with serve_mcp("http", Behavior(tokens=frozenset({"ada-token"}))) as mcp:
        async with serve_assistant(pg_cluster, tmp_path, **user_mcp(mcp.url)) as served:
            headers = await served.sign_in("ada")
            url = f"{served.url}/api/connections/mcp"
            await connect_mcp(served, headers, "ada-token")
            assert served.config.database_url is not None
            async with await psycopg.AsyncConnection.connect(served.config.database_url) as owner:
                await owner.execute("update bastion.credentials set key_id = 'retired'")
            unreadable = await served.client.get(url, headers=headers)
            refused = await chat(served, headers, str(uuid.uuid4()), [user_message("search plans")])
            await connect_mcp(served, headers, "ada-token")
            reconnected = await served.client.get(url, headers=headers)
            answered = await approved_search(served, headers, "plans")
    assert unreadable.status_code == 200
    assert unreadable.json() == {"connected": False}
    assert refused.status_code == 403
    assert refused.json()["code"] == "authorization_required"
    assert reconnected.json() == {"connected": True}
    assert answered.status_code == 200
    assert "doc-plans" in answered.text
    calls = [(call.arguments["query"], call.authorization) for call in mcp.log.tool_calls("search")]
    assert calls == [("plans", "Bearer ada-token")]


async def test_a_stored_mcp_credential_is_encrypted_at_rest(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with serve_assistant(pg_cluster, tmp_path, **user_mcp("http://127.0.0.1:9/mcp")) as served:
        await connect_mcp(served, await served.sign_in("ada"), "ada-plaintext-token")
        assert served.config.database_url is not None
        async with await psycopg.AsyncConnection.connect(served.config.database_url) as owner:
            cursor = await owner.execute("select * from bastion.credentials")
            rows = await cursor.fetchall()
    [row] = rows
    assert DevelopmentSignIn.user_id("ada") in {str(value) for value in row}
    stored = b"".join(value if isinstance(value, bytes) else str(value).encode() for value in row)
    assert b"ada-plaintext-token" not in stored


async def test_connection_routes_are_not_found_with_the_apps_credential(served: Served) -> None:
    headers = await served.sign_in("ada")
    url = f"{served.url}/api/connections/mcp"
    put = await served.client.put(url, json={"token": "ada-token"}, headers=headers)
    get = await served.client.get(url, headers=headers)
    assert (put.status_code, get.status_code) == (404, 404)
    assert put.json()["code"] == "not_found"


async def test_development_sign_in_refuses_a_foreign_host_name(served: Served) -> None:
    port = served.config.port
    rebound = await served.client.post(
        f"{served.url}/auth/dev/token", json={"user": "alice"}, headers={"Host": f"evil.example:{port}"}
    )
    assert rebound.status_code == 400
    assert rebound.json()["code"] == "invalid_host"
    assert "alice" not in rebound.text
    listed = await served.client.get(
        f"{served.url}/api/conversations",
        headers={**(await served.sign_in("alice")), "Host": f"evil.example:{port}"},
    )
    assert listed.status_code == 400


async def test_development_sign_in_needs_a_json_request(served: Served) -> None:
    response = await served.client.post(
        f"{served.url}/auth/dev/token", content=b'{"user": "alice"}', headers={"Content-Type": "text/plain"}
    )
    assert response.status_code == 400
    assert "application/json" in response.json()["message"]


async def test_the_page_cannot_be_framed(served: Served) -> None:
    page = await served.client.get(f"{served.url}/")
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


async def test_notes_are_saved_once_per_call_and_kept_apart_by_conversation_and_tenant(
    pg_cluster: PostgresCluster,
) -> None:
    database = pg_cluster.database("notes")
    await migrate(Database(app_conninfo=pg_cluster.dsn(database), admin_conninfo=pg_cluster.dsn(database)))
    pg_cluster.create_login_roles()
    user = str(uuid.uuid4())
    async with await PostgresStore.open(pg_cluster.dsn(database, user="bastion_app")) as store:
        home = PostgresNoteBook(store, StoreIdentity(user_id=user, tenant_id="home"))
        work = PostgresNoteBook(store, StoreIdentity(user_id=user, tenant_id="work"))
        first = await home.add("launch is Friday", idempotency_key="conversation-a:call_0")
        again = await home.add("launch is Friday", idempotency_key="conversation-a:call_0")
        other = await home.add("dentist on Monday", idempotency_key="conversation-b:call_0")
        elsewhere = await work.add("quarterly review", idempotency_key="conversation-a:call_0")
        assert again == first
        assert other["text"] == "dentist on Monday"
        assert [note["text"] for note in await home.list()] == ["dentist on Monday", "launch is Friday"]
        assert [note["text"] for note in await work.list()] == [elsewhere["text"]]


async def test_the_notes_tools_are_idempotent_and_a_save_is_keyed_by_its_operation() -> None:
    class Recorded:
        def __init__(self) -> None:
            self.keys: list[str] = []

        async def list(self) -> list[dict[str, Any]]:
            return []

        async def add(self, text: str, *, idempotency_key: str) -> dict[str, Any]:
            self.keys.append(idempotency_key)
            return {"id": "n1", "text": text, "created_at": "2026-01-01T00:00:00+00:00"}

    notes = Recorded()
    principal = Principal(
        id=str(uuid.uuid4()), role="authenticated", email=None, is_anonymous=False, aal=None,
        session_id=None, tenant_id=None, roles=(), claims={},
    )  # fmt: skip
    tools = {item.name: item for item in _local_tools(AssistantContext(principal, "c1", notes))}
    assert all(item.idempotent for item in tools.values())
    save = tools["save_note"]
    assert save.execute is not None
    key = "approval/0f3c"
    call = ToolCall(tool_name="save_note", input={"text": "launch"}, tool_call_id="call_0", operation_key=key)
    await save.execute(call)
    await save.execute(call)
    assert notes.keys == [key, key]


async def test_a_conversation_created_first_takes_its_first_message(served: Served) -> None:
    headers = await served.sign_in("ada")
    created = await served.client.post(
        f"{served.url}/api/conversations", json={"title": "Plans"}, headers=headers
    )
    conversation = created.json()["id"]
    response = await chat(served, headers, conversation, [user_message("hello")])
    assert response.status_code == 200
    listed = await served.client.get(f"{served.url}/api/conversations", headers=headers)
    assert [(c["id"], c["title"]) for c in listed.json()["conversations"]] == [(conversation, "Plans")]


async def test_a_chat_on_an_unknown_id_with_history_is_not_found(served: Served) -> None:
    headers = await served.sign_in("ada")
    history = [user_message("earlier"), user_message("now")]
    response = await chat(served, headers, str(uuid.uuid4()), history)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


# Bad input: a 400 naming the field and the rule, and nothing stored


def _malformed_chats() -> dict[str, tuple[dict[str, Any], str]]:
    def body(messages: list[Any], **fields: Any) -> dict[str, Any]:
        return {"id": str(uuid.uuid4()), "messages": messages, "trigger": "submit-message", **fields}

    hello = user_message("hello")
    return {
        "parts is 5": (body([hello | {"parts": 5}]), "messages[0].parts"),
        "parts is true": (body([hello | {"parts": True}]), "messages[0].parts"),
        "role is an object": (body([hello | {"role": {}}]), "messages[0].role"),
        "role is a list in a later message": (
            body([hello, user_message("x") | {"role": []}]),
            "messages[1].role",
        ),
        "role is system": (body([hello | {"role": "system"}]), "messages[0].role"),
        "trigger is an object": (body([hello], trigger={}), "trigger"),
        "trigger is a list": (body([hello], trigger=[]), "trigger"),
        "text is 5": (body([hello | {"parts": [{"type": "text", "text": 5}]}]), "messages[0].parts[0].text"),
        "empty parts": (body([hello | {"parts": []}]), "messages[0].parts"),
        "content instead of parts": (
            body([{"id": "m1", "role": "user", "content": "hi"}]),
            "messages[0].parts",
        ),
        "metadata on the first message": (
            body([hello | {"metadata": {"admin": True}}]),
            "messages[0].metadata",
        ),
        "a tool part in the first message": (
            body(
                [
                    hello
                    | {"parts": [{"type": "tool-save_note", "toolCallId": "c1", "state": "input-available"}]}
                ]
            ),
            "messages[0].parts[0].type",
        ),
        "id is not a UUID": (body([hello], id="conversation-1"), "id"),
    }


@pytest.mark.parametrize("case", list(_malformed_chats()))
async def test_a_malformed_chat_is_invalid_input_naming_the_field_and_stores_nothing(
    served: Served, case: str
) -> None:
    headers = await served.sign_in("ada")
    body, field = _malformed_chats()[case]
    response = await served.client.post(f"{served.url}/api/chat", json=body, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()
    assert (error["code"], error["field"]) == ("invalid_input", field)
    assert error["message"].startswith(field)
    listed = await served.client.get(f"{served.url}/api/conversations", headers=headers)
    assert listed.json()["conversations"] == []


@pytest.mark.parametrize(
    ("messages", "trigger"),
    [
        ([{"id": "a1", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]}], "submit-message"),
        ([user_message("hello")], "regenerate-message"),
    ],
    ids=["an assistant message", "the regenerate trigger"],
)
async def test_a_first_turn_that_is_not_a_new_user_message_is_not_found_and_stores_nothing(
    served: Served, messages: list[Any], trigger: str
) -> None:
    headers = await served.sign_in("ada")
    body = {"id": str(uuid.uuid4()), "messages": messages, "trigger": trigger}
    response = await served.client.post(f"{served.url}/api/chat", json=body, headers=headers)
    assert response.status_code == 404
    listed = await served.client.get(f"{served.url}/api/conversations", headers=headers)
    assert listed.json()["conversations"] == []


async def test_a_lone_approval_answer_still_continues_an_existing_conversation(served: Served) -> None:
    """The first-message check must not refuse a one-message window of a conversation that exists."""
    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    await chat(served, headers, conversation, [user_message("hello")])
    resent = await served.client.get(
        f"{served.url}/api/conversations/{conversation}/messages", headers=headers
    )
    [first, _] = resent.json()["messages"]
    response = await served.client.post(
        f"{served.url}/api/chat",
        json={"id": conversation, "messages": [first], "trigger": "regenerate-message"},
        headers=headers,
    )
    assert response.status_code == 200
    assert "offline demo model" in streamed_text(response)


async def test_too_long_titles_and_comments_name_the_field_and_the_limit(served: Served) -> None:
    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    await chat(served, headers, conversation, [user_message("hi")])
    url = f"{served.url}/api/conversations/{conversation}"
    renamed = await served.client.patch(url, json={"title": "t" * 501}, headers=headers)
    assert renamed.status_code == 400
    assert renamed.json() == {
        "code": "invalid_input",
        "message": "title: String should have at most 500 characters.",
        "field": "title",
    }
    messages = await served.client.get(f"{url}/messages", headers=headers)
    reply = messages.json()["messages"][-1]["id"]
    rated = await served.client.post(
        f"{url}/feedback", json={"message_id": reply, "rating": "up", "comment": "c" * 4001}, headers=headers
    )
    assert rated.status_code == 400
    assert rated.json()["field"] == "comment"
    assert rated.json()["message"] == "comment: String should have at most 4000 characters."


@pytest.mark.parametrize("comment", ["", "   "])
async def test_an_empty_feedback_comment_is_no_comment(served: Served, comment: str) -> None:
    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    await chat(served, headers, conversation, [user_message("hi")])
    url = f"{served.url}/api/conversations/{conversation}"
    reply = (await served.client.get(f"{url}/messages", headers=headers)).json()["messages"][-1]["id"]
    rated = await served.client.post(
        f"{url}/feedback", json={"message_id": reply, "rating": "down", "comment": comment}, headers=headers
    )
    assert rated.status_code == 201, rated.text
    assert rated.json()["comment"] is None


async def test_deeply_nested_json_says_so(served: Served) -> None:
    headers = await served.sign_in("ada")
    for body in (b"[" * 100_000, b'{"id": ' + b"[" * 100 + b"]" * 100 + b"}"):
        response = await served.client.post(
            f"{served.url}/api/chat", content=body, headers={**headers, "Content-Type": "application/json"}
        )
        assert response.status_code == 400
        assert response.json()["message"] == "The body nests arrays and objects deeper than 64 levels."


async def test_a_token_whose_subject_is_not_a_uuid_is_refused_alike_on_every_user_route(
    served: Served,
) -> None:
    import jwt

    from bastion.assistant.app import build_routes
    from bastion.assistant.server import development_sign_in

    signer = development_sign_in(served.config)
    ada = jwt.decode(
        (await served.sign_in("ada"))["Authorization"].split()[1], options={"verify_signature": False}
    )
    hostile = {
        "subject": ada | {"sub": "user_2abcDEF"},
        "tenant": ada | {"app_metadata": {"tenant_id": "t" * 201}},
    }

    user_routes = [route for route in build_routes(served.app) if route.auth == "user"]
    assert any("connections" in route.path for route in user_routes)
    for claims in hostile.values():
        token = jwt.encode(claims, signer._key, algorithm="ES256", headers={"kid": signer.kid})
        for route in user_routes:
            path = route.path.replace("{conversation_id}", str(uuid.uuid4()))
            response = await served.client.request(
                route.method, f"{served.url}{path}", json={}, headers={"Authorization": f"Bearer {token}"}
            )
            assert (route.path, response.status_code) == (route.path, 401)
            assert response.json()["code"] == "invalid_claims"


async def test_the_assistant_runs_its_turns_as_durable_workflows_and_closes_its_engine(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with serve_assistant(pg_cluster, tmp_path, durable=True) as served:
        headers = await served.sign_in("ada")
        conversation = str(uuid.uuid4())
        response = await chat(served, headers, conversation, [user_message("hello")])
        assert response.status_code == 200 and stream_types(response)[-1] == "finish"
        assert served.app.chat.durable is not None
        database = served.config.database_url
        assert database is not None
        with psycopg.connect(database) as conn:
            [(run_id,)] = conn.execute(
                "select id::text from bastion.runs where conversation_id = %s", (conversation,)
            ).fetchall()
            # The turn ran as its workflow: DBOS's row for it, which the store reads to know a run is
            # durable, ends SUCCESS.
            for _ in range(100):
                status = conn.execute(
                    "select status from dbos.workflow_status where workflow_uuid = %s",
                    (f"bastion.turn:{conversation}:{run_id}",),
                ).fetchone()
                if status == ("SUCCESS",):
                    break
                conn.commit()
                await asyncio.sleep(0.05)
            assert status == ("SUCCESS",)
        app_database = served.config.app_database_url
    assert app_database is not None
    # The engine was closed with the assistant: another can launch in this process.
    engine = await DurableEngine.launch(app_database)
    await engine.close()


def test_durable_turns_are_on_unless_switched_off() -> None:
    assert AssistantConfig.from_env({}).durable is True
    assert AssistantConfig.from_env({"BASTION_DURABLE": "off"}).durable is False
    with pytest.raises(ConfigError, match="BASTION_DURABLE must be on or off"):
        AssistantConfig.from_env({"BASTION_DURABLE": "maybe"})


def test_hooks_are_delivered_unless_switched_off() -> None:
    assert AssistantConfig.from_env({}).hooks is True
    assert AssistantConfig.from_env({"BASTION_HOOKS": "off"}).hooks is False
    with pytest.raises(ConfigError, match="BASTION_HOOKS must be on or off"):
        AssistantConfig.from_env({"BASTION_HOOKS": "maybe"})


async def test_an_assistant_with_hooks_off_serves_without_delivering_and_one_with_hooks_on_delivers(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    from bastion.hooks import chat_id_of

    async with serve_assistant(pg_cluster, tmp_path, hooks=False) as served:
        headers = await served.sign_in("ada")
        conversation = str(uuid.uuid4())
        assert (await chat(served, headers, conversation, [user_message("hello")])).status_code == 200
        admin = served.config.database_url
        assert admin is not None
        with psycopg.connect(admin) as conn:
            written = conn.execute(
                "select count(*) from bastion.hook_events where conversation_id = %s", (conversation,)
            ).fetchone()
            assert written is not None and written[0] > 0
            # No hook was ever registered here: nothing delivered, nothing will be from this process.
            assert conn.execute("select count(*) from bastion.hook_subscriptions").fetchone() == (0,)
        config = served.config
    # A process on the same database with hooks on (serving nothing here) copies what was written.
    async with running_assistant(dataclasses.replace(config, hooks=True, port=free_port())):
        for _ in range(600):
            with psycopg.connect(admin) as conn:
                copied = conn.execute(
                    "select r.status from bastion.ai_chats c join bastion.ai_runs r on r.chat_id = c.id"
                    " where c.id = %s",
                    (chat_id_of(conversation),),
                ).fetchall()
            if copied:
                break
            await asyncio.sleep(0.05)
    assert copied == [("completed",)]


# Hooks: the assistant's conversations reach the chat tables and its usage counter


async def test_a_chat_is_copied_into_the_chat_tables_and_counted_once_per_run(served: Served) -> None:
    from bastion.hooks import chat_id_of

    headers = await served.sign_in("ada")
    conversation = str(uuid.uuid4())
    assert (await chat(served, headers, conversation, [user_message("hello")])).status_code == 200
    admin = served.config.database_url
    assert admin is not None

    async def copied() -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(admin) as conn:
            cursor = await conn.execute(
                "select c.agent_id, c.current_leaf_id is not null, r.status, u.runs"
                " from bastion.ai_chats c join bastion.ai_runs r on r.chat_id = c.id"
                " join assistant.usage u on u.owner_id = c.owner_id where c.id = %s",
                (chat_id_of(conversation),),
            )
            return await cursor.fetchall()

    expected = [("assistant", True, "completed", 1)]
    for _ in range(600):
        if await copied() == expected:
            break
        await asyncio.sleep(0.05)
    assert await copied() == expected


async def test_the_assistant_schedules_its_retention(served: Served) -> None:
    """`bastion serve` prunes by itself: its process registers the cluster-wide retention schedule."""
    [schedule] = await DBOS.list_schedules_async(schedule_name_prefix="bastion.retention")
    assert (schedule["schedule"], schedule["status"]) == ("0 */10 * * * *", "ACTIVE")
