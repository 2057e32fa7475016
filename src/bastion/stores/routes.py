"""HTTP routes over a store's conversations: list, create, get, rename, delete, messages, events, feedback.

Every route is a user route; the caller is the verified principal and nothing in the request can name
another owner. The store's own rules always apply (row-level security in Postgres, scoped queries in
SQLite): a missing and a foreign conversation are the same 404. `ConversationRules` lets an application
refuse more, never allow more. Messages are written only by turns, never through these routes.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bastion.auth import Principal
from bastion.errors import BastionError
from bastion.stores.entities import Conversation, Feedback, Rating, RunEvent, StoredMessage, StoreIdentity
from bastion.stores.errors import NotFoundError
from bastion.worker import RequestContext, Route

__all__ = [
    "ConversationRules",
    "ConversationStore",
    "InvalidRequestError",
    "RuleRefusedError",
    "conversation_routes",
]


class InvalidRequestError(BastionError):
    """The request body or query is not what the route takes."""

    code: ClassVar[str] = "invalid_input"
    status: ClassVar[int] = 400


class RuleRefusedError(BastionError):
    """An application rule refused the operation."""

    code: ClassVar[str] = "forbidden"
    status: ClassVar[int] = 403


class ConversationStore(Protocol):
    """The entity API both stores provide."""

    async def create_conversation(
        self, identity: StoreIdentity, *, title: str | None = None, conversation_id: str | None = None
    ) -> Conversation: ...

    async def list_conversations(self, identity: StoreIdentity, *, limit: int = 50) -> list[Conversation]: ...

    async def get_conversation(self, identity: StoreIdentity, conversation_id: str) -> Conversation: ...

    async def update_conversation(
        self, identity: StoreIdentity, conversation_id: str, *, title: str | None
    ) -> Conversation: ...

    async def delete_conversation(self, identity: StoreIdentity, conversation_id: str) -> None: ...

    async def list_messages(
        self, identity: StoreIdentity, conversation_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[StoredMessage]: ...

    async def add_feedback(
        self,
        identity: StoreIdentity,
        conversation_id: str,
        message_id: str,
        *,
        rating: Rating,
        comment: str | None = None,
    ) -> Feedback: ...

    async def list_events(
        self, identity: StoreIdentity, conversation_id: str, *, after: int = 0, limit: int = 100
    ) -> list[RunEvent]: ...


def _anyone(principal: Principal, operation: str) -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class ConversationRules:
    """Application rules on top of the store's: `allows(principal, operation)` may refuse, for example
    read-only access for anonymous users. Operations: list, create, get, update, delete, messages,
    events, feedback. A refusal or an error is 403 `forbidden`.
    """

    allows: Callable[[Principal, str], bool | Awaitable[bool]] = _anyone

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
    """The routes, each `auth="user"`, for a store and the application's rules."""
    handlers = _ConversationHandlers(store, rules or ConversationRules())
    one = f"{prefix}/{{conversation_id}}"
    return [
        Route(method="GET", path=prefix, auth="user", handler=handlers.list_conversations),
        Route(method="POST", path=prefix, auth="user", handler=handlers.create_conversation),
        Route(method="GET", path=one, auth="user", handler=handlers.get_conversation),
        Route(method="PATCH", path=one, auth="user", handler=handlers.update_conversation),
        Route(method="DELETE", path=one, auth="user", handler=handlers.delete_conversation),
        Route(method="GET", path=f"{one}/messages", auth="user", handler=handlers.list_messages),
        Route(method="GET", path=f"{one}/events", auth="user", handler=handlers.list_events),
        Route(method="POST", path=f"{one}/feedback", auth="user", handler=handlers.add_feedback),
    ]


