"""The chat route in one call: a store's conversations served to `useChat` by an agent.

`chat_routes(agent=..., store=..., model=..., context=...)` builds `POST /api/chat`, which claims the
turn (`start_agent_run`), prepares the agent's session for the caller's context, streams the turn as
the AI SDK UI message stream, and finishes and settles the run exactly once whatever happens
(`bastion.chat.turn_lifecycle`): a failure before the stream settles the run as failed, a closed tab
lets the turn finish and save. The lower-level pieces it is made of (`start_agent_run`,
`Agent.prepare`, `AgentSession.stream`, `create_agent_stream_response`) stay public for applications
that need another shape.

The context factory receives a `ChatTurn`: plain data about who asks and for which conversation, so
a turn can build its context anywhere (a durable turn rebuilds it in the process that takes it over).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Final, Generic, TypeAlias, TypedDict, TypeVar, Unpack

from pydantic import BaseModel, ConfigDict, Field
from pydantic_ai.models import KnownModelName, Model
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from bastion.agent import Agent
from bastion.api import EventStream, StrictModel, json_response, operation
from bastion.auth import Principal
from bastion.chat.request import UI_MESSAGE_CHUNK, UI_MESSAGE_STREAM_END, ChatRequest
from bastion.chat.stream_response import (
    UI_MESSAGE_STREAM_HEADERS,
    AgentStreamResponse,
    StreamStatus,
    create_agent_stream_response,
)
from bastion.chat.tool_errors import tools_refusal
from bastion.chat.turn import ChatTurn, DurableTurnHooks
from bastion.chat.turn_lifecycle import TurnLifecycle
from bastion.drain import Drain
from bastion.history import AgentHistoryConflictError, AgentMessagesInvalidError, reconcile_agent_messages
from bastion.persistence import AgentPersistence, AgentRun, start_agent_run, start_new_conversation_run
from bastion.stores._turn_persistence import check_storable_message
from bastion.stores.entities import StoreIdentity, TurnContext, TurnState, title_from_text
from bastion.stores.errors import InvalidInputError, NotFoundError
from bastion.stores.live import ChunkLog, FollowedRun, LiveTurns, StreamInterrupted, StreamSuperseded
from bastion.stores.protocol import LiveTurnStore, Store
from bastion.worker import RequestContext, Route

if TYPE_CHECKING:
    from bastion.chat.durable_turns import DurableTurns
    from bastion.durable import DurableEngine

__all__ = [
    "AfterTurn",
    "ChatEndpoint",
    "ChatOptions",
    "ChatStore",
    "ContextFactory",
    "LiveTurnStore",
    "ResumeQuery",
    "StopResult",
    "chat_routes",
]

ContextT = TypeVar("ContextT")

logger = logging.getLogger("bastion.stores.chat")  # Its name from before the move, which log settings name.

TITLE_LENGTH: Final = 80
_SETTLE_POLL_SECONDS: Final = 0.05


ContextFactory: TypeAlias = Callable[[ChatTurn], "ContextT | Awaitable[ContextT]"]
AfterTurn: TypeAlias = Callable[[ChatTurn, list[dict[str, Any]], "ContextT"], Awaitable[None]]
"""`after_turn(turn, messages, context)`: called once a turn completed and was saved, with the
conversation's messages as the turn ended (`AgentMemory.after_chat_turn` enqueues extraction)."""
ModelChoice: TypeAlias = "Model | KnownModelName | str"


# What the chat route needs of a store: the one `Store` protocol both stores implement.
ChatStore: TypeAlias = Store


class StopResult(StrictModel):
    """The turn a stop was asked of, and whether it settled within the wait."""

    runId: str
    settled: bool


class ResumeQuery(BaseModel):
    """The resume request's query (unknown parameters are ignored)."""

    model_config = ConfigDict(extra="ignore")

    resetStep: Annotated[
        str | None,
        Field(max_length=10, description="`1` (AI SDK 7): retract a step a taken-over turn re-runs."),
    ] = None


