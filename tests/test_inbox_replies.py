"""The bot's replies as durable jobs on DBOS: bot mode answers as the contact, human mode never answers
(not even a job queued before the handoff), one job at a time per conversation with replies in order,
the agent's own handoff, and what stays closed to a contact (per-user MCP credentials, user-only tools,
per-user memory)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from dbos import DBOS

from bastion import AgentTools, ToolPolicy, define_agent, tool
from bastion.credentials import CredentialRef, InMemoryCredentialProvider, credential_auth
from bastion.durable import DurableEngine
from bastion.inbox import (
    ContactPrincipal,
    InboundMessage,
    InboxReplies,
    InboxTurn,
    PostgresInbox,
    handoff_to_human,
    reply_job_id,
    user_only_policy,
)
from bastion.mcp import McpConnectionDefinition, McpTransport, create_mcp_connections
from bastion.memory import HashingEmbedder, PostgresMemoryStore, define_memory
from bastion.stores import PostgresStore
from tests.inbox_db import InboxDatabase, channel_of, new_tenant, staff_of
from tests.inbox_models import EchoModel, support_agent
from tests.mcp_servers import Behavior, serve_mcp


@pytest.fixture
async def engine(inbox_database: InboxDatabase) -> AsyncIterator[DurableEngine]:
    engine = await DurableEngine.launch(inbox_database.app_dsn, recovery_interval=0.5)
    async with engine:
        yield engine


@pytest.fixture
def echo() -> EchoModel:
    return EchoModel()


@pytest.fixture
async def replies(
    inbox: PostgresInbox, engine: DurableEngine, echo: EchoModel
) -> AsyncIterator[InboxReplies]:
    replies = InboxReplies(inbox, agent=support_agent(), model=echo.model())
    await replies.start(engine)
    yield replies
    replies.stop()


async def _arrive(inbox: PostgresInbox, tenant: str, text: str, *, contact: str = "ada") -> InboundMessage:
    return await inbox.record_inbound(
        channel_of(tenant),
        thread_id=f"thread-{contact}",
        contact_id=contact,
        text=text,
        external_id=uuid.uuid4().hex,
    )


async def _outcome(message: InboundMessage) -> Any:
    handle = await DBOS.retrieve_workflow_async(reply_job_id(message.message_id, message.seq))
    return await asyncio.wait_for(handle.get_result(), 30)


async def _status(message: InboundMessage) -> str:
    handle = await DBOS.retrieve_workflow_async(reply_job_id(message.message_id, message.seq))
    return (await handle.get_status()).status


async def _conversation(inbox: PostgresInbox, tenant: str, message: InboundMessage) -> list[tuple[str, str]]:
    return [(m.author, m.body) for m in await inbox.list_messages(staff_of(tenant), message.conversation_id)]


async def test_bot_mode_answers_as_the_contact(
    inbox: PostgresInbox, replies: InboxReplies, echo: EchoModel
) -> None:
    tenant = new_tenant()
    message = await _arrive(inbox, tenant, "Where is my order?")
    assert await _outcome(message) == "posted"
    assert await _conversation(inbox, tenant, message) == [
        ("contact", "Where is my order?"),
        ("bot", "Re: Where is my order?"),
    ]
    assert echo.seen == [("Where is my order?", ["handoff_to_human"])]


async def test_routing_a_message_again_is_the_same_job(
    inbox: PostgresInbox,
    inbox_store: PostgresStore,
    inbox_database: InboxDatabase,
    replies: InboxReplies,
    echo: EchoModel,
) -> None:
    tenant = new_tenant()
    message = await _arrive(inbox, tenant, "Once only")
    assert await _outcome(message) == "posted"
    contact = ContactPrincipal(
        tenant_id=tenant, contact_id=message.contact_id, conversation_id=message.conversation_id
    )
    async with inbox_store.pool.connection() as conn:
        await replies.route(conn, contact, message.message_id, seq=message.seq)
    assert await _outcome(message) == "posted"
    with psycopg.connect(inbox_database.admin_dsn) as conn:
        jobs = conn.execute(
            "select workflow_uuid, status from dbos.workflow_status where queue_partition_key = %s",
            (message.conversation_id,),
        ).fetchall()
    assert jobs == [(reply_job_id(message.message_id, message.seq), "SUCCESS")]
    assert await _conversation(inbox, tenant, message) == [("contact", "Once only"), ("bot", "Re: Once only")]
    assert echo.seen == [("Once only", ["handoff_to_human"])]


async def test_human_mode_never_answers_not_even_a_job_queued_before_the_handoff(
    inbox: PostgresInbox, engine: DurableEngine, inbox_database: InboxDatabase
) -> None:
    gate = asyncio.Event()
    echo = EchoModel(gate=gate)
    replies = InboxReplies(inbox, agent=support_agent(), model=echo.model())
    await replies.start(engine)
    try:
        tenant = new_tenant()
        running = await _arrive(inbox, tenant, "First")
        queued = await _arrive(inbox, tenant, "Second")
        elsewhere = await _arrive(inbox, tenant, "Other conversation", contact="bob")
        while echo.started < 2:  # the first conversation's job and the other conversation's
            await asyncio.sleep(0.02)
        # One job at a time in a conversation: the second waits while the first runs.
        assert await _status(queued) == "ENQUEUED"
        await inbox.set_bot_mode(staff_of(tenant), running.conversation_id, "human")
        gate.set()
        assert await _outcome(running) == "dropped"
        assert await _outcome(queued) == "dropped"
        assert await _outcome(elsewhere) == "posted"
        assert await _conversation(inbox, tenant, running) == [("contact", "First"), ("contact", "Second")]
        assert sorted(text for text, _ in echo.seen) == ["First", "Other conversation"]
        # In human mode a new message queues no job at all.
        later = await _arrive(inbox, tenant, "Third")
        assert not later.routed
        with psycopg.connect(inbox_database.admin_dsn) as conn:
            found = conn.execute(
                "select count(*) from dbos.workflow_status where workflow_uuid = %s",
                (reply_job_id(later.message_id, later.seq),),
            ).fetchone()
        assert found == (0,)
    finally:
        replies.stop()


async def test_ten_quick_messages_get_ten_replies_in_order(
    inbox: PostgresInbox, engine: DurableEngine
) -> None:
    echo = EchoModel()
    running = 0
    most = 0

    class Counting(EchoModel):
        async def _stream(self, messages: Any, info: Any) -> Any:
            nonlocal running, most
            running += 1
            most = max(most, running)
            try:
                await asyncio.sleep(0.01)
                async for item in echo._stream(messages, info):
                    yield item
            finally:
                running -= 1

    replies = InboxReplies(inbox, agent=support_agent(), model=Counting().model())
    await replies.start(engine)
    try:
        tenant = new_tenant()
        contact = await inbox.open_widget_conversation(tenant, contact_id="visitor")
        sent = [
            await inbox.send_as_contact(contact, f"message {number}", client_message_id=f"c{number}")
            for number in range(10)
        ]
        assert [await _outcome(message) for message in sent] == ["posted"] * 10
    finally:
        replies.stop()
    _, messages = await inbox.contact_messages(contact)
    replies_in_order = [m for m in messages if m.author == "bot"]
    assert [m.body for m in replies_in_order] == [f"Re: message {number}" for number in range(10)]
    assert [m.reply_to for m in replies_in_order] == [message.message_id for message in sent]
    assert [text for text, _ in echo.seen] == [f"message {number}" for number in range(10)]
    assert most == 1


async def test_the_agent_hands_the_conversation_to_a_human(
    inbox: PostgresInbox, replies: InboxReplies
) -> None:
    tenant = new_tenant()
    message = await _arrive(inbox, tenant, "handoff please")
    assert await _outcome(message) == "posted"
    conversation = await inbox.get_conversation(staff_of(tenant), message.conversation_id)
    assert conversation.bot_mode == "human"
    assert conversation.handoff_reason == "asked for a person"
    assert await _conversation(inbox, tenant, message) == [
        ("contact", "handoff please"),
        ("bot", 'Done: {"handed_off": true}'),
    ]
    assert not (await _arrive(inbox, tenant, "Anyone there?")).routed


class CountingProvider(InMemoryCredentialProvider):
    def __init__(self) -> None:
        super().__init__(name="memory")
        self.gets = 0

    async def get(self, ref: CredentialRef, *, owner_id: str | None = None) -> str | None:
        self.gets += 1
        return await super().get(ref, owner_id=owner_id)


async def test_a_per_user_mcp_connection_asks_for_authorization_without_calling_the_provider(
    inbox: PostgresInbox, engine: DurableEngine
) -> None:
    provider = CountingProvider()
    ref = CredentialRef(provider="memory", secret="docs", scope="user")
    with serve_mcp("http", Behavior(tokens=frozenset({"user-token"}))) as server:
        definition: McpConnectionDefinition[InboxTurn] = McpConnectionDefinition(
            name="docs",
            transport=McpTransport(type="http", url=server.url),
            auth=credential_auth(provider=provider, ref=ref, owner="user", connection="docs"),
        )

        async def tools(turn: InboxTurn) -> AgentTools:
            connections = await create_mcp_connections([definition], context=turn)
            return AgentTools(tools=[handoff_to_human(turn), *connections.tools], close=connections.close)

        agent = define_agent(name="support", instructions="Answer.", tools=tools)
        echo = EchoModel()
        replies = InboxReplies(inbox, agent=agent, model=echo.model())
        await replies.start(engine)
        try:
            tenant = new_tenant()
            message = await _arrive(inbox, tenant, "Search the docs for me")
            assert await _outcome(message) == "failed"
        finally:
            replies.stop()
        assert server.log.requests == []
    assert provider.gets == 0
    assert echo.seen == []
    conversation = await inbox.get_conversation(staff_of(tenant), message.conversation_id)
    assert conversation.bot_mode == "human"
    assert conversation.handoff_reason == "The bot could not answer (authorization_required)."
    assert await _conversation(inbox, tenant, message) == [("contact", "Search the docs for me")]


async def test_user_only_tools_and_per_user_memory_stay_closed_to_a_contact(
    inbox: PostgresInbox, inbox_store: PostgresStore, engine: DurableEngine
) -> None:
    tenant = new_tenant()
    memory_store = PostgresMemoryStore(inbox_store, embedder=HashingEmbedder(64))
    user = staff_of(tenant)
    await memory_store.remember(user, "The secret word is swordfish", scope="assistant")
    memory = define_memory(
        store=memory_store,
        identity=lambda turn: turn.identity,
        operation_id=lambda turn: turn.job_id,
        scope="assistant",
    )
    executed: list[str] = []

    @tool
    async def list_notes() -> dict[str, Any]:
        """List the signed-in user's notes."""
        executed.append("list_notes")
        return {"notes": ["swordfish"]}

    agent = define_agent(
        name="support",
        instructions="Answer.",
        tools=lambda turn: [handoff_to_human(turn), list_notes, *memory.tools(turn)],
        permissions={
            "handoff_to_human": ToolPolicy(),
            "list_notes": user_only_policy(),
            memory.remember_name: user_only_policy(),
            memory.forget_name: user_only_policy(),
        },
        context_messages=memory.context_messages,
    )
    echo = EchoModel()
    replies = InboxReplies(inbox, agent=agent, model=echo.model())
    await replies.start(engine)
    try:
        message = await _arrive(inbox, tenant, "call list_notes")
        assert await _outcome(message) == "posted"
        recall = await _arrive(inbox, tenant, "What is the secret word?")
        assert await _outcome(recall) == "posted"
    finally:
        replies.stop()
    assert executed == []
    assert [tools for _, tools in echo.seen] == [["handoff_to_human"]] * len(echo.seen)
    assert not any("swordfish" in prompt for prompt in echo.prompts)
    # The same memory recalls for the user it belongs to, so it is the contact that finds nothing.
    recalled = await memory_store.recall(
        user, "secret word", scope="assistant", operation_id=uuid.uuid4().hex
    )
    assert any("swordfish" in item.text for item in recalled.memories)


