"""The assistant with `BASTION_MCP_AUTH=oauth`: a user signs in to the MCP server from the conversation (the
Connect card), the server sends the browser back to the assistant's callback page, and the paused turn
continues with the server's tool; the user's connections are listed and can be disconnected."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx2
import pytest

from bastion.assistant.config import AssistantConfig, ConfigError
from tests.ai_sdk import ai_sdk_dir
from tests.oauth_servers import SCOPE, OAuthServers, serve_oauth
from tests.pg import PostgresCluster
from tests.scripted import Call, ScriptedModel
from tests.test_assistant import (
    Served,
    chat,
    chromium_path,
    serve_assistant,
    stream_chunks,
    user_message,
)


@pytest.fixture(scope="module")
def servers() -> Iterator[OAuthServers]:
    with serve_oauth() as running:
        yield running


def oauth_settings(servers: OAuthServers) -> dict[str, Any]:
    return {"mcp_url": servers.mcp_url, "mcp_tools": ("search",), "mcp_auth": "oauth"}


async def stored(served: Served, headers: dict[str, str], conversation: str) -> list[dict[str, Any]]:
    response = await served.client.get(
        f"{served.url}/api/conversations/{conversation}/messages", headers=headers
    )
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def answered(messages: list[dict[str, Any]], approved: bool = True) -> list[dict[str, Any]]:
    answer = json.loads(json.dumps(messages))
    [part] = [p for p in answer[-1]["parts"] if p.get("state") == "approval-requested"]
    part["state"] = "approval-responded"
    part["approval"]["approved"] = approved
    return answer


@pytest.mark.parametrize("durable", [False, True])
async def test_a_user_connects_from_the_conversation_and_the_turn_goes_on_with_the_servers_tool(
    pg_cluster: PostgresCluster, tmp_path: Path, servers: OAuthServers, durable: bool
) -> None:
    settings = {**oauth_settings(servers), "durable": durable}
    async with serve_assistant(pg_cluster, tmp_path, **settings) as served:
        served.app.active_model = ScriptedModel(
            [Call("connect_mcp", {})], [Call("mcp__search", {"query": "pricing"})], ["The pricing page."]
        )
        ada = await served.sign_in("ada")
        listed = await served.client.get(f"{served.url}/api/connections", headers=ada)
        assert listed.json()["connections"][0]["status"] == "not_connected"
        conversation = str(uuid.uuid4())
        paused = await chat(served, ada, conversation, [user_message("search the pricing page")])
        [card] = [c["toolMetadata"]["authorization"] for c in stream_chunks(paused) if "toolMetadata" in c]
        assert card["connection"] == "mcp"

        async with httpx2.AsyncClient() as browser:
            at_server = await browser.get(card["url"])
            back = at_server.headers["location"]
            assert back.startswith(f"{served.url}/connections/mcp/callback?")
            page = await browser.get(back, headers={"accept": "text/html"})
        assert page.status_code == 200 and "<html" in page.text.lower()
        query = {key: values[0] for key, values in parse_qs(urlparse(back).query).items()}
        done = await served.client.post(
            f"{served.url}/api/connections/mcp/oauth/callback",
            json={"state": query["state"], "code": query["code"]},
            headers=ada,
        )
        assert (done.status_code, done.json()["status"], done.json()["scopes"]) == (200, "connected", [SCOPE])

        connected = await chat(served, ada, conversation, answered(await stored(served, ada, conversation)))
        assert {"connection": "mcp", "connected": True} in [
            c.get("output") for c in stream_chunks(connected) if c["type"] == "tool-output-available"
        ]
        assert "tool-approval-request" in [c["type"] for c in stream_chunks(connected)]  # the search's own
        searched = await chat(served, ada, conversation, answered(await stored(served, ada, conversation)))
        outputs = [c["output"] for c in stream_chunks(searched) if c["type"] == "tool-output-available"]
        assert outputs == [{"result": "found: pricing"}]
        assert "The pricing page." in searched.text

        bob = await served.sign_in("bob")
        theirs = await served.client.get(f"{served.url}/api/connections", headers=bob)
        assert theirs.json()["connections"][0]["status"] == "not_connected"
        gone = await served.client.delete(f"{served.url}/api/connections/mcp/oauth", headers=ada)
        assert gone.status_code == 204
        after = await served.client.get(f"{served.url}/api/connections", headers=ada)
        assert after.json()["connections"][0]["status"] == "not_connected"


def test_oauth_sign_in_needs_the_servers_url() -> None:
    with pytest.raises(ConfigError, match="BASTION_MCP_AUTH=oauth needs BASTION_MCP_URL"):
        AssistantConfig.from_env({"BASTION_MCP_AUTH": "oauth"})


async def run_connect_flow(served: Served, shots: Path, phase: str) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        "node",
        "connect-flow.mjs",
        cwd=ai_sdk_dir(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    request = {"url": f"{served.url}/", "chromium": chromium_path(), "shots": str(shots), "phase": phase}
    stdout, stderr = await asyncio.wait_for(process.communicate(json.dumps(request).encode()), timeout=50)
    assert process.returncode == 0, stderr.decode()[-3000:]
    seen = json.loads(stdout)
    steps: dict[str, Any] = seen["steps"]
    assert "failure" not in steps, steps["failure"]
    assert (seen["pageErrors"], seen["consoleErrors"]) == ([], [])
    return steps


async def test_the_page_connects_from_the_card_and_the_turn_goes_on_by_itself(
    pg_cluster: PostgresCluster, tmp_path: Path, servers: OAuthServers
) -> None:
    chromium_path()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with serve_assistant(pg_cluster, tmp_path, **oauth_settings(servers)) as served:
        served.app.active_model = ScriptedModel(
            [Call("connect_mcp", {})], [Call("mcp__search", {"query": "pricing"})], ["The pricing page."]
        )
        steps = await run_connect_flow(served, shots, "connect")
    card = {"title": "Connect mcp", "status": "Needs you to sign in", "button": "Connect mcp"}
    assert steps["card"] == card
    assert steps["callback"]["path"] == "/connections/mcp/callback"
    assert steps["callback"]["search"] == ""  # the code and state left the address at once
    assert steps["callback"]["outcome"] == "mcp is connected. You can close this window."
    assert steps["answer"] == "The pricing page."
    assert "Connected" in steps["list"] and SCOPE in steps["list"]
    assert "Not connected" in steps["disconnected"]


async def test_a_sign_in_the_server_refuses_is_said_on_the_page_and_the_assistant_is_told(
    pg_cluster: PostgresCluster, tmp_path: Path, servers: OAuthServers
) -> None:
    chromium_path()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    model = ScriptedModel([Call("connect_mcp", {})], ["Without it, I cannot search."])
    servers.authorization.refuse_sign_in = True
    try:
        async with serve_assistant(pg_cluster, tmp_path, **oauth_settings(servers)) as served:
            served.app.active_model = model
            steps = await run_connect_flow(served, shots, "refused")
    finally:
        servers.authorization.refuse_sign_in = False
    refusal = "The mcp connection was not authorized."
    assert steps["callback"] == f"mcp was not connected: {refusal}"
    assert steps["card"] == f"mcp was not connected: {refusal}"
    assert steps["status"] == "Not connected"
    assert f"The user denied this tool call. Reason: {refusal}" in str(model.requests[-1].messages[-1])


async def test_a_card_shown_again_to_a_user_connected_meanwhile_goes_on_by_itself(
    pg_cluster: PostgresCluster, tmp_path: Path, servers: OAuthServers
) -> None:
    chromium_path()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    async with serve_assistant(pg_cluster, tmp_path, **oauth_settings(servers)) as served:
        served.app.active_model = ScriptedModel(
            [Call("connect_mcp", {})], [Call("mcp__search", {"query": "pricing"})], ["The pricing page."]
        )
        steps = await run_connect_flow(served, shots, "later")
    assert steps["callback"] == "mcp is connected. You can close this window."
    assert steps["cards"] == [["connect_mcp", "output-available"], ["mcp__search", "approval-requested"]]
