"""The assistant's support inbox served for real: a channel adapter's message over HTTP is answered by the
bot's durable job and collected back by the adapter; its users staff the inbox; the inbox's settings
are checked at startup."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bastion.assistant.config import AssistantConfig, ConfigError
from tests.pg import PostgresCluster
from tests.test_assistant import serve_assistant

SECRET = "assistant-inbox-secret-0123"


async def test_a_webhook_message_is_answered_by_the_bot_and_collected_by_the_adapter(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    async with serve_assistant(pg_cluster, tmp_path, inbox_secret=SECRET) as served:
        webhook = f"{served.url}/v1/inbox/channels/webhook/messages"
        body = {"contact": {"id": "+4912345", "name": "Vera"}, "message": {"id": "wa-1", "text": "Hello"}}
        forged = await served.client.post(webhook, json=body, headers={"Authorization": "Bearer guess"})
        assert forged.status_code == 401
        delivered = await served.client.post(
            webhook, json=body, headers={"Authorization": f"Bearer {SECRET}"}
        )
        assert delivered.status_code == 200 and delivered.json()["duplicate"] is False
        collected: list[dict[str, object]] = []
        for _ in range(300):
            response = await served.client.get(webhook, headers={"Authorization": f"Bearer {SECRET}"})
            collected = response.json()["messages"]
            if collected:
                break
            await asyncio.sleep(0.05)
        [reply] = collected
        assert reply["author"] == "bot" and reply["contact_id"] == "+4912345"
        assert "You said: “Hello”" in str(reply["text"])
        staff = await served.sign_in("sam")
        listed = await served.client.get(f"{served.url}/v1/inbox/conversations", headers=staff)
        assert [(c["contact_name"], c["bot_mode"]) for c in listed.json()["conversations"]] == [
            ("Vera", "bot")
        ]


def test_the_inbox_secrets_must_be_long_enough(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="BASTION_INBOX_SECRET"):
        AssistantConfig.from_env({"BASTION_INBOX_SECRET": "short", "BASTION_DATA_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="BASTION_INBOX_TOKEN_SECRET"):
        AssistantConfig.from_env({"BASTION_INBOX_TOKEN_SECRET": "short", "BASTION_DATA_DIR": str(tmp_path)})