async def test_a_message_and_its_reply_job_commit_together(
    inbox: PostgresInbox, inbox_database: InboxDatabase
) -> None:
    replies = InboxReplies(inbox, agent=support_agent(), model=EchoModel().model())
    enqueued: list[str] = []

    class FailingAfterEnqueue:
        async def route(self, conn: Any, contact: Any, message_id: str, *, seq: int) -> None:
            await replies.route(conn, contact, message_id, seq=seq)
            enqueued.append(reply_job_id(message_id, seq))
            raise RuntimeError("the process failed before the commit")

    inbox.router = FailingAfterEnqueue()
    tenant = new_tenant()
    with pytest.raises(RuntimeError):
        await _arrive(inbox, tenant, "Lost with its job")
    [job] = enqueued
    with psycopg.connect(inbox_database.admin_dsn) as conn:
        assert conn.execute(
            "select count(*) from dbos.workflow_status where workflow_uuid = %s", (job,)
        ).fetchone() == (0,)
        assert conn.execute(
            "select count(*) from bastion.inbox_messages where tenant_id = %s", (tenant,)
        ).fetchone() == (0,)


class UnreliableInbox(PostgresInbox):
    """Posting the bot's reply fails `failures` times with `error`, then works."""

    def __init__(self, store: PostgresStore, error: Exception, failures: int) -> None:
        super().__init__(store)
        self.error, self.failures, self.tries = error, failures, 0

    async def post_bot_reply(self, contact: Any, message_id: str, text: str, *, job_id: str) -> Any:
        self.tries += 1
        if self.tries <= self.failures:
            raise self.error
        return await super().post_bot_reply(contact, message_id, text, job_id=job_id)


