"""The inbox in Postgres: every call one transaction as the caller it is for, under row-level security.

- Staff calls run as the signed-in user (`PostgresStore.transaction`): their tenant's inbox only.
- Contact calls run as the `bastion_contact` role with the contact's claims: one conversation only.
- What only the application server may do (a channel's message, a widget conversation, the bot's
  reply, the agent's handoff) goes through the migration's runtime-only functions.

A contact's message and its routing commit together: `record_inbound` and `send_as_contact` hand the
open transaction to the `ReplyRouter` (the durable queue enqueues its reply job there), so a message is
never stored without its job, nor a job queued for a message that was rolled back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol

from bastion._extras import missing_extra

try:
    import psycopg
except ImportError as error:
    raise missing_extra("bastion.inbox", "postgres", error) from error

from bastion.inbox.channels import InboxChannel
from bastion.inbox.entities import (
    BotMode,
    InboundMessage,
    InboxConversation,
    InboxMessage,
    OutboundMessage,
    ReplyOutcome,
)
from bastion.inbox.errors import ThreadConflictError
from bastion.inbox.principal import CONTACT_ROLE, ContactPrincipal
from bastion.stores import InvalidInputError, NotFoundError, PostgresStore, StoreIdentity
from bastion.stores._migrations import apply_application_migrations, available_migrations
from bastion.stores.entities import check_cursor, check_limit, check_text, parse_uuid
from bastion.stores.postgres import Connection, caller_transaction

__all__ = ["MAX_MESSAGE_LENGTH", "PostgresInbox", "ReplyJob", "ReplyRouter", "apply_inbox_migrations"]

MAX_MESSAGE_LENGTH: Final = 8000
_BOT_MODES: Final = frozenset({"bot", "human"})

_AS_SERVER: Final = "select set_config('request.jwt.claims', '', true)"
_AS_CONTACT: Final = "select set_config('role', %s, true), set_config('request.jwt.claims', %s, true)"
# Back to the application's own login role inside the transaction, for the queue's enqueue.
_AS_LOGIN_ROLE: Final = "select set_config('role', 'none', true)"

_RECORD_INBOUND: Final = "select * from bastion.inbox_record_inbound(%s, %s, %s, %s, %s, %s, %s)"
_OUTBOUND: Final = "select * from bastion.inbox_outbound(%s, %s, %s, %s)"
_OPEN_WIDGET: Final = "select * from bastion.inbox_open_widget_conversation(%s, %s, %s)"
_CONTACT_MODE: Final = "select bot_mode from bastion.inbox_conversations where id = %s"
_CONTACT_SEND: Final = """
insert into bastion.inbox_messages (conversation_id, tenant_id, author, body, external_id)
values (%s, %s, 'contact', %s, %s)
on conflict on constraint inbox_messages_external do nothing
returning id::text, seq
"""
_CONTACT_EXISTING: Final = """
select id::text, seq from bastion.inbox_messages where conversation_id = %s and external_id = %s
"""
_MESSAGES: Final = """
select id::text, seq, author, body, created_at, reply_to::text from bastion.inbox_messages
 where conversation_id = %s order by seq
"""
_CONVERSATION_COLUMNS: Final = """
c.id::text, c.tenant_id, c.contact_id::text, k.display_name, c.channel, c.bot_mode, c.handoff_reason,
c.preview, c.last_message_at, c.created_at
"""
_LIST_CONVERSATIONS: Final = f"""
select {_CONVERSATION_COLUMNS} from bastion.inbox_conversations c
  join bastion.inbox_contacts k on k.id = c.contact_id
 order by c.last_message_at desc nulls last, c.id limit %s
"""
_GET_CONVERSATION: Final = f"""
select {_CONVERSATION_COLUMNS} from bastion.inbox_conversations c
  join bastion.inbox_contacts k on k.id = c.contact_id
 where c.id = %s
"""
_SET_MODE: Final = "update bastion.inbox_conversations set bot_mode = %s where id = %s returning 1"
_STAFF_REPLY: Final = """
insert into bastion.inbox_messages (conversation_id, tenant_id, author, staff_id, body, external_id)
select c.id, c.tenant_id, 'staff', %s, %s, %s from bastion.inbox_conversations c where c.id = %s
returning id::text, seq, author, body, created_at, reply_to::text
"""
# The job's view: whether it may still answer, and the conversation up to its message, each bot reply
# right after the message it answered.
_JOB_STATE: Final = """
select c.bot_mode, c.handoff_seq, c.handoff_job, m.seq,
       exists (select 1 from bastion.inbox_messages r where r.reply_to = m.id)
  from bastion.inbox_messages m join bastion.inbox_conversations c on c.id = m.conversation_id
 where m.id = %s and m.author = 'contact'
