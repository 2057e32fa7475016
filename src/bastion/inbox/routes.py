"""The inbox over HTTP: the channel adapters' webhook, the web widget's routes and the staff's.

- `POST {prefix}/channels/{channel}/messages`: an adapter delivers a contact's message. The bearer
  secret is checked (in constant time) before the body is read: a wrong one is 401 and stores nothing.
  The tenant is the channel's; a message id seen before is stored once (`duplicate: true`).
  `GET {prefix}/channels/{channel}/messages?after=<seq>`: what the bot and staff wrote since, for the
  adapter to deliver (same secret).
- `POST {prefix}/widget/conversations` (only with `widget_tenant`): a visitor opens a conversation and
  gets a contact token for it. `GET`/`POST {prefix}/widget/messages`: the conversation, read and
  written with that token (`Authorization: Bearer <contact token>`), one conversation per token.
- Staff (signed-in users of the tenant): `GET {prefix}/conversations`, `GET .../{id}`, `PUT
  .../{id}/mode` (take over: `human`; hand back: `bot`) and `POST .../{id}/messages` (reply).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal, TypeVar

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from bastion.api import StrictModel, json_response, operation
from bastion.auth import AuthenticationError, Principal, bearer_token
from bastion.inbox.channels import InboxChannel, InboxChannels
from bastion.inbox.entities import InboxConversation, InboxMessage
from bastion.inbox.errors import ChannelUnauthorizedError, ContactTokenError, NotInboxStaffError
from bastion.inbox.principal import ContactPrincipal
from bastion.inbox.staff import inbox_staff_identity
from bastion.inbox.store import MAX_MESSAGE_LENGTH, PostgresInbox
from bastion.inbox.tokens import ContactTokens
from bastion.stores import NotFoundError, StoreIdentity
from bastion.worker import RequestContext, Route

__all__ = ["inbox_routes"]

VerifiedT = TypeVar("VerifiedT")

Name = Annotated[str, Field(min_length=1, max_length=200)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_LENGTH)]


class InboxChannelContact(StrictModel):
    """Who wrote, as the channel knows them."""

    id: Name
    name: Name | None = None


class InboxChannelMessage(StrictModel):
    """The message: its id on the channel (the idempotency key) and its text."""

    id: Name
    text: Text


class InboxInboundBody(StrictModel):
    """A message a channel adapter delivers; `thread_id` defaults to the contact's id."""

    contact: InboxChannelContact
    message: InboxChannelMessage
    thread_id: Name | None = None


class InboxInboundOut(StrictModel):
    """Where the message went; `duplicate` when its id was delivered before (nothing new stored)."""

    conversation_id: str
    message_id: str
    duplicate: bool


class InboxOutboundQuery(StrictModel):
    """The position of the last message the adapter delivered (0 for the first call), and how many more."""

    after: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    limit: Annotated[int, Field(ge=1, le=1000)] = 100


class InboxOutboundOut(StrictModel):
    seq: int
    message_id: str
    thread_id: str
    contact_id: str
    author: Literal["bot", "staff"]
    text: str


class InboxOutboundList(StrictModel):
    """Messages to deliver, oldest first; ask again with `after` set to the last one's `seq`."""

    messages: list[InboxOutboundOut]


class InboxWidgetOpen(StrictModel):
    """The visitor's display name, if they gave one."""

    name: Name | None = None


class InboxWidgetSession(StrictModel):
    """A contact token for one new conversation."""

    token: str
    conversation_id: str


class InboxMessageOut(StrictModel):
    id: str
    author: Literal["contact", "bot", "staff"]
    text: str
    created_at: datetime
    reply_to: str | None


class InboxWidgetConversation(StrictModel):
    """The contact's conversation: who answers now (`bot` or `human`) and its messages in order."""

    bot_mode: Literal["bot", "human"]
    messages: list[InboxMessageOut]


class InboxSendBody(StrictModel):
    """A message; `client_message_id` makes a retried send store it once."""

    text: Text
    client_message_id: Name | None = None


class InboxSentOut(StrictModel):
    message_id: str
    duplicate: bool


class InboxConversationOut(StrictModel):
    id: str
    contact_name: str | None
    channel: str
    bot_mode: Literal["bot", "human"]
    handoff_reason: str | None
    preview: str | None
    last_message_at: datetime | None
    created_at: datetime


class InboxConversationList(StrictModel):
    """The tenant's conversations, the most recent first."""

    conversations: list[InboxConversationOut]


class InboxConversationDetail(StrictModel):
    """One conversation and its messages in order."""

    conversation: InboxConversationOut
    messages: list[InboxMessageOut]


