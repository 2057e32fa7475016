"""A typed async client of bastion's versioned HTTP API (`/v1`), for scripts, jobs and other services.

    async with BastionClient("http://127.0.0.1:8000", token=token) as client:
        conversation = await client.create_conversation(title="Plans")
        async for chunk in client.chat(conversation.id, [user_message("who am I?")]):
            ...

Responses are read into the same pydantic models the routes answer with (`ConversationOut`,
`MessageList`, `EventList`, `FeedbackOut`, `StopResult`), so a change to a route's type is a change
here. A refused request raises `BastionApiError` with the server's stable `code`, the HTTP `status`,
the `field` at fault and `retry_after` (seconds, from `Retry-After`, for a busy conversation).
`chat` and `resume` yield the AI SDK UI message chunks as dicts; `bastion.assemble_ui_messages` turns
them into messages. Only the verified token decides whose data this is: the client sends no identity.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeAlias, TypeVar, cast
from urllib.parse import quote

import httpx2
from pydantic import BaseModel, ConfigDict

from bastion._ui_chunks import Chunk
from bastion.api import StrictModel
from bastion.chat.conversations import (
    ConversationChange,
    ConversationOut,
    EventList,
    FeedbackOut,
    MessageList,
    NewConversation,
    NewFeedback,
)
from bastion.chat.endpoint import StopResult
from bastion.chat.request import UI_MESSAGE_STREAM_END, WireUIMessage
from bastion.versioning import DEFAULT_VERSIONING
from bastion.worker import status_error_code

__all__ = [
    "BastionApiError",
    "BastionClient",
    "BastionStreamError",
    "Conversation",
    "ConversationPage",
    "TokenSource",
    "UIMessageChunk",
    "user_message",
]

UIMessageChunk: TypeAlias = Chunk
"""One AI SDK UI message chunk: `{"type": "text-delta", "id": ..., "delta": ...}`, …"""
TokenSource: TypeAlias = "str | Callable[[], str | Awaitable[str]]"
"""A bearer token, or a function giving the current one (called before each request)."""

ModelT = TypeVar("ModelT", bound=BaseModel)


class BastionApiError(Exception):
    """The server refused a request: its stable machine `code`, the HTTP `status`, the human
    `message`, the request `field` at fault (when one is), and `retry_after` in seconds (when the
    server said when to try again, as for a conversation whose turn is running)."""

    def __init__(
        self,
        *,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after


class BastionStreamError(Exception):
    """A stream that is not the UI message stream (a chunk that is not a JSON object, or no end)."""


class Conversation(ConversationOut):
    """A conversation; the application's registered columns and its `state` (where the rules show it)
    are in `model_extra`."""

    model_config = ConfigDict(strict=True, extra="allow")


class ConversationPage(StrictModel):
    """One page of the caller's conversations, most recent first; `next` is the next page's cursor."""

    conversations: list[Conversation]
    next: str | None


def user_message(text: str, *, message_id: str | None = None) -> WireUIMessage:
    """A new user message of one text part, in the shape `chat` sends."""
    message = {
        "id": message_id or uuid.uuid4().hex,
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }
    return cast("WireUIMessage", message)


class BastionClient:
    """The API of one bastion server, as one caller (`token`).

    `base_url` is the server's root; `prefix` the API version's (`/v1`). Pass `http` to reuse an
    `httpx2.AsyncClient` (its base URL is then ignored, `base_url` is used); the client closes only
    the one it made. `timeout` bounds each ordinary request; a stream waits for its next chunk as long
    as the turn takes.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: TokenSource | None = None,
        prefix: str = DEFAULT_VERSIONING.prefix,
        http: httpx2.AsyncClient | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._root = base_url.rstrip("/") + prefix
        self._token = token
        self._owned = http is None
        self._http = http or httpx2.AsyncClient(timeout=timeout)
        self._stream_timeout = httpx2.Timeout(timeout, read=None)

    async def __aenter__(self) -> BastionClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    # Conversations

    async def list_conversations(
        self,
        *,
        limit: int | None = None,
        agent: str | None = None,
        after: datetime | str | None = None,
        before: datetime | str | None = None,
        cursor: str | None = None,
        columns: Mapping[str, str] | None = None,
    ) -> ConversationPage:
        """One page of the caller's conversations: filtered by `agent`, the application's registered
        `columns`, last activity `after`/`before`; `cursor` is the previous page's `next`."""
        params = _query(limit=limit, agent=agent, after=after, before=before, cursor=cursor)
        for name, value in (columns or {}).items():
            params[name] = value
        return await self._json("GET", "/conversations", ConversationPage, params=params)

    async def conversations(self, *, page_size: int = 100, **filters: Any) -> AsyncIterator[Conversation]:
        """Every conversation `list_conversations(**filters)` finds, page after page."""
        cursor: str | None = None
        while True:
            page = await self.list_conversations(limit=page_size, cursor=cursor, **filters)
            for conversation in page.conversations:
                yield conversation
            if page.next is None:
                return
            cursor = page.next

    async def create_conversation(self, *, title: str | None = None) -> Conversation:
        body = _body(NewConversation, title=title) if title is not None else {}
        return await self._json("POST", "/conversations", Conversation, json=body)

    async def get_conversation(self, conversation_id: str) -> Conversation:
        return await self._json("GET", f"/conversations/{_segment(conversation_id)}", Conversation)

    async def rename_conversation(self, conversation_id: str, title: str) -> Conversation:
        path = f"/conversations/{_segment(conversation_id)}"
        return await self._json("PATCH", path, Conversation, json=_body(ConversationChange, title=title))

    async def set_conversation_state(self, conversation_id: str, state: Any) -> Conversation:
        """Replace the conversation's application state (where the server's rules allow writing it)."""
        path = f"/conversations/{_segment(conversation_id)}"
        return await self._json("PATCH", path, Conversation, json={"state": state})

    async def delete_conversation(self, conversation_id: str) -> None:
        await self._call("DELETE", f"/conversations/{_segment(conversation_id)}")

    async def list_messages(
        self, conversation_id: str, *, after: int | None = None, limit: int | None = None
    ) -> MessageList:
        """The conversation's UI messages after position `after` (a previous list's `next`)."""
        path = f"/conversations/{_segment(conversation_id)}/messages"
        return await self._json("GET", path, MessageList, params=_query(after=after, limit=limit))

    async def list_events(
        self, conversation_id: str, *, after: int | None = None, limit: int | None = None
    ) -> EventList:
        """The conversation's run events after cursor `after` (a previous list's `next`)."""
        path = f"/conversations/{_segment(conversation_id)}/events"
        return await self._json("GET", path, EventList, params=_query(after=after, limit=limit))

    async def add_feedback(
        self,
        conversation_id: str,
        message_id: str,
        rating: Literal["up", "down"],
        *,
        comment: str | None = None,
    ) -> FeedbackOut:
        """Rate a message `up` or `down`, replacing the caller's earlier rating of it."""
        body = _body(NewFeedback, message_id=message_id, rating=rating, comment=comment)
        path = f"/conversations/{_segment(conversation_id)}/feedback"
        return await self._json("POST", path, FeedbackOut, json=body)

    # Turns

    async def chat(
        self,
        conversation_id: str,
        messages: Sequence[WireUIMessage],
        *,
        trigger: Literal["submit-message", "regenerate-message"] = "submit-message",
    ) -> AsyncIterator[UIMessageChunk]:
        """Run one turn and yield its UI message chunks until the stream ends.

        `messages` are the conversation's messages as the AI SDK client sends them (the latest alone is
        enough); a conversation's first message creates it. A refused turn raises `BastionApiError`
        when iteration starts; a turn that fails while streaming yields its `error` chunk.
        """
        body = {"id": conversation_id, "trigger": trigger, "messages": list(messages)}
        async for chunk in self._stream("POST", "/chat", json=body):
            yield chunk

    async def resume(
        self, conversation_id: str, *, reset_step: bool = False
    ) -> AsyncIterator[UIMessageChunk]:
        """The running turn's chunks from its start, then live until it ends; nothing when no turn runs.
        `reset_step` asks for `reset-step` chunks where a taken-over turn re-runs a step."""
        params = {"resetStep": "1"} if reset_step else None
        async for chunk in self._stream("GET", f"/chat/{_segment(conversation_id)}/stream", params=params):
            yield chunk

    async def stop(self, conversation_id: str) -> StopResult | None:
        """Stop the conversation's running turn, wherever it runs; None when none was running.
        `settled` says whether it had settled (as cancelled) by the time the server answered."""
        response = await self._call("POST", f"/chat/{_segment(conversation_id)}/stop")
        if response.status_code == 204:
            return None
        return StopResult.model_validate_json(response.content)

    # Transport

    async def _json(self, method: str, path: str, model: type[ModelT], **request: Any) -> ModelT:
        response = await self._call(method, path, **request)
        return model.model_validate_json(response.content)

    async def _call(self, method: str, path: str, **request: Any) -> httpx2.Response:
        response = await self._http.request(
            method, self._root + path, headers=await self._headers(), **request
        )
        if response.is_error:
            raise _error(response)
        return response

    async def _stream(self, method: str, path: str, **request: Any) -> AsyncIterator[UIMessageChunk]:
        async with self._http.stream(
            method,
            self._root + path,
            headers={**await self._headers(), "Accept": "text/event-stream"},
            timeout=self._stream_timeout,
            **request,
        ) as response:
            if response.is_error:
                await response.aread()
                raise _error(response)
            if response.status_code == 204:
                return
            async for data in _sse_data(response.aiter_lines()):
                if data == UI_MESSAGE_STREAM_END:
                    return
                try:
                    chunk = json.loads(data)
                except ValueError:
                    chunk = None
                if not isinstance(chunk, dict) or not isinstance(chunk.get("type"), str):
                    raise BastionStreamError("The stream sent an event that is not a UI message chunk.")
                yield chunk
        raise BastionStreamError(f"The stream ended without {UI_MESSAGE_STREAM_END}.")

    async def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._token
        if callable(token):
            current = token()
            token = await current if inspect.isawaitable(current) else current
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return headers


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` of each server-sent event (its `data:` lines joined), ignoring other fields."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _error(response: httpx2.Response) -> BastionApiError:
    """The server's error body; a body that is not one (a proxy's page) gets the status's code."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    code, message, field = body.get("code"), body.get("message"), body.get("field")
    return BastionApiError(
        status=response.status_code,
        code=code if isinstance(code, str) else status_error_code(response.status_code),
        message=message if isinstance(message, str) else response.reason_phrase,
        field=field if isinstance(field, str) else None,
        retry_after=_retry_after(response.headers.get("retry-after")),
    )


def _retry_after(value: str | None) -> float | None:
    """`Retry-After` in seconds; bastion sends whole seconds (an HTTP date is not used)."""
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())


def _query(**values: int | str | datetime | None) -> dict[str, str]:
    return {
        name: value.isoformat() if isinstance(value, datetime) else str(value)
        for name, value in values.items()
        if value is not None
    }


def _body(model: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """A request body in the route's own type, unvalidated: the server decides and says what is wrong."""
    return model.model_construct(**fields).model_dump(mode="json", exclude_none=True)


def _segment(value: str) -> str:
    """An id as one path segment: a `/`, `?` or `..` in it cannot reach another route (the server
    answers a malformed id 404, like a foreign one)."""
    segment = quote(value, safe="")
    if segment in ("", ".", ".."):
        return segment.replace(".", "%2E") or "-"
    return segment