"""
_JOB_HISTORY: Final = """
select m.id::text, m.author, m.body from bastion.inbox_messages m
  left join bastion.inbox_messages t on t.id = m.reply_to
 where m.conversation_id = %s and coalesce(t.seq, m.seq) <= %s and (t.seq is null or t.seq < %s)
 order by coalesce(t.seq, m.seq), m.seq
"""
_POST_REPLY: Final = "select bastion.inbox_post_bot_reply(%s, %s, %s)"
_HANDOFF: Final = "select bastion.inbox_request_handoff(%s, %s)"


async def apply_inbox_migrations(conninfo: str) -> list[int]:
    """Apply the inbox's migrations (component `inbox`), after bastion's own (`apply_migrations`)."""
    return await apply_application_migrations(
        conninfo, component="inbox", migrations=available_migrations("bastion.inbox", "migrations")
    )


class ReplyRouter(Protocol):
    """Queues the bot's reply to a contact message, inside the transaction that stores the message.

    `conn` is that transaction, back in the application's login role; what the router writes there
    commits or rolls back with the message.
    """

    async def route(
        self, conn: Connection, contact: ContactPrincipal, message_id: str, *, seq: int
    ) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplyJob:
    """What a reply job sees: the history up to its message (UI messages), or nothing to answer."""

    answerable: bool
    history: list[dict[str, Any]]


class PostgresInbox:
    """Contacts, conversations and messages over a `PostgresStore`'s pool; see the module docstring.

    `router` queues the bot's replies (None queues nothing: staff answer everything).
    """

    def __init__(self, store: PostgresStore, *, router: ReplyRouter | None = None) -> None:
        self._store = store
        self.router = router

    # Intake: what only the application server does.

    async def record_inbound(
        self,
        channel: InboxChannel,
        *,
        thread_id: str,
        contact_id: str,
        text: str,
        external_id: str,
        contact_name: str | None = None,
    ) -> InboundMessage:
        """Store a message a channel delivered, once per `external_id`, and route it to the bot."""
        check_text(thread_id)
        check_text(contact_id)
        check_text(external_id)
        if contact_name is not None:
            check_text(contact_name)
        body = _checked_body(text)
        with _inbox_errors():
            async with caller_transaction(self._store.pool, _AS_SERVER, ()) as conn:
                cursor = await conn.execute(
                    _RECORD_INBOUND,
                    (channel.tenant_id, channel.name, thread_id, contact_id, contact_name, external_id, body),
                )
                row = await cursor.fetchone()
                assert row is not None
                inbound = InboundMessage(
                    conversation_id=str(row[0]),
                    contact_id=str(row[1]),
                    message_id=str(row[2]),
                    seq=row[3],
                    bot_mode=row[4],
                    duplicate=row[5],
                )
                await self._route(conn, _contact_of(channel.tenant_id, inbound), inbound)
        return inbound

    async def outbound(
        self, channel: InboxChannel, *, after: int = 0, limit: int = 100
    ) -> list[OutboundMessage]:
        """The bot's and staff's messages in `channel`'s conversations after `after`, oldest first."""
        check_cursor(after)
        check_limit(limit)
        with _inbox_errors():
            async with caller_transaction(self._store.pool, _AS_SERVER, ()) as conn:
                cursor = await conn.execute(_OUTBOUND, (channel.tenant_id, channel.name, after, limit))
        return [
            OutboundMessage(
                seq=row[0],
                message_id=str(row[1]),
                thread_id=row[2],
                contact_id=row[3],
                author=row[4],
                body=row[5],
            )
            for row in await cursor.fetchall()
        ]

    async def open_widget_conversation(
        self, tenant_id: str, *, contact_id: str, contact_name: str | None = None
    ) -> ContactPrincipal:
        """A new widget conversation for a contact the application knows as `contact_id` in `tenant_id`;
        the principal to sign a contact token for (`ContactTokens.issue`)."""
        check_text(tenant_id)
        check_text(contact_id)
        if contact_name is not None:
            check_text(contact_name)
        with _inbox_errors():
            async with caller_transaction(self._store.pool, _AS_SERVER, ()) as conn:
                cursor = await conn.execute(_OPEN_WIDGET, (tenant_id, contact_id, contact_name))
                row = await cursor.fetchone()
        assert row is not None
        return ContactPrincipal(tenant_id=tenant_id, contact_id=str(row[1]), conversation_id=str(row[0]))

    # The contact

    async def send_as_contact(
        self, contact: ContactPrincipal, text: str, *, client_message_id: str
    ) -> InboundMessage:
        """The contact's message in its conversation, once per `client_message_id`, routed to the bot."""
        check_text(client_message_id)
        body = _checked_body(text)
        with _inbox_errors():
            async with self._as_contact(contact) as conn:
                cursor = await conn.execute(
                    _CONTACT_SEND, (contact.conversation_id, contact.tenant_id, body, client_message_id)
                )
                row = await cursor.fetchone()
                duplicate = row is None
                if row is None:
                    cursor = await conn.execute(
                        _CONTACT_EXISTING, (contact.conversation_id, client_message_id)
                    )
                    row = await cursor.fetchone()
                    if row is None:
                        raise NotFoundError()
                mode = await conn.execute(_CONTACT_MODE, (contact.conversation_id,))
                bot_mode = _single(await mode.fetchone())
                inbound = InboundMessage(
                    conversation_id=contact.conversation_id,
                    contact_id=contact.contact_id,
                    message_id=row[0],
                    seq=row[1],
                    bot_mode=bot_mode,
                    duplicate=duplicate,
                )
                await self._route(conn, contact, inbound)
        return inbound

    async def contact_messages(self, contact: ContactPrincipal) -> tuple[BotMode, list[InboxMessage]]:
        """The contact's conversation: who answers it now, and its messages in order."""
        with _inbox_errors():
            async with self._as_contact(contact) as conn:
                mode = await conn.execute(_CONTACT_MODE, (contact.conversation_id,))
                messages = await conn.execute(_MESSAGES, (contact.conversation_id,))
        row = await mode.fetchone()
        if row is None:
            raise NotFoundError()
        return row[0], [_message(item) for item in await messages.fetchall()]

    # Staff

    async def list_conversations(
        self, identity: StoreIdentity, *, limit: int = 100
    ) -> list[InboxConversation]:
        """The caller's tenant's conversations, the most recent first (none without a tenant)."""
        check_limit(limit)
        with _inbox_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_LIST_CONVERSATIONS, (limit,))
        return [_conversation(row) for row in await cursor.fetchall()]

    async def get_conversation(self, identity: StoreIdentity, conversation_id: str) -> InboxConversation:
        conversation_id = parse_uuid(conversation_id)
        with _inbox_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_GET_CONVERSATION, (conversation_id,))
        row = await cursor.fetchone()
        if row is None:
            raise NotFoundError()
        return _conversation(row)

    async def list_messages(self, identity: StoreIdentity, conversation_id: str) -> list[InboxMessage]:
        """A conversation's messages in order; a conversation outside the caller's tenant is not found."""
        conversation_id = parse_uuid(conversation_id)
        with _inbox_errors():
            async with self._store.transaction(identity) as conn:
                found = await conn.execute(_GET_CONVERSATION, (conversation_id,))
                cursor = await conn.execute(_MESSAGES, (conversation_id,))
        if await found.fetchone() is None:
            raise NotFoundError()
        return [_message(row) for row in await cursor.fetchall()]

    async def set_bot_mode(
        self, identity: StoreIdentity, conversation_id: str, mode: BotMode
    ) -> InboxConversation:
        """Take a conversation over (`human`: no reply job answers any message before this) or hand it
        back to the bot (`bot`)."""
        conversation_id = parse_uuid(conversation_id)
        if mode not in _BOT_MODES:
            raise InvalidInputError()
        with _inbox_errors():
            async with self._store.transaction(identity) as conn:
                updated = await conn.execute(_SET_MODE, (mode, conversation_id))
                if await updated.fetchone() is None:
                    raise NotFoundError()
                cursor = await conn.execute(_GET_CONVERSATION, (conversation_id,))
        return _conversation(await cursor.fetchone())

    async def reply_as_staff(
        self,
        identity: StoreIdentity,
        conversation_id: str,
        text: str,
        *,
        client_message_id: str | None = None,
    ) -> InboxMessage:
        """A staff member's reply; it never routes to the bot."""
        conversation_id = parse_uuid(conversation_id)
        body = _checked_body(text)
        if client_message_id is not None:
            check_text(client_message_id)
        with _inbox_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(
                    _STAFF_REPLY, (identity.user_id, body, client_message_id, conversation_id)
                )
                row = await cursor.fetchone()
        if row is None:
            raise NotFoundError()
        return _message(row)

    # The reply job, acting for the contact

    async def reply_job(self, contact: ContactPrincipal, message_id: str, *, job_id: str) -> ReplyJob:
        """Whether the job for `message_id` may answer, and the history it answers from."""
        message_id = parse_uuid(message_id)
        with _inbox_errors():
            async with self._as_contact(contact) as conn:
                cursor = await conn.execute(_JOB_STATE, (message_id,))
                row = await cursor.fetchone()
                if row is None:
                    raise NotFoundError()
                mode, handoff_seq, handoff_job, seq, replied = row
                own_handoff = handoff_job == job_id
                if replied or (not own_handoff and (mode != "bot" or seq <= handoff_seq)):
                    return ReplyJob(answerable=False, history=[])
                history = await conn.execute(_JOB_HISTORY, (contact.conversation_id, seq, seq))
                rows = await history.fetchall()
        return ReplyJob(answerable=True, history=[_ui_message(row) for row in rows])

    async def post_bot_reply(
        self, contact: ContactPrincipal, message_id: str, text: str, *, job_id: str
    ) -> ReplyOutcome:
        """Post the bot's reply to `message_id` once; see `ReplyOutcome`."""
        message_id = parse_uuid(message_id)
        body = _checked_body(text)
        with _inbox_errors():
            async with self._as_contact(contact) as conn:
                cursor = await conn.execute(_POST_REPLY, (message_id, body, job_id))
                outcome: ReplyOutcome = _single(await cursor.fetchone())
        return outcome

    async def request_handoff(self, contact: ContactPrincipal, reason: str, *, job_id: str) -> None:
        """The agent asks for a human: the conversation leaves bot mode (its own reply still posts)."""
        check_text(reason, max_length=500)
        with _inbox_errors():
            async with self._as_contact(contact) as conn:
                await conn.execute(_HANDOFF, (reason, job_id))

    # Helpers

    @asynccontextmanager
    async def _as_contact(self, contact: ContactPrincipal) -> AsyncIterator[Connection]:
        async with caller_transaction(
            self._store.pool, _AS_CONTACT, (CONTACT_ROLE, contact.database_claims())
        ) as conn:
            yield conn

    async def _route(self, conn: Connection, contact: ContactPrincipal, inbound: InboundMessage) -> None:
        if self.router is None or not inbound.routed:
            return
        await conn.execute(_AS_LOGIN_ROLE)
        await self.router.route(conn, contact, inbound.message_id, seq=inbound.seq)