class ChatOptions(TypedDict, Generic[ContextT], total=False):
    """The chat route's optional settings, taken by `chat_routes` and `ChatEndpoint` alike.

    - `persistence`: how turns are stored; default `store.persistence(history_window=...)`
      (`history_window`, default 100: how many stored messages a turn reads).
    - `path` (default `/api/chat`): where the route is served.
    - `create_conversations` (default True): a conversation's first message creates it for the caller.
    - `on_error(exc)`: the text a client sees for a failed turn.
    - `stop_wait_seconds` (default 10): how long a stop waits for the turn to settle (stores with live
      turns, such as `PostgresStore`, add the stop and resume routes).
    - `usage_metadata` (default False): the `finish` chunk's `messageMetadata` (and so the stored
      message's `metadata`) carries the turn's token usage (see `create_agent_stream_response`).
    - `durable` (a launched `bastion.durable.DurableEngine`, Postgres store only): every turn runs as
      a durable workflow: when its process dies, a live one takes it over and finishes it from its
      last completed model request (`durable_name` names the endpoint across processes; default from
      the agent's name and the path). See `bastion.chat.durable_turns`.
    - `drain` (a `bastion.drain.Drain`, shared with the process's other endpoints and its `GET /ready`):
      counts the turns and, once started, refuses new ones with 503 `draining`, for a worker that stops
      without cutting replies short (`bastion.draining_server`).
    - `after_turn(turn, messages, context)`: runs once a turn completed and was saved, before the turn
      settles (a durable turn's workflow still covers it), in the process that finished the turn; it
      never fails the turn. `AgentMemory.after_chat_turn` queues the turn's memory extraction there.
    """

    persistence: AgentPersistence[TurnContext, TurnState] | None
    history_window: int
    path: str
    create_conversations: bool
    on_error: Callable[[Exception], str] | None
    stop_wait_seconds: float
    usage_metadata: bool
    durable: DurableEngine | None
    durable_name: str | None
    drain: Drain | None
    after_turn: AfterTurn[ContextT] | None


