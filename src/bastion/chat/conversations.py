"""HTTP routes over a store's conversations: list, create, get, rename, delete, messages, events, feedback.

Every route is a user route; the caller is the verified principal and nothing in the request can name
another owner. The store's own rules always apply (row-level security in Postgres, scoped queries in
SQLite): a missing and a foreign conversation are the same 404. `ConversationRules` lets an application
refuse more, never allow more. Messages are written only by turns, never through these routes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bastion.api import InvalidRequestError, StrictModel, json_body, json_response, operation
from bastion.auth import Principal
from bastion.chat.request import UUID_PATTERN, WireUIMessage
from bastion.errors import BastionError
from bastion.stores._turn_persistence import MAX_TITLE
from bastion.stores.entities import (
    MAX_COMMENT,
    MAX_CURSOR,
    Conversation,
    Feedback,
    Rating,
    RunEvent,
    StoredMessage,
    StoreIdentity,
    is_storable_text,
)
from bastion.stores.errors import NotFoundError
from bastion.stores.filters import ConversationFilter, InvalidFilterError, conversation_cursor
from bastion.stores.protocol import Store
from bastion.worker import RequestContext, Route

__all__ = [
    "ConversationRules",
    "ConversationStore",
    "InvalidRequestError",
    "MessagesQuery",
    "RuleRefusedError",
    "conversation_routes",
    "json_body",
]


class RuleRefusedError(BastionError):
    """An application rule refused the operation."""

    code: ClassVar[str] = "forbidden"
    status: ClassVar[int] = 403


def _storable(value: str) -> str:
    if not is_storable_text(value):
        raise ValueError("must not hold NUL characters or unpaired surrogates")
    return value


def _digits(value: object) -> object:
    """A query number as plain ASCII digits only: no sign, space, underscore or other script's digits."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= 19):
        raise ValueError("must be a non-negative whole number written in digits")
    return value


Title = Annotated[str, Field(max_length=MAX_TITLE), AfterValidator(_storable)]
Comment = Annotated[str, Field(max_length=MAX_COMMENT), AfterValidator(_storable)]
Uuid = Annotated[str, Field(pattern=UUID_PATTERN)]
MAX_MESSAGES = 1000


Limit = Annotated[int, Field(ge=1, le=100, description="How many, at most."), BeforeValidator(_digits)]
Cursor = Annotated[
    int,
    Field(ge=0, le=MAX_CURSOR, description="The cursor of the last event already read."),
    BeforeValidator(_digits),
]


class NewConversation(StrictModel):
    title: Title | None = None


class ConversationChange(StrictModel):
    """A new title, or (where the rules allow) new application state; one of the two."""

    title: Title | None = None
    state: Annotated[Any, Field(description="The application's state, validated by its schema.")] = None


class NewFeedback(StrictModel):
    message_id: Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_storable)]
    rating: Literal["up", "down"]
    comment: Annotated[Comment | None, Field(description="Empty or blank means no comment.")] = None


class _Query(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ConversationsQuery(_Query):
    """Filters: `agent`, the application's registered columns, `after` and `before` (last activity,
    ISO 8601 with an offset), and `cursor` (the previous page's `next`)."""

    limit: Limit = 100
    agent: str | None = None
    after: str | None = None
    before: str | None = None
    cursor: str | None = None


class EventsQuery(_Query):
    after: Cursor = 0
    limit: Limit = 100


class MessagesQuery(_Query):
    after: Annotated[
        int,
        Field(ge=0, le=MAX_CURSOR, description="The position of the last message already read (`next`)."),
        BeforeValidator(_digits),
    ] = 0
    limit: Annotated[
        int, Field(ge=1, le=MAX_MESSAGES, description="How many, at most."), BeforeValidator(_digits)
    ] = MAX_MESSAGES


class ConversationOut(StrictModel):
    """A conversation, with the application's registered columns beside these fields and its `state`
    when the rules show it."""

    id: Uuid
    title: str | None
    agent_name: str | None
    revision: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, conversation: Conversation[Any]) -> ConversationOut:
        return cls(
            id=conversation.id,
            title=conversation.title,
            agent_name=conversation.agent_name,
            revision=conversation.revision,
            created_at=conversation.created_at,
            updated_at=conversation.updated_at,
        )


class ConversationList(StrictModel):
    """The caller's conversations, most recent first, and the cursor of the next page (if it may have any)."""

    conversations: list[ConversationOut]
    next: str | None


class MessageList(StrictModel):
    """The conversation's UI messages after the position asked from, oldest first, and the position to
    ask from next."""

    messages: list[WireUIMessage]
    next: Annotated[int, Field(description="The position of the last message listed (or `after`).")] = 0