class _ConversationHandlers:
    def __init__(self, store: ConversationStore, rules: ConversationRules) -> None:
        self._store = store
        self._rules = rules

    async def _identity(self, context: RequestContext, operation: str) -> StoreIdentity:
        if context.principal is None:
            raise RuntimeError("A user route ran without a verified principal.")
        await self._rules.check(context.principal, operation)
        return StoreIdentity.from_principal(context.principal)

    async def list_conversations(self, request: Request, context: RequestContext) -> Response:
        """List the caller's conversations, most recent first."""
        identity = await self._identity(context, "list")
        conversations = await self._store.list_conversations(identity, limit=100)
        return JSONResponse({"conversations": [_conversation_json(item) for item in conversations]})

    async def create_conversation(self, request: Request, context: RequestContext) -> Response:
        """Start a conversation owned by the caller."""
        identity = await self._identity(context, "create")
        body = await json_body(request, optional=True)
        title = body.get("title")
        if title is not None and not isinstance(title, str):
            raise InvalidRequestError("title must be a string.")
        conversation = await self._store.create_conversation(identity, title=title)
        return JSONResponse(_conversation_json(conversation), status_code=201)

    async def get_conversation(self, request: Request, context: RequestContext) -> Response:
        """Read one of the caller's conversations."""
        identity = await self._identity(context, "get")
        conversation = await self._store.get_conversation(identity, _conversation_id(context))
        return JSONResponse(_conversation_json(conversation))

    async def update_conversation(self, request: Request, context: RequestContext) -> Response:
        """Rename one of the caller's conversations."""
        identity = await self._identity(context, "update")
        body = await json_body(request)
        title = body.get("title")
        if not isinstance(title, str):
            raise InvalidRequestError("title must be a string.")
        conversation = await self._store.update_conversation(identity, _conversation_id(context), title=title)
        return JSONResponse(_conversation_json(conversation))

    async def delete_conversation(self, request: Request, context: RequestContext) -> Response:
        """Delete one of the caller's conversations and everything in it."""
        identity = await self._identity(context, "delete")
        await self._store.delete_conversation(identity, _conversation_id(context))
        return Response(status_code=204)

    async def list_messages(self, request: Request, context: RequestContext) -> Response:
        """The conversation's UI messages, as the client assembled them."""
        identity = await self._identity(context, "messages")
        stored = await self._store.list_messages(identity, _conversation_id(context))
        return JSONResponse({"messages": [message.message for message in stored]})

    async def list_events(self, request: Request, context: RequestContext) -> Response:
        """The conversation's run events after a cursor (`?after=`), oldest first."""
        identity = await self._identity(context, "events")
        after = _cursor(request.query_params.get("after", "0"))
        events = await self._store.list_events(identity, _conversation_id(context), after=after, limit=100)
        items = [{**_record(event), "cursor": event.id} for event in events]
        return JSONResponse({"events": items, "next": items[-1]["cursor"] if items else after})

    async def add_feedback(self, request: Request, context: RequestContext) -> Response:
        """Rate a message of the conversation `up` or `down`, with an optional comment."""
        identity = await self._identity(context, "feedback")
        body = await json_body(request)
        message_id, rating, comment = body.get("message_id"), body.get("rating"), body.get("comment")
        if not isinstance(message_id, str) or rating not in ("up", "down"):
            raise InvalidRequestError("Send a message_id and a rating of 'up' or 'down'.")
        if comment is not None and not isinstance(comment, str):
            raise InvalidRequestError("comment must be a string.")
        feedback = await self._store.add_feedback(
            identity, _conversation_id(context), message_id, rating=rating, comment=comment
        )
        return JSONResponse(_record(feedback), status_code=201)


async def json_body(request: Request, *, optional: bool = False) -> dict[str, Any]:
    """The request's JSON object, or `InvalidRequestError`."""
    raw = await request.body()
    if not raw and optional:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        raise InvalidRequestError("The body must be a JSON object.") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("The body must be a JSON object.")
    return body


def _conversation_id(context: RequestContext) -> str:
    """A malformed id is not found, like a foreign one: ids cannot be probed by their shape."""
    try:
        return str(uuid.UUID(str(context.params.get("conversation_id"))))
    except ValueError:
        raise NotFoundError() from None


def _cursor(value: str) -> int:
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise InvalidRequestError("after must be a non-negative event cursor.")
    return int(value)


def _record(value: Any) -> dict[str, Any]:
    """A store record as JSON-ready values."""
    return {item.name: _plain(getattr(value, item.name)) for item in dataclasses.fields(value)}


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _conversation_json(conversation: Conversation) -> dict[str, Any]:
    plain = _record(conversation)
    return {key: plain[key] for key in ("id", "title", "revision", "created_at", "updated_at")}
