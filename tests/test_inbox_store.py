"""The inbox's tables under row-level security: staff of a tenant see its inbox, a contact only its own
conversation (through the store and in SQL as the contact's role), nobody else anything; intake is
idempotent per external id; a change of mode drops the reply jobs of earlier messages; the bot's reply
posts once."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from bastion.inbox import ContactPrincipal, InboundMessage, PostgresInbox, ThreadConflictError
from bastion.stores import NotFoundError
from tests.hooks_db import as_user
from tests.inbox_db import InboxDatabase, as_contact, channel_of, new_tenant, staff_of


async def _inbound(
    inbox: PostgresInbox,
    tenant: str,
    *,
    contact: str = "ada",
    text: str = "Hello",
    external: str | None = None,
):
    return await inbox.record_inbound(
        channel_of(tenant),
        thread_id=f"thread-{contact}",
        contact_id=contact,
        contact_name=contact.title(),
        text=text,
        external_id=external or uuid.uuid4().hex,
    )


def _principal(tenant: str, inbound: InboundMessage) -> ContactPrincipal:
    return ContactPrincipal(
        tenant_id=tenant, contact_id=inbound.contact_id, conversation_id=inbound.conversation_id
    )


async def test_a_redelivered_channel_message_is_stored_once(inbox: PostgresInbox) -> None:
    tenant = new_tenant()
    first = await _inbound(inbox, tenant, external="m-1")
    again = await _inbound(inbox, tenant, external="m-1")
    assert not first.duplicate and first.routed
    assert again.duplicate and not again.routed
    assert again.message_id == first.message_id
    messages = await inbox.list_messages(staff_of(tenant), first.conversation_id)
    assert [(m.author, m.body) for m in messages] == [("contact", "Hello")]


async def test_staff_see_only_their_tenants_inbox(inbox: PostgresInbox) -> None:
    tenant, other = new_tenant(), new_tenant()
    mine = await _inbound(inbox, tenant)
    await _inbound(inbox, other)
    listed = await inbox.list_conversations(staff_of(tenant))
    assert [c.id for c in listed] == [mine.conversation_id]
    assert listed[0].contact_name == "Ada" and listed[0].bot_mode == "bot" and listed[0].preview == "Hello"
    for outsider in (staff_of(other), staff_of(None)):
        assert mine.conversation_id not in [c.id for c in await inbox.list_conversations(outsider)]
        with pytest.raises(NotFoundError):
            await inbox.list_messages(outsider, mine.conversation_id)
        with pytest.raises(NotFoundError):
            await inbox.set_bot_mode(outsider, mine.conversation_id, "human")
        with pytest.raises(NotFoundError):
            await inbox.reply_as_staff(outsider, mine.conversation_id, "Hi from elsewhere")
    assert (await inbox.get_conversation(staff_of(tenant), mine.conversation_id)).bot_mode == "bot"


async def test_a_user_of_the_tenant_whose_token_names_no_staff_role_sees_no_inbox(
    inbox: PostgresInbox, inbox_database: InboxDatabase
) -> None:
    tenant = new_tenant()
    mine = await _inbound(inbox, tenant)
    member = staff_of(tenant, named=False)
    assert await inbox.list_conversations(member) == []
    with pytest.raises(NotFoundError):
        await inbox.list_messages(member, mine.conversation_id)
    with pytest.raises(NotFoundError):
        await inbox.reply_as_staff(member, mine.conversation_id, "I only signed up")
    # Nor through the Data API, table by table, as `authenticated` with that user's token.
    for table in ("inbox_contacts", "inbox_conversations", "inbox_messages"):
        assert await as_user(inbox_database.direct_dsn, member, f"select * from bastion.{table}") == []
        assert await as_user(inbox_database.direct_dsn, staff_of(tenant), f"select * from bastion.{table}")
    updated = await as_user(
        inbox_database.direct_dsn,
        member,
        "update bastion.inbox_conversations set bot_mode = 'human' returning id",
    )
    assert updated == []


async def test_a_contact_reads_only_its_own_conversation(inbox: PostgresInbox) -> None:
    tenant = new_tenant()
    ada = await _inbound(inbox, tenant, contact="ada", text="I am Ada")
    bob = await _inbound(inbox, tenant, contact="bob", text="I am Bob")
    mode, messages = await inbox.contact_messages(_principal(tenant, ada))
    assert mode == "bot" and [m.body for m in messages] == ["I am Ada"]
    # Ada's contact id with Bob's conversation is no key to Bob's conversation.
    forged = ContactPrincipal(
        tenant_id=tenant, contact_id=ada.contact_id, conversation_id=bob.conversation_id
    )
    with pytest.raises(NotFoundError):
        await inbox.contact_messages(forged)
    with pytest.raises(NotFoundError):
        await inbox.send_as_contact(forged, "Let me in", client_message_id="x-1")
    assert [m.body for m in await inbox.list_messages(staff_of(tenant), bob.conversation_id)] == ["I am Bob"]


async def test_in_sql_the_contacts_role_reaches_its_conversation_and_nothing_else(
    inbox: PostgresInbox, inbox_database: InboxDatabase
) -> None:
    tenant = new_tenant()
    ada = await _inbound(inbox, tenant, contact="ada", text="I am Ada")
    bob = await _inbound(inbox, tenant, contact="bob", text="I am Bob")
    contact = _principal(tenant, ada)
    dsn = inbox_database.app_dsn
    assert await as_contact(dsn, contact, "select body from bastion.inbox_messages") == [("I am Ada",)]
    assert await as_contact(dsn, contact, "select id::text from bastion.inbox_conversations") == [
        (ada.conversation_id,)
    ]
    assert await as_contact(dsn, contact, "select count(*) from bastion.inbox_contacts") == [(1,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_contact(
            dsn,
            contact,
            "insert into bastion.inbox_messages (conversation_id, tenant_id, author, body)"
            " values (%s, %s, 'contact', 'into Bob')",
            (bob.conversation_id, tenant),
        )
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_contact(
            dsn,
            contact,
            "insert into bastion.inbox_messages (conversation_id, tenant_id, author, body)"
            " values (%s, %s, 'bot', 'pretending to be the bot')",
            (ada.conversation_id, tenant),
        )
    for forbidden in (
        "select staff_id from bastion.inbox_messages",
        "select handoff_reason from bastion.inbox_conversations",
        "update bastion.inbox_conversations set bot_mode = 'bot'",
        "select count(*) from bastion.memories",
        "select count(*) from bastion.memory_core",
        "select count(*) from bastion.conversations",
        "select count(*) from bastion.credentials",
        "select count(*) from dbos.workflow_status",
        "select * from bastion.inbox_record_inbound('t', 'c', 'th', 'k', null, 'e', 'b')",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await as_contact(dsn, contact, forbidden)


async def test_a_direct_database_client_cannot_become_a_contact(
    inbox: PostgresInbox, inbox_database: InboxDatabase
) -> None:
    tenant = new_tenant()
    contact = _principal(tenant, await _inbound(inbox, tenant))
    direct = inbox_database.cluster.dsn(inbox_database.name, user="api_client")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_contact(direct, contact, "select 1")


async def test_a_thread_belongs_to_its_first_contact(inbox: PostgresInbox) -> None:
    tenant = new_tenant()
    await _inbound(inbox, tenant, contact="ada")
    with pytest.raises(ThreadConflictError):
        await inbox.record_inbound(
            channel_of(tenant), thread_id="thread-ada", contact_id="eve", text="Me too", external_id="e1"
        )


async def test_the_bots_reply_posts_once_and_never_in_human_mode(inbox: PostgresInbox) -> None:
    tenant = new_tenant()
    staff = staff_of(tenant)
    first = await _inbound(inbox, tenant, text="First")
    contact = _principal(tenant, first)
    job = await inbox.reply_job(contact, first.message_id, job_id="j1")
    assert job.answerable and [m["role"] for m in job.history] == ["user"]
    assert await inbox.post_bot_reply(contact, first.message_id, "Answer", job_id="j1") == "posted"
    assert await inbox.post_bot_reply(contact, first.message_id, "Answer again", job_id="j1") == "duplicate"
    assert not (await inbox.reply_job(contact, first.message_id, job_id="j1")).answerable

    second = await _inbound(inbox, tenant, text="Second")
    await inbox.set_bot_mode(staff, first.conversation_id, "human")
    assert not (await inbox.reply_job(contact, second.message_id, job_id="j2")).answerable
    assert await inbox.post_bot_reply(contact, second.message_id, "Too late", job_id="j2") == "dropped"
    # Back with the bot, a message from before the takeover stays unanswered; a new one is answered.
    await inbox.set_bot_mode(staff, first.conversation_id, "bot")
    assert await inbox.post_bot_reply(contact, second.message_id, "Still too late", job_id="j2") == "dropped"
    third = await _inbound(inbox, tenant, text="Third")
    job = await inbox.reply_job(contact, third.message_id, job_id="j3")
    assert [m["parts"][0]["text"] for m in job.history] == ["First", "Answer", "Second", "Third"]
    assert await inbox.post_bot_reply(contact, third.message_id, "Answer three", job_id="j3") == "posted"
    bodies = [(m.author, m.body) for m in await inbox.list_messages(staff, first.conversation_id)]
    assert bodies == [
        ("contact", "First"),
        ("bot", "Answer"),
        ("contact", "Second"),
        ("contact", "Third"),
        ("bot", "Answer three"),
    ]


async def test_the_agents_handoff_lets_its_own_reply_post(inbox: PostgresInbox) -> None:
    tenant = new_tenant()
    message = await _inbound(inbox, tenant, text="I want a person")
    contact = _principal(tenant, message)
    await inbox.request_handoff(contact, "The contact asked for a person.", job_id="j1")
    conversation = await inbox.get_conversation(staff_of(tenant), message.conversation_id)
    assert conversation.bot_mode == "human"
    assert conversation.handoff_reason == "The contact asked for a person."
    assert await inbox.post_bot_reply(
        contact, message.message_id, "Someone will follow up.", job_id="j1"
    ) == ("posted")
    later = await _inbound(inbox, tenant, text="Hello?")
    assert not later.routed
    assert await inbox.post_bot_reply(contact, later.message_id, "Not me", job_id="j2") == "dropped"


async def test_staff_replies_and_a_contacts_widget_messages(inbox: PostgresInbox) -> None:
    tenant = new_tenant()
    contact = await inbox.open_widget_conversation(tenant, contact_id="visitor-1", contact_name="Visitor")
    sent = await inbox.send_as_contact(contact, "Hi there", client_message_id="c-1")
    again = await inbox.send_as_contact(contact, "Hi there", client_message_id="c-1")
    assert sent.routed and again.duplicate and again.message_id == sent.message_id
    staff = staff_of(tenant)
    reply = await inbox.reply_as_staff(staff, contact.conversation_id, "Hello, how can I help?")
    assert reply.author == "staff"
    mode, messages = await inbox.contact_messages(contact)
    assert mode == "bot" and [(m.author, m.body) for m in messages] == [
        ("contact", "Hi there"),
        ("staff", "Hello, how can I help?"),
    ]
