"""The assistant remembers across conversations (demo model, real HTTP, real Postgres), and its memory
routes list and forget only the caller's own memories."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.pg import PostgresCluster
from tests.test_assistant import Served, chat, serve_assistant, streamed_text, user_message


@pytest.fixture
async def served(pg_cluster: PostgresCluster, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve_assistant(pg_cluster, tmp_path) as running:
        yield running


async def test_a_name_told_in_one_conversation_is_recalled_in_a_new_one_and_only_for_its_owner(
    served: Served,
) -> None:
    ada, bob = await served.sign_in("ada"), await served.sign_in("bob")
    told = await chat(served, ada, str(uuid.uuid4()), [user_message("my name is Ada")])
    assert told.status_code == 200
    assert '"toolName":"remember"' in told.text

    asked = await chat(served, ada, str(uuid.uuid4()), [user_message("what is my name?")])
    assert "Your name is Ada" in streamed_text(asked)
    other = await chat(served, bob, str(uuid.uuid4()), [user_message("what is my name?")])
    assert "I don't know your name yet" in streamed_text(other)


async def test_memories_are_listed_and_forgotten_by_their_owner_only(served: Served) -> None:
    ada, bob = await served.sign_in("ada"), await served.sign_in("bob")
    await chat(served, ada, str(uuid.uuid4()), [user_message("call me Countess")])
    listed = await served.client.get(f"{served.url}/api/memories", headers=ada)
    [memory] = listed.json()["memories"]
    assert memory["text"] == "The user's name is Countess." and memory["source"] == "tool"
    assert (await served.client.get(f"{served.url}/api/memories", headers=bob)).json() == {"memories": []}

    url = f"{served.url}/api/memories/{memory['id']}"
    refused = await served.client.delete(url, headers=bob)
    assert (refused.status_code, refused.json()["code"]) == (404, "not_found")
    assert (await served.client.get(f"{url}/history", headers=bob)).status_code == 404
    history = await served.client.get(f"{url}/history", headers=ada)
    assert [v["text"] for v in history.json()["versions"]] == ["The user's name is Countess."]
    assert (await served.client.delete(url, headers=ada)).status_code == 204
    assert (await served.client.get(f"{served.url}/api/memories", headers=ada)).json() == {"memories": []}

    asked = await chat(served, ada, str(uuid.uuid4()), [user_message("what is my name?")])
    assert "I don't know your name yet" in streamed_text(asked)


async def test_a_malformed_memory_id_is_a_400_and_no_token_a_401(served: Served) -> None:
    ada = await served.sign_in("ada")
    malformed = await served.client.delete(f"{served.url}/api/memories/not-a-uuid", headers=ada)
    assert (malformed.status_code, malformed.json()["code"]) == (400, "invalid_input")
    assert (await served.client.get(f"{served.url}/api/memories")).status_code == 401