def _contact_of(tenant_id: str, inbound: InboundMessage) -> ContactPrincipal:
    return ContactPrincipal(
        tenant_id=tenant_id, contact_id=inbound.contact_id, conversation_id=inbound.conversation_id
    )


def _checked_body(text: object) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError()
    return check_text(text.strip(), max_length=MAX_MESSAGE_LENGTH)


def _single(row: tuple[Any, ...] | None) -> Any:
    assert row is not None
    return row[0]


def _message(row: Sequence[Any]) -> InboxMessage:
    return InboxMessage(id=row[0], seq=row[1], author=row[2], body=row[3], created_at=row[4], reply_to=row[5])


def _conversation(row: Sequence[Any] | None) -> InboxConversation:
    assert row is not None
    return InboxConversation(
        id=row[0],
        tenant_id=row[1],
        contact_id=row[2],
        contact_name=row[3],
        channel=row[4],
        bot_mode=row[5],
        handoff_reason=row[6],
        preview=row[7],
        last_message_at=row[8],
        created_at=row[9],
    )


def _ui_message(row: Sequence[Any]) -> dict[str, Any]:
    """A stored message as the agent's history: the contact is the user; the bot and staff answer."""
    message_id, author, body = row
    role = "user" if author == "contact" else "assistant"
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": body}]}


@contextmanager
def _inbox_errors() -> Iterator[None]:
    """The refusals the migration raises on purpose; anything else is a server fault."""
    try:
        yield
    except psycopg.Error as error:
        state = error.sqlstate
        if state == "BS409":
            raise ThreadConflictError() from error
        if state in ("BS404", "42501"):
            raise NotFoundError() from error
        if state == "22P02":
            raise InvalidInputError() from error
        raise
