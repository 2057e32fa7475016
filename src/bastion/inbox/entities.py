"""The inbox's shapes: conversations, their messages, and what recording a contact's message gave."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypeAlias

__all__ = [
    "Author",
    "BotMode",
    "InboundMessage",
    "InboxConversation",
    "InboxMessage",
    "OutboundMessage",
    "ReplyOutcome",
]

BotMode: TypeAlias = Literal["bot", "human"]
Author: TypeAlias = Literal["contact", "bot", "staff"]
ReplyOutcome: TypeAlias = Literal["posted", "duplicate", "dropped"]
"""What a reply job did: posted the bot's reply, found it posted already (a retry), or answered nothing
because the conversation is with a human (or changed mode after the message)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxConversation:
    """A support conversation as staff see it."""

    id: str
    tenant_id: str
    contact_id: str
    contact_name: str | None
    channel: str
    bot_mode: BotMode
    handoff_reason: str | None
    preview: str | None
    last_message_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxMessage:
    """One message; `reply_to` is the contact message a bot reply answers."""

    id: str
    seq: int
    author: Author
    body: str
    created_at: datetime
    reply_to: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InboundMessage:
    """A contact's message as stored: where it went, and whether it had been stored before."""

    conversation_id: str
    contact_id: str
    message_id: str
    seq: int
    bot_mode: BotMode
    duplicate: bool

    @property
    def routed(self) -> bool:
        """Whether this message asks for a bot reply: new, in a conversation the bot answers."""
        return not self.duplicate and self.bot_mode == "bot"


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboundMessage:
    """A bot or staff message for a channel's adapter to deliver: to which thread and contact, and its
    position (`seq`), from which the adapter asks for the next ones."""

    seq: int
    message_id: str
    thread_id: str
    contact_id: str
    author: Author
    body: str