class ChatEndpoint(Generic[ContextT]):
    """The chat route of one agent over one store; `routes()` lists what it serves."""

    def __init__(
        self,
        *,
        agent: Agent[ContextT],
        store: ChatStore,
        model: ModelChoice,
        context: ContextFactory[ContextT],
        **options: Unpack[ChatOptions[ContextT]],
    ) -> None:
        self.agent = agent
        self.store = store
        self.model = model
        self.context = context
        persistence = options.get("persistence")
        self.persistence = persistence or store.persistence(history_window=options.get("history_window", 100))
        self.path = options.get("path", "/api/chat").rstrip("/") or "/"
        self.create_conversations = options.get("create_conversations", True)
        self.on_error = options.get("on_error")
        self.stop_wait_seconds = options.get("stop_wait_seconds", 10.0)
        self.usage_metadata = options.get("usage_metadata", False)
        # Counts this endpoint's turns and refuses new ones once the process is stopping.
        drain = options.get("drain")
        self.drain = drain if drain is not None else Drain()
        self.after_turn = options.get("after_turn")
        self.live: LiveTurns | None = store.live_turns() if isinstance(store, LiveTurnStore) else None
        self.durable: DurableTurns | None = None
        durable = options.get("durable")
        if durable is not None:
            from bastion.chat.durable_turns import DurableTurns

            self.durable = DurableTurns(self, durable, name=options.get("durable_name"))
            self.drain.on_start(durable.stop_taking_work)

    def routes(self) -> list[Route]:
        """`POST {path}`: one turn of a conversation, answered with the UI message stream; with a store
        that has live turns, `POST {path}/{id}/stop` and `GET {path}/{id}/stream` (AI SDK resume).
        Each is served at `{path}` (the AI SDK's `/api/chat`) and under the API's version prefix."""
        handlers: list[tuple[str, str, Any]] = [("POST", self.path, self.chat)]
        if self.live is not None:
            handlers += [
                ("POST", f"{self.path}/{{id}}/stop", self.stop),
                ("GET", f"{self.path}/{{id}}/stream", self.resume),
            ]
        # Where the AI SDK's transport finds them, as well as under the API's version prefix.
        return [
            Route(method=method, path=path, auth="user", handler=handler, keep_declared_path=True)
            for method, path, handler in handlers
        ]

    @operation(
        body=ChatRequest,
        responses={200: EventStream("The AI SDK UI message stream", UI_MESSAGE_CHUNK, UI_MESSAGE_STREAM_END)},
        errors={403: (), 404: (), 409: (), 502: (), 503: ("draining",)},
    )
    async def chat(self, request: Request, context: RequestContext, *, body: ChatRequest) -> Response:
        """Run one turn of a conversation and answer with the AI SDK UI message stream; 503 `draining`
        (nothing stored) once this worker is stopping."""
        principal = context.require_principal()
        admitted = self.drain.admit()  # counted until its turn opens, which counts it until it settles
        try:
            return await self._chat(principal, body)
        finally:
            admitted.release()

    async def _chat(self, principal: Principal, body: ChatRequest) -> Response:
        identity = StoreIdentity.from_principal(principal)
        claim = TurnContext(
            identity=identity, conversation_id=str(uuid.UUID(body.id)), request_id=str(uuid.uuid4())
        )
        run = await self._start_turn(claim, body)
        turn = ChatTurn(
            principal=principal,
            identity=identity,
            conversation_id=claim.conversation_id,
            request_id=claim.request_id,
            run_id=run.state.run_id,
        )
        if self.durable is not None:
            return await self.durable.respond(turn, run)
        return await self.open_turn(turn, run)

    async def open_turn(
        self, turn: ChatTurn, run: AgentRun[Any, Any], *, durable: DurableTurnHooks | None = None
    ) -> AgentStreamResponse:
        """The claimed turn `run` as a stream response: context, prepared session, stream, settlement.

        A failure before the stream settles the run as failed. `durable` is what a durable turn
        adds (`bastion.durable`): its model steps, its tool hook, its message id and its runner.
        """
        held = contextlib.ExitStack()
        held.callback(self.drain.hold().release)
        lifecycle = TurnLifecycle(run, release=held.close)
        stop: asyncio.Event | None = None
        log: ChunkLog | None = None
        try:
            if self.live is not None:
                stop = held.enter_context(self.live.stop_signal(run.state.run_id))
                checkpoints = durable.checkpoints if durable is not None else None
                log = self.live.log(
                    turn.identity, run.state.run_id, on_stop=stop.set, checkpoints=checkpoints
                )
                carried = getattr(self.persistence, "carries_stream_logs", False)
                if carried and isinstance(run.state, TurnState):
                    # The run's tool claims and its close store the log: no transactions of its own.
                    run.state.log = log
                    log.carried = True
            if durable is not None:
                durable.attach(log)
            # A closed tab does not stop the run: the reply is finished and saved for the next visit.
            result = await lifecycle.open(
                self.agent,
                context=lambda: _resolved(self.context(turn)),
                model=self.model,
                messages=run.messages,
                cancel=stop,
                execute_tool=run.execute_tool if durable is None else durable.execute_tool(run.execute_tool),
                steps=durable.steps if durable is not None else None,
            )
        except BaseException as error:
            await lifecycle.settle(status="failed")
            refusal = tools_refusal(error)
            if refusal is not None:
                raise refusal from error
            raise

        async def on_finish(*, response_message: dict[str, Any], status: StreamStatus) -> None:
            await lifecycle.finish(response_message=response_message, status=status)
            if status == "completed":
                messages = _ended_with(run.messages, response_message)
                await self._after_turn(turn, messages, lifecycle.context)

        async def on_settled(*, status: StreamStatus) -> None:
            await lifecycle.settle(status=status)

        return create_agent_stream_response(
            result,
            original_messages=run.messages,
            on_finish=on_finish,
            on_settled=on_settled,
            on_error=self.on_error,
            usage_metadata=self.usage_metadata,
            log=log,
            message_id=durable.message_id if durable is not None else None,
            runner=durable.runner if durable is not None else None,
        )

    @operation(
        responses={200: StopResult, 202: StopResult, 204: None},
        errors=(404,),
    )
    async def stop(self, request: Request, context: RequestContext) -> Response:
        """Stop the conversation's running turn, in whichever process runs it.

        The turn settles as cancelled with what it streamed so far. Answers 200 once it settled, 202
        when it was asked but has not settled within `stop_wait_seconds`, 204 when none was running.
        """
        live, identity, conversation_id = self._live_conversation(context)
        run_id = await live.request_stop(identity, conversation_id)
        if run_id is None:
            return Response(status_code=204)
        deadline = asyncio.get_running_loop().time() + self.stop_wait_seconds
        while True:
            current = await live.live_run(identity, conversation_id)
            if current is None or current.run_id != run_id:
                return json_response(StopResult(runId=run_id, settled=True))
            if asyncio.get_running_loop().time() >= deadline:
                return json_response(StopResult(runId=run_id, settled=False), status_code=202)
            await asyncio.sleep(_SETTLE_POLL_SECONDS)

    @operation(
        responses={
            200: EventStream("The running turn's UI message stream", UI_MESSAGE_CHUNK, UI_MESSAGE_STREAM_END),
            204: None,
        },
        query=ResumeQuery,
        errors=(404, 429),
    )
    async def resume(self, request: Request, context: RequestContext, *, query: ResumeQuery) -> Response:
        """The AI SDK resume protocol: 204 when no turn is in flight, else the current turn's UI message
        stream from its start, then live until it ends. `?resetStep=1` (AI SDK 7) retracts a step a
        taken-over turn re-runs with `reset-step`; otherwise the response closes and the client resumes.
        A user (or a turn) with as many followers as the store allows gets 429 `too_many_followers`
        with `Retry-After`."""
        live, identity, conversation_id = self._live_conversation(context)
        current = await live.live_run(identity, conversation_id)
        if current is None:
            return Response(status_code=204)
        # Past the caps (`FollowerLimits`) this refuses with 429 before anything is streamed.
        followed = live.follow(identity, current.run_id, reset_step=query.resetStep == "1")
        return _FollowerResponse(followed)

    @property
    def runs_after_turn(self) -> bool:
        return self.after_turn is not None

    async def after_saved_turn(
        self, turn: ChatTurn, messages: list[dict[str, Any]], response_message: dict[str, Any]
    ) -> None:
        """`after_turn` for a completed turn another process saved: a durable turn whose process died
        between its save and its `after_turn` (an extraction job enqueued already is not enqueued twice)."""
        if self.after_turn is None:
            return
        try:
            context = await _resolved(self.context(turn))
        except Exception:
            logger.exception("Building the context of saved run %s failed; no after_turn.", turn.run_id)
            return
        await self._after_turn(turn, _ended_with(messages, response_message), context)

    async def _after_turn(self, turn: ChatTurn, messages: list[dict[str, Any]], context: ContextT) -> None:
        """Run `after_turn` for a saved turn: a failure is logged, never the turn's."""
        if self.after_turn is None:
            return
        try:
            await self.after_turn(turn, messages, context)
        except Exception:
            logger.exception("after_turn failed for run %s; the turn is saved.", turn.run_id)

    def _live_conversation(self, context: RequestContext) -> tuple[LiveTurns, StoreIdentity, str]:
        """The live turns, the caller and the conversation a stop or a resume names (404 without them)."""
        if self.live is None:
            raise NotFoundError()
        return self.live, StoreIdentity.from_principal(context.require_principal()), _conversation_id(context)

    async def _start_turn(self, turn: TurnContext, body: ChatRequest) -> AgentRun[Any, Any]:
        """Claim the turn. A conversation's first message (the AI SDK client sends one message then)
        creates it for the caller before the claim, but only once it is known to be a message a
        conversation can start with, so a refused request stores nothing (and a new conversation
        costs no claim refused first)."""
        first = None
        if self.create_conversations and len(body.messages) == 1:
            first = await _starting_message(body)
            if first is not None:
                run = await start_new_conversation_run(
                    persistence=self.persistence,
                    context=turn,
                    messages=body.messages,
                    trigger=body.trigger,
                    title=title_from([first]),
                    agent_name=self.agent.name,
                )
                if run is not None:  # created and claimed at once (one round trip on Postgres)
                    return run
                await self._create(turn, first)
        try:
            return await self._claim(turn, body)
        except NotFoundError:
            if first is not None or not self.create_conversations or len(body.messages) != 1:
                raise
        await self._create_for_chat(turn, body)
        return await self._claim(turn, body)

    async def _claim(self, turn: TurnContext, body: ChatRequest) -> AgentRun[Any, Any]:
        return await start_agent_run(
            persistence=self.persistence, context=turn, messages=body.messages, trigger=body.trigger
        )

    async def _create_for_chat(self, turn: TurnContext, body: ChatRequest) -> None:
        """Create the conversation a valid first message starts. Anything but a new user message speaks
        of a history that is not there: not found."""
        try:
            [first] = await reconcile_agent_messages([], body.messages, trigger=body.trigger)
        except AgentMessagesInvalidError:
            raise
        except AgentHistoryConflictError:
            raise NotFoundError() from None
        check_storable_message(first)
        await self._create(turn, first)

    async def _create(self, turn: TurnContext, first: Mapping[str, Any]) -> None:
        """Create the conversation `first` starts. An id that is taken is left alone: the claim that
        follows answers 404 for anyone else's conversation."""
        with contextlib.suppress(InvalidInputError):
            await self.store.create_conversation(
                turn.identity,
                conversation_id=turn.conversation_id,
                title=title_from([first]),
                agent_name=self.agent.name,
            )