class EventOut(StrictModel):
    id: int
    run_id: Uuid
    type: str
    data: dict[str, Any]
    created_at: datetime
    cursor: int


class EventList(StrictModel):
    """Run events after the cursor, oldest first, and the cursor to ask from next."""

    events: list[EventOut]
    next: int


class FeedbackOut(StrictModel):
    """The caller's rating of a message."""

    conversation_id: Uuid
    message_id: str
    rating: Literal["up", "down"]
    comment: str | None
    updated_at: datetime


# What the conversations' routes need of a store: the one `Store` protocol both stores implement.
ConversationStore: TypeAlias = Store


def _anyone(principal: Principal, operation: str) -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class ConversationRules:
    """Application rules on top of the store's: `allows(principal, operation)` may refuse, for example
    read-only access for anonymous users. Operations: list, create, get, update, delete, messages,
    events, feedback, and `state` for a change of the application state. A refusal or an error is
    403 `forbidden`.

    `state` is what the browser may do with the conversation's application state: nothing (the
    default: it is the application's own), `read` it in the conversation's JSON, or also `write` it
    with `PATCH {"state": ...}`, validated by the store's schema.
    """

    allows: Callable[[Principal, str], bool | Awaitable[bool]] = _anyone
    state: Literal["hidden", "read", "write"] = "hidden"

    async def check(self, principal: Principal, operation: str) -> None:
        try:
            decision = self.allows(principal, operation)
            if not isinstance(decision, bool):
                decision = await decision
        except Exception:
            decision = False
        if decision is not True:
            raise RuleRefusedError("You are not allowed to do this.")


def conversation_routes(
    store: ConversationStore, *, prefix: str = "/api/conversations", rules: ConversationRules | None = None
) -> list[Route]:
    """The routes, each `auth="user"`, for a store and the application's rules.

    The rules run before the body is read, so a refused caller learns nothing about their input.
    """
    rules = rules or ConversationRules()
    handlers = _ConversationHandlers(store, rules)
    one = f"{prefix}/{{conversation_id}}"

    def route(method: str, path: str, name: str, handler: Any) -> Route:
        async def allowed(request: Request, context: RequestContext) -> None:
            await rules.check(context.require_principal(), name)

        return Route(method=method, path=path, auth="user", handler=handler, authorize=allowed)

    return [
        route("GET", prefix, "list", handlers.list_conversations),
        route("POST", prefix, "create", handlers.create_conversation),
        route("GET", one, "get", handlers.get_conversation),
        route("PATCH", one, "update", handlers.update_conversation),
        route("DELETE", one, "delete", handlers.delete_conversation),
        route("GET", f"{one}/messages", "messages", handlers.list_messages),
        route("GET", f"{one}/events", "events", handlers.list_events),
        route("POST", f"{one}/feedback", "feedback", handlers.add_feedback),
    ]


