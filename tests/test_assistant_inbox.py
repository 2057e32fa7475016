"""The assistant's support inbox served for real: a channel adapter's message over HTTP is answered by the
bot's durable job and collected back by the adapter; its users named staff (as development sign-in
names them) staff the inbox, no other; the inbox's settings are checked at startup."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import jwt
import pytest

from bastion.assistant.config import AssistantConfig, ConfigError
from bastion.assistant.dev_auth import DevelopmentSignIn
from bastion.assistant.support import INBOX_TENANT, inbox_staff
from bastion.auth import Principal
from bastion.inbox import INBOX_STAFF_ROLE
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


def test_only_users_whose_token_names_them_staff_the_assistants_inbox() -> None:
    def principal(*, roles: tuple[str, ...], tenant: str | None = None, anonymous: bool = False) -> Principal:
        return Principal(
            id=str(uuid.uuid4()),
            role="authenticated",
            email=None,
            is_anonymous=anonymous,
            aal="aal1",
            session_id=None,
            tenant_id=tenant,
            roles=roles,
            claims={"aud": "authenticated"},
        )

    assert inbox_staff(principal(roles=())) is None
    assert inbox_staff(principal(roles=("member",), tenant="acme")) is None
    assert inbox_staff(principal(roles=(INBOX_STAFF_ROLE,), anonymous=True)) is None
    named = inbox_staff(principal(roles=(INBOX_STAFF_ROLE,)))
    assert named is not None and named.tenant_id == INBOX_TENANT
    own = inbox_staff(principal(roles=(INBOX_STAFF_ROLE,), tenant="acme"))
    assert own is not None and own.tenant_id == "acme"


def test_development_sign_in_names_its_users_inbox_staff(tmp_path: Path) -> None:
    sign_in = DevelopmentSignIn(data_dir=tmp_path, issuer="http://127.0.0.1:8000/auth/v1")
    claims = jwt.decode(sign_in.issue_token("sam"), options={"verify_signature": False})
    assert claims["app_metadata"]["roles"] == [INBOX_STAFF_ROLE]
    assert sign_in.user("sam")["app_metadata"]["roles"] == [INBOX_STAFF_ROLE]
