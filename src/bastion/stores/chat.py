"""The chat route in one call: a store's conversations served to `useChat` by an agent.

`chat_routes(agent=..., store=..., model=..., context=...)` builds `POST /api/chat`, which claims the
turn (`start_agent_run`), prepares the agent's session for the caller's context, streams the turn as
the AI SDK UI message stream, and finishes and settles the run exactly once whatever happens: a
failure before the stream settles the run as failed, a closed tab lets the turn finish and save. The
lower-level pieces it is made of (`start_agent_run`, `Agent.prepare`, `AgentSession.stream`,
`create_agent_stream_response`) stay public for applications that need another shape.

The context factory receives a `ChatTurn`: plain data about who asks and for which conversation, so
a turn can build its context anywhere (a durable turn rebuilds it in the process that takes it over).
"""

from __future__ import annotations

import contextlib
import inspect
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, TypeAlias, TypeVar

from pydantic_ai.models import KnownModelName, Model
from starlette.requests import Request
from starlette.responses import Response

from bastion.agent import Agent
from bastion.api import EventStream, operation
from bastion.auth import Principal
from bastion.chat_request import UI_MESSAGE_CHUNK, UI_MESSAGE_STREAM_END, ChatRequest
from bastion.history import AgentHistoryConflictError, AgentMessagesInvalidError, reconcile_agent_messages
from bastion.persistence import AgentPersistence, AgentRun, start_agent_run
from bastion.stores._turns import check_storable_message
from bastion.stores.entities import Conversation, StoreIdentity, TurnContext, TurnState
from bastion.stores.errors import InvalidInputError, NotFoundError
from bastion.stream import StreamStatus, create_agent_stream_response
from bastion.worker import RequestContext, Route

__all__ = ["ChatEndpoint", "ChatStore", "ChatTurn", "ContextFactory", "chat_routes"]

ContextT = TypeVar("ContextT")

TITLE_LENGTH: Final = 80


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatTurn:
    """One chat turn: the verified caller, their store identity, the conversation they chat in and the
    run the turn claimed (`run_id` keys the turn's operations, such as the memories it writes)."""

    principal: Principal
    identity: StoreIdentity
    conversation_id: str
    request_id: str
    run_id: str


ContextFactory: TypeAlias = Callable[[ChatTurn], "ContextT | Awaitable[ContextT]"]
ModelChoice: TypeAlias = "Model | KnownModelName | str"


class ChatStore(Protocol):
    """What the chat route needs of a store (`PostgresStore` and `SqliteStore` both are one)."""

    def persistence(self, *, history_window: int = 100) -> AgentPersistence[TurnContext, TurnState]: ...

    async def create_conversation(
        self,
        identity: StoreIdentity,
        *,
        title: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
    ) -> Conversation[Any]: ...