class _ConversationHandlers:
    def __init__(self, store: ConversationStore, rules: ConversationRules) -> None:
        self._store = store
        self._rules = rules

    @staticmethod
    def _identity(context: RequestContext) -> StoreIdentity:
        return StoreIdentity.from_principal(context.require_principal())

    @operation(query=ConversationsQuery, responses={200: ConversationList}, errors=(403,))
    async def list_conversations(
        self, request: Request, context: RequestContext, *, query: ConversationsQuery
    ) -> Response:
        """List the caller's conversations, most recent first: `?agent=`, the application's registered
        columns (`?project_id=`), `?after=` and `?before=` (last activity), `?limit=` and `?cursor=`."""
        identity = self._identity(context)
        params = request.query_params
        repeated = [name for name in params if len(params.getlist(name)) > 1]
        if repeated:
            raise InvalidFilterError(repeated[0])
        filter = ConversationFilter.from_query(dict(params), self._store.schema.columns)
        conversations = await self._store.list_conversations(identity, limit=query.limit, filter=filter)
        more = len(conversations) == query.limit
        page = ConversationList(
            conversations=[ConversationOut.of(c) for c in conversations],
            next=conversation_cursor(conversations[-1]) if more else None,
        ).model_dump(mode="json")
        page["conversations"] = [self._json(c) for c in conversations]
        return JSONResponse(page)

    @operation(body=NewConversation, body_required=False, responses={201: ConversationOut}, errors=(403,))
    async def create_conversation(
        self, request: Request, context: RequestContext, *, body: NewConversation
    ) -> Response:
        """Start a conversation owned by the caller."""
        identity = self._identity(context)
        conversation = await self._store.create_conversation(identity, title=body.title)
        return JSONResponse(self._json(conversation), status_code=201)

    @operation(responses={200: ConversationOut}, errors=(403, 404))
    async def get_conversation(self, request: Request, context: RequestContext) -> Response:
        """Read one of the caller's conversations."""
        identity = self._identity(context)
        conversation = await self._store.get_conversation(identity, _conversation_id(context))
        return JSONResponse(self._json(conversation))

    @operation(body=ConversationChange, responses={200: ConversationOut}, errors=(403, 404))
    async def update_conversation(
        self, request: Request, context: RequestContext, *, body: ConversationChange
    ) -> Response:
        """Rename one of the caller's conversations, or change its state where the rules allow."""
        identity = self._identity(context)
        conversation_id = _conversation_id(context)
        if "state" in body.model_fields_set:
            if self._rules.state != "write" or "title" in body.model_fields_set:
                raise RuleRefusedError("You are not allowed to do this.")
            assert context.principal is not None
            await self._rules.check(context.principal, "state")
            conversation = await self._store.set_conversation_state(identity, conversation_id, body.state)
            return JSONResponse(self._json(conversation))
        if body.title is None:
            raise InvalidRequestError("title must be a string.", field="title")
        conversation = await self._store.update_conversation(identity, conversation_id, title=body.title)
        return JSONResponse(self._json(conversation))

    def _json(self, conversation: Conversation[Any]) -> dict[str, Any]:
        """What the browser sees: bastion's fields, the agent, the registered columns, and the state
        only when the rules show it (as JSON, the way the schema stores it)."""
        shown = ConversationOut.of(conversation).model_dump(mode="json")
        shown |= dict(conversation.columns)
        if self._rules.state != "hidden":
            state = conversation.state
            shown["state"] = json.loads(self._store.schema.dump_state(state)) if state is not None else None
        return shown

    @operation(responses={204: None}, errors=(403, 404))
    async def delete_conversation(self, request: Request, context: RequestContext) -> Response:
        """Delete one of the caller's conversations and everything in it."""
        identity = self._identity(context)
        await self._store.delete_conversation(identity, _conversation_id(context))
        return Response(status_code=204)

    @operation(query=MessagesQuery, responses={200: MessageList}, errors=(403, 404))
    async def list_messages(
        self, request: Request, context: RequestContext, *, query: MessagesQuery
    ) -> Response:
        """The conversation's UI messages, as the client assembled them, after a position (`?after=`,
        the previous page's `next`), oldest first, at most `?limit=`."""
        identity = self._identity(context)
        stored = await self._store.list_messages(
            identity, _conversation_id(context), after_seq=query.after, limit=query.limit
        )
        return json_response(
            MessageList(
                messages=[_ui_message(message) for message in stored],
                next=stored[-1].seq if stored else query.after,
            )
        )

    @operation(query=EventsQuery, responses={200: EventList}, errors=(403, 404))
    async def list_events(self, request: Request, context: RequestContext, *, query: EventsQuery) -> Response:
        """The conversation's run events after a cursor (`?after=`), oldest first."""
        identity = self._identity(context)
        events = await self._store.list_events(
            identity, _conversation_id(context), after=query.after, limit=query.limit
        )
        items = [_event(event) for event in events]
        return json_response(EventList(events=items, next=items[-1].cursor if items else query.after))

    @operation(body=NewFeedback, responses={201: FeedbackOut}, errors=(403, 404))
    async def add_feedback(self, request: Request, context: RequestContext, *, body: NewFeedback) -> Response:
        """Rate a message of the conversation `up` or `down`, with an optional comment."""
        identity = self._identity(context)
        comment = body.comment if body.comment is not None and body.comment.strip() else None
        rating: Rating = body.rating
        feedback = await self._store.add_feedback(
            identity, _conversation_id(context), body.message_id, rating=rating, comment=comment
        )
        return json_response(_feedback(feedback), status_code=201)


def _conversation_id(context: RequestContext) -> str:
    """A malformed id is not found, like a foreign one: ids cannot be probed by their shape."""
    try:
        return str(uuid.UUID(str(context.params.get("conversation_id"))))
    except ValueError:
        raise NotFoundError() from None


def _ui_message(message: StoredMessage) -> WireUIMessage:
    stored: WireUIMessage = message.message  # type: ignore[assignment]
    return stored


def _event(event: RunEvent) -> EventOut:
    return EventOut(
        id=event.id,
        run_id=event.run_id,
        type=event.type,
        data=event.data,
        created_at=event.created_at,
        cursor=event.id,
    )


def _feedback(feedback: Feedback) -> FeedbackOut:
    return FeedbackOut.model_validate(feedback, from_attributes=True)
