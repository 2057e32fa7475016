"""The inbox's routes: the channel webhook (constant-time bearer secret, idempotent per message id, a
forged secret is 401 and stores nothing), the widget's contact token (one conversation per token) and
the staff's routes (their tenant only)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx2
import psycopg
import pytest

from bastion.auth import SupabaseEnv
from bastion.inbox import (
    INBOX_STAFF_ROLE,
    ContactPrincipal,
    ContactTokens,
    InboxChannel,
    InboxChannels,
    PostgresInbox,
    inbox_routes,
)
from bastion.worker import create_agent_worker
from tests.inbox_db import InboxDatabase, new_tenant, staff_of
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"


@dataclass
class Api:
    http: httpx2.AsyncClient
    keys: SigningKeys
    env: SupabaseEnv
    tenant: str
    other: str
    channel: InboxChannel
    other_channel: InboxChannel

    def staff(self, tenant: str | None, *, named: bool = True) -> dict[str, str]:
        """A token of a signed-in user of `tenant`, naming them inbox staff unless `named` is false."""
        identity = staff_of(tenant)
        app_metadata: dict[str, object] = {"tenant_id": tenant} if tenant else {}
        if named:
            app_metadata["roles"] = [INBOX_STAFF_ROLE]
        claims = user_claims(self.env.issuer, time.time(), sub=identity.user_id, app_metadata=app_metadata)
        return {"Authorization": f"Bearer {es256(self.keys, claims)}"}

    async def deliver(
        self, text: str, *, message_id: str, secret: str | None = None, contact: str = "ada"
    ) -> httpx2.Response:
        headers = {"Authorization": f"Bearer {secret or self.channel.secret}"}
        body = {
            "contact": {"id": contact, "name": contact.title()},
            "message": {"id": message_id, "text": text},
        }
        return await self.http.post("/api/inbox/channels/chat/messages", json=body, headers=headers)


@pytest.fixture
async def api(inbox: PostgresInbox) -> AsyncIterator[Api]:
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    tenant, other = new_tenant(), new_tenant()
    channel = InboxChannel(name="chat", tenant_id=tenant, secret=f"chat-secret-{tenant}")
    other_channel = InboxChannel(name="sms", tenant_id=other, secret=f"sms-secret-{other}")
    routes = inbox_routes(
        inbox,
        channels=InboxChannels([channel, other_channel]),
        tokens=ContactTokens(b"contact-token-secret-of-32-bytes!"),
        widget_tenant=tenant,
    )
    app = create_agent_worker(env=env, routes=routes)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
        yield Api(http, keys, env, tenant, other, channel, other_channel)


def _stored(database: InboxDatabase, tenant: str) -> tuple[int, int, int]:
    with psycopg.connect(database.admin_dsn) as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(f"select count(*) from bastion.{table} where tenant_id = %s", (tenant,)).fetchone()[
                0
            ]
            for table in ("inbox_contacts", "inbox_conversations", "inbox_messages")
        )


async def test_a_forged_webhook_secret_is_401_and_stores_nothing(
    api: Api, inbox_database: InboxDatabase
) -> None:
    attempts = [
        {"Authorization": "Bearer not-the-secret-at-all"},
        {"Authorization": f"Bearer {api.channel.secret}x"},
        {"Authorization": f"Bearer {api.other_channel.secret}"},
        {"Authorization": api.channel.secret},
        {},
    ]
    body = {"contact": {"id": "mallory"}, "message": {"id": "m1", "text": "Hello"}}
    for headers in attempts:
        response = await api.http.post("/api/inbox/channels/chat/messages", json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["code"] == "invalid_channel_secret"
    missing = await api.http.post(
        "/api/inbox/channels/nowhere/messages",
        json=body,
        headers={"Authorization": f"Bearer {api.channel.secret}"},
    )
    assert missing.status_code == 401
    assert _stored(inbox_database, api.tenant) == (0, 0, 0)
    assert _stored(inbox_database, api.other) == (0, 0, 0)


async def test_the_webhook_stores_a_message_once_per_id(api: Api, inbox_database: InboxDatabase) -> None:
    first = await api.deliver("Where is my order?", message_id="wa-1")
    again = await api.deliver("Where is my order?", message_id="wa-1")
    assert first.status_code == again.status_code == 200
    assert first.json()["duplicate"] is False and again.json()["duplicate"] is True
    assert again.json()["message_id"] == first.json()["message_id"]
    assert _stored(inbox_database, api.tenant) == (1, 1, 1)
    listed = await api.http.get("/api/inbox/conversations", headers=api.staff(api.tenant))
    assert [(c["contact_name"], c["preview"], c["bot_mode"]) for c in listed.json()["conversations"]] == [
        ("Ada", "Where is my order?", "bot")
    ]


async def test_a_signed_in_user_of_the_tenant_staffs_nothing_unless_the_token_names_them(api: Api) -> None:
    delivered = await api.deliver("My card number is private", message_id="wa-secret")
    path = f"/api/inbox/conversations/{delivered.json()['conversation_id']}"
    member = api.staff(api.tenant, named=False)
    for method, url, body in (
        ("GET", "/api/inbox/conversations", None),
        ("GET", path, None),
        ("PUT", f"{path}/mode", {"bot_mode": "human"}),
        ("POST", f"{path}/messages", {"text": "I only signed up."}),
    ):
        refused = await api.http.request(method, url, json=body, headers=member)
        assert refused.status_code == 403 and refused.json()["code"] == "not_inbox_staff", (method, url)
    detail = await api.http.get(path, headers=api.staff(api.tenant))
    assert [m["author"] for m in detail.json()["messages"]] == ["contact"]
    assert detail.json()["conversation"]["bot_mode"] == "bot"


async def test_a_message_id_delivered_again_on_another_thread_stores_nothing_new(
    api: Api, inbox: PostgresInbox, inbox_database: InboxDatabase
) -> None:
    headers = {"Authorization": f"Bearer {api.channel.secret}"}
    url = "/api/inbox/channels/chat/messages"
    first = {"contact": {"id": "ada"}, "message": {"id": "wa-7", "text": "Refund order 12"}}
    again = first | {"thread_id": "another-thread"}
    stranger = {"contact": {"id": "eve"}, "message": {"id": "wa-7", "text": "Refund order 99"}}
    stored = await api.http.post(url, json=first, headers=headers)
    replays = [await api.http.post(url, json=body, headers=headers) for body in (again, stranger)]
    assert stored.status_code == 200 and stored.json()["duplicate"] is False
    for replay in replays:
        assert replay.status_code == 200 and replay.json() == stored.json() | {"duplicate": True}
    # One contact, one conversation, one message: nothing of the other threads was written.
    assert _stored(inbox_database, api.tenant) == (1, 1, 1)
    # The same id on another channel of the tenant is another message.
    other = InboxChannel(name="sms", tenant_id=api.tenant, secret=f"sms-secret-{api.tenant}")
    elsewhere = await inbox.record_inbound(
        other, thread_id="ada", contact_id="ada", text="Hi", external_id="wa-7"
    )
    assert elsewhere.duplicate is False


async def test_bad_webhook_input_is_a_400_that_stores_nothing(
    api: Api, inbox_database: InboxDatabase
) -> None:
    for text in ("", "x" * 8001):
        response = await api.deliver(text, message_id="m-bad")
        assert response.status_code == 400
        assert response.json()["code"] == "invalid_input"
    assert _stored(inbox_database, api.tenant) == (0, 0, 0)


async def test_a_contact_token_reaches_one_conversation(api: Api) -> None:
    ada = (await api.http.post("/api/inbox/widget/conversations", json={"name": "Ada"})).json()
    bob = (await api.http.post("/api/inbox/widget/conversations", json={"name": "Bob"})).json()
    as_ada = {"Authorization": f"Bearer {ada['token']}"}
    as_bob = {"Authorization": f"Bearer {bob['token']}"}
    sent = await api.http.post(
        "/api/inbox/widget/messages", json={"text": "I am Ada", "client_message_id": "a1"}, headers=as_ada
    )
    assert sent.status_code == 200 and sent.json()["duplicate"] is False
    await api.http.post("/api/inbox/widget/messages", json={"text": "I am Bob"}, headers=as_bob)
    mine = await api.http.get("/api/inbox/widget/messages", headers=as_ada)
    assert mine.json()["bot_mode"] == "bot"
    assert [m["text"] for m in mine.json()["messages"]] == ["I am Ada"]
    # Bob's payload under Ada's signature, a user's token, nothing: none of them is a contact token.
    forged = bob["token"].split(".")[0] + "." + ada["token"].split(".")[1]
    for headers in (
        {"Authorization": f"Bearer {forged}"},
        {"Authorization": "Bearer ñ.abcd".encode()},
        api.staff(api.tenant),
        {},
    ):
        response = await api.http.get("/api/inbox/widget/messages", headers=headers)
        assert response.status_code == 401
        assert response.json()["code"] == "invalid_contact_token"
    # A contact token is not a staff member's session either.
    assert (await api.http.get("/api/inbox/conversations", headers=as_ada)).status_code == 401


async def test_staff_take_over_reply_and_hand_back_in_their_tenant_only(api: Api) -> None:
    delivered = (await api.deliver("Hello", message_id="m1")).json()
    path = f"/api/inbox/conversations/{delivered['conversation_id']}"
    staff = api.staff(api.tenant)
    for outsider in (api.staff(api.other), api.staff(None)):
        assert (await api.http.get(path, headers=outsider)).status_code == 404
        refused = await api.http.put(f"{path}/mode", json={"bot_mode": "human"}, headers=outsider)
        assert refused.status_code == 404
    taken = await api.http.put(f"{path}/mode", json={"bot_mode": "human"}, headers=staff)
    assert taken.status_code == 200 and taken.json()["bot_mode"] == "human"
    replied = await api.http.post(f"{path}/messages", json={"text": "A person here."}, headers=staff)
    assert replied.status_code == 201 and replied.json()["author"] == "staff"
    back = await api.http.put(f"{path}/mode", json={"bot_mode": "bot"}, headers=staff)
    assert back.json()["bot_mode"] == "bot"
    bad = await api.http.put(f"{path}/mode", json={"bot_mode": "robot"}, headers=staff)
    assert bad.status_code == 400 and bad.json()["field"] == "bot_mode"
    detail = (await api.http.get(path, headers=staff)).json()
    assert [(m["author"], m["text"]) for m in detail["messages"]] == [
        ("contact", "Hello"),
        ("staff", "A person here."),
    ]


async def test_the_adapter_collects_what_the_bot_and_staff_wrote(api: Api, inbox: PostgresInbox) -> None:
    delivered = (await api.deliver("Hello", message_id="m1")).json()
    contact = ContactPrincipal(
        tenant_id=api.tenant,
        contact_id=(
            await inbox.get_conversation(staff_of(api.tenant), delivered["conversation_id"])
        ).contact_id,
        conversation_id=delivered["conversation_id"],
    )
    await inbox.post_bot_reply(contact, delivered["message_id"], "Hi, I am the bot.", job_id="j1")
    path = f"/api/inbox/conversations/{delivered['conversation_id']}/messages"
    await api.http.post(path, json={"text": "And I am staff."}, headers=api.staff(api.tenant))
    secret = {"Authorization": f"Bearer {api.channel.secret}"}
    collected = await api.http.get("/api/inbox/channels/chat/messages", headers=secret)
    items = collected.json()["messages"]
    assert [(m["author"], m["text"], m["thread_id"], m["contact_id"]) for m in items] == [
        ("bot", "Hi, I am the bot.", "ada", "ada"),
        ("staff", "And I am staff.", "ada", "ada"),
    ]
    after = await api.http.get(
        "/api/inbox/channels/chat/messages", params={"after": items[0]["seq"]}, headers=secret
    )
    assert [m["text"] for m in after.json()["messages"]] == ["And I am staff."]
    other = {"Authorization": f"Bearer {api.other_channel.secret}"}
    assert (await api.http.get("/api/inbox/channels/sms/messages", headers=other)).json()["messages"] == []
    refused = await api.http.get("/api/inbox/channels/chat/messages", headers=other)
    assert refused.status_code == 401


async def test_a_channel_secret_and_a_contact_token_are_each_checked_once_per_request(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route's authorize hook verifies them before the body is read; the handler uses what it verified."""
    checks: list[str] = []
    authenticate, verify = InboxChannels.authenticate, ContactTokens.verify

    def counted_authenticate(self: InboxChannels, name: object, secret: str | None) -> InboxChannel:
        checks.append("channel")
        return authenticate(self, name, secret)

    def counted_verify(self: ContactTokens, token: object) -> ContactPrincipal:
        checks.append("contact")
        return verify(self, token)

    monkeypatch.setattr(InboxChannels, "authenticate", counted_authenticate)
    monkeypatch.setattr(ContactTokens, "verify", counted_verify)
    assert (await api.deliver("Hello", message_id="once-1")).status_code == 200
    headers = {"Authorization": f"Bearer {api.channel.secret}"}
    assert (await api.http.get("/api/inbox/channels/chat/messages", headers=headers)).status_code == 200
    assert checks == ["channel", "channel"]
    opened = (await api.http.post("/api/inbox/widget/conversations", json={"name": "Ada"})).json()
    as_ada = {"Authorization": f"Bearer {opened['token']}"}
    checks.clear()
    assert (
        await api.http.post("/api/inbox/widget/messages", json={"text": "Hi"}, headers=as_ada)
    ).status_code == 200
    assert (await api.http.get("/api/inbox/widget/messages", headers=as_ada)).status_code == 200
    assert checks == ["contact", "contact"]
