"""The assistant remembers across conversations (demo model, real HTTP, real Postgres), and its memory
routes list and forget only the caller's own memories."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from bastion.assistant.config import AssistantConfig, ConfigError, resolve_embedder
from bastion.assistant.server import running_assistant
from bastion.memory import OpenAIEmbedder, apply_memory_migrations
from bastion.memory.postgres import MAX_QUERY_LENGTH
from bastion.memory.provider import RECALL_QUERY_LENGTH
from bastion.stores import apply_migrations
from tests.pg import PostgresCluster
from tests.test_assistant import Served, chat, free_port, serve_assistant, streamed_text, user_message


@pytest.fixture
async def served(pg_cluster: PostgresCluster, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve_assistant(pg_cluster, tmp_path) as running:
        yield running


async def test_a_name_told_in_one_conversation_is_recalled_in_a_new_one_and_only_for_its_owner(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    ada, bob = await served.sign_in("ada"), await served.sign_in("bob")
    told = await chat(served, ada, str(uuid.uuid4()), [user_message("my name is Ada")])
    assert told.status_code == 200
    assert '"toolName":"remember"' in told.text

    asked = await chat(served, ada, str(uuid.uuid4()), [user_message("what is my name?")])
    assert "Your name is Ada" in streamed_text(asked)
    # A message longer than a recall query may be (a pasted document) recalls for its opening.
    pasted = "what is my name? " + "Here is the report. " * 500
    assert len(pasted) > MAX_QUERY_LENGTH > RECALL_QUERY_LENGTH
    asked_at_length = await chat(served, ada, str(uuid.uuid4()), [user_message(pasted)])
    assert "Your name is Ada" in streamed_text(asked_at_length)
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
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
    assert "^" not in malformed.json()["message"]  # no regular expression
    assert (await served.client.get(f"{served.url}/api/memories")).status_code == 401


async def test_expired_memory_operation_records_are_purged_when_the_assistant_starts(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    name = pg_cluster.database("assistant")
    admin = pg_cluster.dsn(name)
    await apply_migrations(admin)
    await apply_memory_migrations(admin)
    pg_cluster.create_login_roles()
    owner = str(uuid.uuid4())
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(
            "insert into bastion.memory_documents (owner_id, scope, path, content, expires_at) values "
            "(%s, 'bastion-ops', 'recall/assistant/old', '{}', now() - interval '1 minute'), "
            "(%s, 'bastion-ops', 'recall/assistant/live', '{}', now() + interval '1 day')",
            (owner, owner),
        )
    config = AssistantConfig(
        port=free_port(),
        data_dir=tmp_path,
        database_url=admin,
        app_database_url=pg_cluster.dsn(name, user="bastion_app"),
    )
    async with running_assistant(config):
        pass
    async with await psycopg.AsyncConnection.connect(admin) as conn:
        paths = await (await conn.execute("select path from bastion.memory_documents")).fetchall()
    assert paths == [("recall/assistant/live",)]


def test_an_embeddings_endpoint_is_configured_by_model_dimensions_and_address() -> None:
    config = AssistantConfig.from_env(
        {
            "BASTION_EMBEDDING_MODEL": "text-embedding-3-small",
            "BASTION_EMBEDDING_DIMENSIONS": "1536",
            "BASTION_EMBEDDING_BASE_URL": "http://127.0.0.1:11434/v1",
        }
    )
    embedder = resolve_embedder(config)
    assert isinstance(embedder, OpenAIEmbedder)
    assert (embedder.model, embedder.dimensions) == ("text-embedding-3-small", 1536)
    assert resolve_embedder(AssistantConfig.from_env({})) is None


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"BASTION_EMBEDDING_MODEL": "text-embedding-3-small"}, "needs BASTION_EMBEDDING_DIMENSIONS"),
        ({"BASTION_EMBEDDING_DIMENSIONS": "384"}, "need BASTION_EMBEDDING_MODEL"),
        ({"BASTION_EMBEDDING_MODEL": "m", "BASTION_EMBEDDING_DIMENSIONS": "x"}, "positive whole number"),
    ],
)
def test_bad_embedding_settings_name_the_variable(environ: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        AssistantConfig.from_env(environ)


def test_the_embedding_api_key_stays_out_of_the_config_repr() -> None:
    config = AssistantConfig.from_env(
        {
            "BASTION_EMBEDDING_MODEL": "m",
            "BASTION_EMBEDDING_DIMENSIONS": "8",
            "BASTION_EMBEDDING_API_KEY": "sk-x",
        }
    )
    assert "sk-x" not in repr(config)