class InboxModeBody(StrictModel):
    """`human` takes the conversation over (the bot stops answering); `bot` hands it back."""

    bot_mode: Literal["bot", "human"]


def inbox_routes(
    inbox: PostgresInbox,
    *,
    channels: InboxChannels,
    tokens: ContactTokens,
    widget_tenant: str | None = None,
    staff: Callable[[Principal], StoreIdentity | None] = inbox_staff_identity,
    prefix: str = "/api/inbox",
) -> list[Route]:
    """The inbox's routes (see the module). `widget_tenant` lets anyone open a widget conversation in
    that tenant; leave it None when the application issues contact tokens itself (`ContactTokens`).
    `staff(principal)` is the identity a signed-in user staffs the inbox as (by default their own, in
    their token's tenant, when the token names them staff: `inbox_staff_identity`); None refuses them
    (403)."""
    handlers = _InboxRoutes(
        inbox=inbox, channels=channels, tokens=tokens, widget_tenant=widget_tenant, staff=staff
    )
    return handlers.routes(prefix)


@dataclass(frozen=True, kw_only=True)
class _InboxRoutes:
    """The inbox routes' handlers. A channel's secret and a contact's token are checked once, by the
    route's `authorize` hook before the body is read; the handler takes what it verified from the request."""

    inbox: PostgresInbox
    channels: InboxChannels
    tokens: ContactTokens
    widget_tenant: str | None
    staff: Callable[[Principal], StoreIdentity | None]

    def routes(self, prefix: str) -> list[Route]:
        channel = f"{prefix}/channels/{{channel}}/messages"
        widget = f"{prefix}/widget/messages"
        conversation = f"{prefix}/conversations/{{conversation_id}}"
        adapter, visitor = self.channel_secret, self.contact_token
        return [
            Route(method="POST", path=channel, auth="none", handler=self.receive, authorize=adapter),
            Route(method="GET", path=channel, auth="none", handler=self.deliver, authorize=adapter),
            Route(
                method="POST", path=f"{prefix}/widget/conversations", auth="none", handler=self.open_widget
            ),
            Route(method="GET", path=widget, auth="none", handler=self.widget_messages, authorize=visitor),
            Route(method="POST", path=widget, auth="none", handler=self.widget_send, authorize=visitor),
            Route(method="GET", path=f"{prefix}/conversations", auth="user", handler=self.list_conversations),
            Route(method="GET", path=conversation, auth="user", handler=self.get_conversation),
            Route(method="PUT", path=f"{conversation}/mode", auth="user", handler=self.set_mode),
            Route(method="POST", path=f"{conversation}/messages", auth="user", handler=self.reply),
        ]

    def channel_secret(self, request: Request, context: RequestContext) -> None:
        """Before the body is read: the channel's secret, or 401."""
        secret = _bearer(request, ChannelUnauthorizedError)
        request.state.inbox_channel = self.channels.authenticate(context.params.get("channel"), secret)

    def contact_token(self, request: Request, context: RequestContext) -> None:
        """Before the body is read: the contact's token, or 401."""
        request.state.inbox_contact = self.tokens.verify(_bearer(request, ContactTokenError))

    def _staff(self, context: RequestContext) -> StoreIdentity:
        identity = self.staff(context.require_principal())
        if identity is None:
            raise NotInboxStaffError()
        return identity

    @operation(body=InboxInboundBody, responses={200: InboxInboundOut}, errors=(401, 409))
    async def receive(self, request: Request, context: RequestContext, *, body: InboxInboundBody) -> Response:
        """A contact's message from a channel adapter, stored once per message id."""
        inbound = await self.inbox.record_inbound(
            _verified(request, "inbox_channel", InboxChannel),
            thread_id=body.thread_id or body.contact.id,
            contact_id=body.contact.id,
            contact_name=body.contact.name,
            external_id=body.message.id,
            text=body.message.text,
        )
        return json_response(
            InboxInboundOut(
                conversation_id=inbound.conversation_id,
                message_id=inbound.message_id,
                duplicate=inbound.duplicate,
            )
        )

    @operation(query=InboxOutboundQuery, responses={200: InboxOutboundList}, errors=(401,))
    async def deliver(
        self, request: Request, context: RequestContext, *, query: InboxOutboundQuery
    ) -> Response:
        """What the bot and staff wrote in the channel's conversations, for the adapter to deliver."""
        channel = _verified(request, "inbox_channel", InboxChannel)
        found = await self.inbox.outbound(channel, after=query.after, limit=query.limit)
        return json_response(
            InboxOutboundList(
                messages=[
                    InboxOutboundOut(
                        seq=item.seq,
                        message_id=item.message_id,
                        thread_id=item.thread_id,
                        contact_id=item.contact_id,
                        author=item.author,  # type: ignore[arg-type]
                        text=item.body,
                    )
                    for item in found
                ]
            )
        )

    @operation(body=InboxWidgetOpen, body_required=False, responses={201: InboxWidgetSession}, errors=(404,))
    async def open_widget(
        self, request: Request, context: RequestContext, *, body: InboxWidgetOpen
    ) -> Response:
        """Open a conversation for a new visitor and sign its contact token."""
        if self.widget_tenant is None:
            raise NotFoundError()
        contact = await self.inbox.open_widget_conversation(
            self.widget_tenant, contact_id=f"visitor-{secrets.token_hex(12)}", contact_name=body.name
        )
        session = InboxWidgetSession(
            token=self.tokens.issue(contact), conversation_id=contact.conversation_id
        )
        return json_response(session, status_code=201)

    @operation(responses={200: InboxWidgetConversation}, errors=(401, 404))
    async def widget_messages(self, request: Request, context: RequestContext) -> Response:
        """The contact's conversation."""
        contact = _verified(request, "inbox_contact", ContactPrincipal)
        mode, messages = await self.inbox.contact_messages(contact)
        return json_response(InboxWidgetConversation(bot_mode=mode, messages=[_message(m) for m in messages]))

    @operation(body=InboxSendBody, responses={200: InboxSentOut}, errors=(401, 404))
    async def widget_send(
        self, request: Request, context: RequestContext, *, body: InboxSendBody
    ) -> Response:
        """The contact's message; the bot answers it while the conversation is in bot mode."""
        sent = await self.inbox.send_as_contact(
            _verified(request, "inbox_contact", ContactPrincipal),
            body.text,
            client_message_id=body.client_message_id or secrets.token_hex(16),
        )
        return json_response(InboxSentOut(message_id=sent.message_id, duplicate=sent.duplicate))

    @operation(responses={200: InboxConversationList}, errors=(403,))
    async def list_conversations(self, request: Request, context: RequestContext) -> Response:
        """The caller's tenant's inbox."""
        listed = await self.inbox.list_conversations(self._staff(context))
        return json_response(InboxConversationList(conversations=[_conversation(c) for c in listed]))

    @operation(responses={200: InboxConversationDetail}, errors=(400, 403, 404))
    async def get_conversation(self, request: Request, context: RequestContext) -> Response:
        """One conversation of the caller's tenant, with its messages."""
        staff, conversation_id = self._staff(context), str(context.params.get("conversation_id"))
        conversation = await self.inbox.get_conversation(staff, conversation_id)
        messages = await self.inbox.list_messages(staff, conversation_id)
        return json_response(
            InboxConversationDetail(
                conversation=_conversation(conversation), messages=[_message(m) for m in messages]
            )
        )

    @operation(body=InboxModeBody, responses={200: InboxConversationOut}, errors=(403, 404))
    async def set_mode(self, request: Request, context: RequestContext, *, body: InboxModeBody) -> Response:
        """Take the conversation over, or hand it back to the bot."""
        conversation = await self.inbox.set_bot_mode(
            self._staff(context), str(context.params.get("conversation_id")), body.bot_mode
        )
        return json_response(_conversation(conversation))

    @operation(body=InboxSendBody, responses={201: InboxMessageOut}, errors=(403, 404))
    async def reply(self, request: Request, context: RequestContext, *, body: InboxSendBody) -> Response:
        """Reply as staff."""
        message = await self.inbox.reply_as_staff(
            self._staff(context),
            str(context.params.get("conversation_id")),
            body.text,
            client_message_id=body.client_message_id,
        )
        return json_response(_message(message), status_code=201)


def _verified(request: Request, key: str, kind: type[VerifiedT]) -> VerifiedT:
    """What the route's `authorize` hook verified, kept on the request for its handler."""
    value = getattr(request.state, key, None)
    if not isinstance(value, kind):
        raise RuntimeError(f"An inbox route ran without the authorize hook that sets {key}.")
    return value


def _bearer(request: Request, error: type[ChannelUnauthorizedError] | type[ContactTokenError]) -> str:
    try:
        return bearer_token(request.headers.get("authorization"))
    except AuthenticationError:
        raise error() from None


def _message(message: InboxMessage) -> InboxMessageOut:
    return InboxMessageOut(
        id=message.id,
        author=message.author,
        text=message.body,
        created_at=message.created_at,
        reply_to=message.reply_to,
    )


def _conversation(conversation: InboxConversation) -> InboxConversationOut:
    return InboxConversationOut.model_validate(conversation, from_attributes=True)