async def test_a_reply_that_cannot_be_posted_hands_the_conversation_to_staff(
    inbox_store: PostgresStore, engine: DurableEngine
) -> None:
    inbox = UnreliableInbox(inbox_store, RuntimeError("the post failed"), failures=100)
    replies = InboxReplies(inbox, agent=support_agent(), model=EchoModel().model())
    await replies.start(engine)
    try:
        tenant = new_tenant()
        message = await _arrive(inbox, tenant, "Hello?")
        assert await _outcome(message) == "failed"
    finally:
        replies.stop()
    assert inbox.tries == 3
    conversation = await inbox.get_conversation(staff_of(tenant), message.conversation_id)
    assert conversation.bot_mode == "human"
    assert conversation.handoff_reason == "The bot could not answer (reply_failed)."
    assert await _conversation(inbox, tenant, message) == [("contact", "Hello?")]


async def test_a_reply_waits_for_a_database_it_cannot_reach_rather_than_giving_up(
    inbox_store: PostgresStore, engine: DurableEngine
) -> None:
    inbox = UnreliableInbox(inbox_store, psycopg.OperationalError("connection refused"), failures=3)
    replies = InboxReplies(inbox, agent=support_agent(), model=EchoModel().model())
    await replies.start(engine)
    try:
        tenant = new_tenant()
        message = await _arrive(inbox, tenant, "Still there?")
        assert await _outcome(message) == "posted"
    finally:
        replies.stop()
    assert inbox.tries == 4
    conversation = await inbox.get_conversation(staff_of(tenant), message.conversation_id)
    assert conversation.bot_mode == "bot"
    assert await _conversation(inbox, tenant, message) == [
        ("contact", "Still there?"),
        ("bot", "Re: Still there?"),
    ]