class ChatEndpoint(Generic[ContextT]):
    """The chat route of one agent over one store; `routes()` lists what it serves."""

    def __init__(
        self,
        *,
        agent: Agent[ContextT],
        store: ChatStore,
        model: ModelChoice,
        context: ContextFactory[ContextT],
        persistence: AgentPersistence[TurnContext, TurnState] | None = None,
        history_window: int = 100,
        path: str = "/api/chat",
        create_conversations: bool = True,
        on_error: Callable[[Exception], str] | None = None,
    ) -> None:
        self.agent = agent
        self.store = store
        self.model = model
        self.context = context
        self.persistence = persistence or store.persistence(history_window=history_window)
        self.path = path.rstrip("/") or "/"
        self.create_conversations = create_conversations
        self.on_error = on_error

    def routes(self) -> list[Route]:
        """`POST {path}`: one turn of a conversation, answered with the UI message stream."""
        return [Route(method="POST", path=self.path, auth="user", handler=self.chat)]

    @operation(
        body=ChatRequest,
        responses={200: EventStream("The AI SDK UI message stream", UI_MESSAGE_CHUNK, UI_MESSAGE_STREAM_END)},
        errors=(403, 404, 409, 502),
    )
    async def chat(self, request: Request, context: RequestContext, *, body: ChatRequest) -> Response:
        """Run one turn of a conversation and answer with the AI SDK UI message stream."""
        principal = _principal(context)
        identity = StoreIdentity.from_principal(principal)
        claim = TurnContext(
            identity=identity, conversation_id=str(uuid.UUID(body.id)), request_id=str(uuid.uuid4())
        )
        run = await self._start_turn(claim, body)
        session = None
        try:
            # A closed tab does not stop the run: the reply is finished and saved for the next visit.
            turn = ChatTurn(
                principal=principal,
                identity=identity,
                conversation_id=claim.conversation_id,
                request_id=claim.request_id,
                run_id=run.state.run_id,
            )
            agent_context = await _resolved(self.context(turn))
            session = await self.agent.prepare(context=agent_context, execute_tool=run.execute_tool)
            result = await session.stream(model=self.model, messages=run.messages)
        except BaseException:
            if session is not None:
                await session.close()
            await run.finish(status="failed")
            raise
        opened = session

        async def on_finish(*, response_message: dict[str, Any], status: StreamStatus) -> None:
            await run.finish(response_message=response_message, status=status)

        async def on_settled(*, status: StreamStatus) -> None:
            try:
                await run.finish(status=status)
            finally:
                await opened.close()

        return create_agent_stream_response(
            result,
            original_messages=run.messages,
            on_finish=on_finish,
            on_settled=on_settled,
            on_error=self.on_error,
        )

    async def _start_turn(self, turn: TurnContext, body: ChatRequest) -> AgentRun[Any, Any]:
        """Claim the turn. A conversation's first message (the AI SDK client sends one message then)
        creates it for the caller, but only once it is known to be a message a conversation can start
        with, so a refused request stores nothing."""
        try:
            return await self._claim(turn, body)
        except NotFoundError:
            if not self.create_conversations or len(body.messages) != 1:
                raise
        await self._create_for_chat(turn, body)
        return await self._claim(turn, body)

    async def _claim(self, turn: TurnContext, body: ChatRequest) -> AgentRun[Any, Any]:
        return await start_agent_run(
            persistence=self.persistence, context=turn, messages=body.messages, trigger=body.trigger
        )

    async def _create_for_chat(self, turn: TurnContext, body: ChatRequest) -> None:
        """Create the conversation a valid first message starts. Anything but a new user message speaks
        of a history that is not there: not found. An id that is taken is left alone: the claim that
        follows answers 404 for anyone else's conversation."""
        try:
            [first] = await reconcile_agent_messages([], body.messages, trigger=body.trigger)
        except AgentMessagesInvalidError:
            raise
        except AgentHistoryConflictError:
            raise NotFoundError() from None
        check_storable_message(first)
        with contextlib.suppress(InvalidInputError):
            await self.store.create_conversation(
                turn.identity,
                conversation_id=turn.conversation_id,
                title=title_from([first]),
                agent_name=self.agent.name,
            )


def chat_routes(
    *,
    agent: Agent[ContextT],
    store: ChatStore,
    model: ModelChoice,
    context: ContextFactory[ContextT],
    persistence: AgentPersistence[TurnContext, TurnState] | None = None,
    history_window: int = 100,
    path: str = "/api/chat",
    create_conversations: bool = True,
    on_error: Callable[[Exception], str] | None = None,
) -> list[Route]:
    """The chat routes of `agent` over `store`, for `create_agent_worker(routes=...)`.

    `context(turn)` builds the agent's trusted context for each turn (it may be async).
    `persistence` defaults to `store.persistence(history_window=...)`. With `create_conversations`
    a conversation's first message creates it for the caller. `on_error(exc)` gives the text a
    client sees for a failed turn.
    """
    return ChatEndpoint(
        agent=agent,
        store=store,
        model=model,
        context=context,
        persistence=persistence,
        history_window=history_window,
        path=path,
        create_conversations=create_conversations,
        on_error=on_error,
    ).routes()


def title_from(messages: Sequence[Any]) -> str | None:
    """A new conversation's title: the start of its latest user text."""
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            parts = message.get("parts")
            for part in parts if isinstance(parts, list) else ():
                if (
                    isinstance(part, Mapping)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    text = " ".join(part["text"].split())
                    return text[:TITLE_LENGTH] or None
    return None


def _principal(context: RequestContext) -> Principal:
    if context.principal is None:
        raise RuntimeError("A user route ran without a verified principal.")
    return context.principal


async def _resolved(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