async def _starting_message(body: ChatRequest) -> Mapping[str, Any] | None:
    """The request's one message when a conversation can start with it, else None (the claim decides)."""
    try:
        [first] = await reconcile_agent_messages([], body.messages, trigger=body.trigger)
        check_storable_message(first)
    except (AgentMessagesInvalidError, AgentHistoryConflictError, InvalidInputError):
        return None
    return first


def chat_routes(
    *,
    agent: Agent[ContextT],
    store: ChatStore,
    model: ModelChoice,
    context: ContextFactory[ContextT],
    **options: Unpack[ChatOptions[ContextT]],
) -> list[Route]:
    """The chat routes of `agent` over `store`, for `create_agent_worker(routes=...)`.

    `context(turn)` builds the agent's trusted context for each turn (it may be async). The optional
    settings (persistence, path, stop and resume, durable turns, drain, `after_turn`…) are
    `ChatOptions`, the same as `ChatEndpoint`'s.
    """
    return ChatEndpoint(agent=agent, store=store, model=model, context=context, **options).routes()


def _ended_with(messages: list[dict[str, Any]], response: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation's messages with the turn's response: replacing the message it continued (an
    approval's answer continues the assistant's message), else after them."""
    kept = [message for message in messages if message.get("id") != response.get("id")]
    return [*kept, response]


class _FollowerResponse(StreamingResponse):
    """A follower's stream as SSE; its place is freed as soon as the response ends, whether the stream
    ended, the client left or the response never started."""

    def __init__(self, followed: FollowedRun) -> None:
        super().__init__(_grouped_events(followed.groups()), headers=dict(UI_MESSAGE_STREAM_HEADERS))
        self.followed = followed

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.followed.aclose()


async def _events(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """SSE events of a followed stream, one write per chunk."""
    async for event in _grouped_events([chunk] async for chunk in chunks):
        yield event


async def _grouped_events(groups: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    """SSE events of a followed stream, one write per group of chunks (what one read of the log brought:
    a follower costs a write per read, not per chunk). A stream the reader cannot retract ends without
    `[DONE]`: the client sees it cut short and resumes, and the replay it then reads is whole."""
    try:
        async for chunks in groups:
            yield b"".join(
                b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
                for chunk in chunks
            )
    except StreamSuperseded:
        logger.info("A resumed stream was superseded by a take-over; the client replays it.")
        return
    except StreamInterrupted:
        logger.info("A resumed stream's reader stopped with its store; the client resumes it.")
        return
    yield b"data: [DONE]\n\n"


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
                    return title_from_text(text, max_length=TITLE_LENGTH)
    return None


def _conversation_id(context: RequestContext) -> str:
    """A malformed id is not found, like a foreign one: ids cannot be probed by their shape."""
    try:
        return str(uuid.UUID(str(context.params.get("id"))))
    except ValueError:
        raise NotFoundError() from None


async def _resolved(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
