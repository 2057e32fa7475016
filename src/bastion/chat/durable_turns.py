"""Durable chat turns: one turn is one DBOS workflow, and a live process finishes a dead one's turns.

`ChatEndpoint(..., durable=engine)` (or `chat_routes(durable=...)`) runs every turn, and every
approval continuation, as the workflow `bastion.turn` with the id `bastion.turn:{conversation}:{run}`.
Its input is plain data: the endpoint's name, the verified principal, the conversation, request and
run ids, the run's state, the messages the turn runs on and the response message's id.

- The fast path has no queue and does not wait on DBOS: the POST claims the run as before and the
  turn streams in the response's task at once, while the workflow's row is written beside it. The
  workflow's body finds the turn's step recorder (registered under its id) and records the model
  requests the turn hands it, ending with the turn; the stream log's next write then marks the run
  durable.
- Each model request is a DBOS step (`bastion.turn.model_request`) whose output is the response and
  the chunks it produced. A first execution records it when it ends, and only what depends on it
  waits for the record: its tools' side effects and the turn's save. A taken-over execution runs each
  request as the step's body, so a recorded one re-yields its chunks without asking the model again.
  Tools are not steps: their exactly-once guarantee stays the operation claim
  (`AgentRun.execute_tool`), which replays a completed call's stored output and refuses one whose
  outcome is unknown (unless the tool is idempotent).
- When the process dies, another process's janitor (`DurableEngine`) hands the workflow to a live
  process. Finding no local turn, the body rebuilds it from its input (principal, `ChatTurn`, the
  context factory, `agent.prepare`, `session.stream`), adopts the run (`adopt_run`: only while the
  run is still the conversation's running turn and its process is dead) and runs it headless from
  the start of its stream log, where replayed chunks overlap what is logged. At the first thing that
  is not a replay (a model request that runs, a tool that runs or fails), the log starts a new
  attempt, superseding what the dead process logged from there on. Then the run finishes as usual.

A retried POST meets the run it started as busy (409 with `Retry-After`: a durable run stays live
until its lease ends, even while its process is dead) and resumes with `GET …/stream`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from dbos import DBOS
from dbos._error import DBOSNonExistentWorkflowError
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse

from bastion._cancel import AgentCancelledError
from bastion._turn_plan import ExecuteToolHook
from bastion._ui_chunks import Chunk
from bastion.auth import Principal
from bastion.chat.stream_response import AgentStreamResponse, TurnRunner
from bastion.chat.turn import ChatTurn, TurnOpener
from bastion.durable.turn_workflow import (
    TURN_WORKFLOWS,
    WORKFLOW_NAME,
    DurableTurnError,
    model_request_step,
    start_turn_workflow,
    turn_workflow_id,
)
from bastion.persistence import AgentRun, RunStart
from bastion.stores.entities import StoreIdentity, TurnContext, TurnState
from bastion.stores.live import ChunkLog
from bastion.stores.postgres import PostgresAgentPersistence, PostgresStore
from bastion.tools import CallOrigin

if TYPE_CHECKING:
    from bastion.durable.engine import DurableEngine

__all__ = ["DurableTurnError", "DurableTurns", "prune_finished_turns", "turn_workflow_id"]

logger = logging.getLogger("bastion.durable")

_IDS: Final = uuid.UUID("0f3c2d9a-41b7-4e0c-8a5e-6b1d7c2e9f48")


async def prune_finished_turns(store: PostgresStore, *, older_than: timedelta) -> tuple[int, int]:
    """Retention: delete the turn workflows (their inputs hold the conversation) and the stream logs
    of turns that ended more than `older_than` ago. Returns (workflows, log rows) deleted. Needs this
    process's launched engine; run it now and then from one worker or a job."""
    cutoff = (datetime.now(UTC) - older_than).isoformat()
    finished = await DBOS.list_workflows_async(
        name=WORKFLOW_NAME,
        status=["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"],
        completed_before=cutoff,
        load_input=False,
        load_output=False,
    )
    ids = [workflow.workflow_id for workflow in finished]
    if ids:
        await DBOS.delete_workflows_async(ids)
    return len(ids), await store.prune_run_chunks(older_than=older_than)


class DurableTurns:
    """The durable side of one `ChatEndpoint`: registered by name in this process
    (`bastion.durable.turn_workflow`), so a workflow taken over from another process finds what
    rebuilds its turn. It drives the endpoint's turn through `TurnOpener` only."""

    def __init__(self, endpoint: TurnOpener, engine: DurableEngine, *, name: str | None) -> None:
        persistence = endpoint.persistence
        if not isinstance(persistence, PostgresAgentPersistence):
            raise DurableTurnError(
                "Durable turns need the Postgres store (PostgresStore): a turn outlives its process only "
                "when another process can take it over from the shared database. The SQLite store "
                "serves one process; use it without durable=."
            )
        if endpoint.live is None:
            raise DurableTurnError("Durable turns need a store with live turns (PostgresStore).")
        self.endpoint = endpoint
        self.engine = engine
        self.name = name or f"{endpoint.agent.name}:{endpoint.path}"
        TURN_WORKFLOWS.register(self.name, self)

    async def respond(self, turn: ChatTurn, run: AgentRun[Any, Any]) -> AgentStreamResponse:
        """The fast path: the claimed turn's response, streaming at once while its workflow starts.

        The turn runs in the response's task and asks the model without waiting on DBOS. Its
        workflow's row is written meanwhile; the workflow's body then records the turn's model steps
        as the turn hands them over (DBOS records a step only from its workflow's task) and ends
        with the turn. The run is marked durable by the stream log's next write once the workflow
        exists: a process that died before that leaves a run a newer turn replaces at once.
        """
        persistence, context = self._persistence, _context(turn)
        recorder = _StepRecorder()
        hooks = _TurnHooks(persistence, context, run, recorder=recorder)
        workflow_id = turn_workflow_id(turn.conversation_id, turn.run_id)
        attached = TURN_WORKFLOWS.attach(workflow_id)
        starting = asyncio.ensure_future(
            start_turn_workflow(workflow_id, self._input(turn, run, hooks.message_id))
        )

        async def made_durable() -> Any:
            try:
                handle = await starting
            except Exception:
                TURN_WORKFLOWS.detach(workflow_id)
                recorder.unavailable()
                logger.exception("Starting a durable turn failed; it runs without durability.")
                return None
            attached.set_result(recorder)
            hooks.mark_durable()
            return handle

        async def runner(run_turn: Callable[[], Awaitable[None]]) -> None:
            marking = asyncio.ensure_future(made_durable())
            try:
                await run_turn()
            finally:
                recorder.close()
                handle = await marking
                if handle is not None:
                    try:
                        await handle.get_result()
                    except DBOSNonExistentWorkflowError:
                        pass  # A conversation deleted meanwhile took its turns' workflows with it.
                    except Exception:
                        # Recording failed (see `_StepRecorder.serve`): the turn ran on without it.
                        logger.warning("A durable turn's workflow failed.", exc_info=True)

        hooks.runner = runner
        try:
            return await self.endpoint.open_turn(turn, run, durable=hooks)
        except BaseException:
            recorder.close()  # the turn failed (and settled) before it streamed
            attached.set_result(recorder)
            raise

    async def take_over(self, workflow_input: dict[str, Any]) -> str:
        """The recovery path: rebuild the turn from its input, adopt its run and run it headless."""
        principal = _principal(workflow_input["principal"])
        identity = StoreIdentity.from_principal(principal)
        turn = ChatTurn(
            principal=principal,
            identity=identity,
            conversation_id=workflow_input["conversation_id"],
            request_id=workflow_input["request_id"],
            run_id=workflow_input["run_id"],
        )
        context = _context(turn)
        state = TurnState(
            conversation_id=turn.conversation_id,
            run_id=turn.run_id,
            revision=int(workflow_input["revision"]),
            pending_approval_ids=frozenset(workflow_input["pending_approval_ids"]),
        )
        persistence = self._persistence
        if not await persistence.adopt_run(context, state):
            logger.info("The durable turn of run %s was settled or replaced; nothing to do.", turn.run_id)
            return "superseded"
        start = RunStart(messages=workflow_input["messages"], state=state, operation_scope=turn.run_id)
        run = AgentRun(persistence=persistence, context=context, start=start)
        hooks = _TurnHooks(persistence, context, run, message_id=workflow_input["message_id"])
        response = await self.endpoint.open_turn(turn, run, durable=hooks)
        await response.run_detached()
        return "taken_over"

    @property
    def _persistence(self) -> PostgresAgentPersistence:
        persistence = self.endpoint.persistence
        assert isinstance(persistence, PostgresAgentPersistence)
        return persistence

    def _input(self, turn: ChatTurn, run: AgentRun[Any, Any], message_id: str) -> dict[str, Any]:
        principal = turn.principal
        state: TurnState = run.state
        return {
            "endpoint": self.name,
            "principal": {
                "id": principal.id,
                "role": principal.role,
                "email": principal.email,
                "is_anonymous": principal.is_anonymous,
                "aal": principal.aal,
                "session_id": principal.session_id,
                "tenant_id": principal.tenant_id,
                "roles": list(principal.roles),
                "claims": dict(principal.claims),
            },
            "conversation_id": turn.conversation_id,
            "request_id": turn.request_id,
            "run_id": turn.run_id,
            "revision": state.revision,
            "pending_approval_ids": sorted(state.pending_approval_ids),
            "messages": run.messages,
            "message_id": message_id,
        }


class _TurnHooks:
    """One durable turn's additions to the chat route: its model steps, its tool hook (which marks
    where a taken-over turn stops replaying), its deterministic message id and its runner."""

    def __init__(
        self,
        persistence: PostgresAgentPersistence,
        context: TurnContext,
        run: AgentRun[Any, Any],
        *,
        message_id: str | None = None,
        recorder: _StepRecorder | None = None,
    ) -> None:
        self._persistence = persistence
        self._context = context
        self._run = run
        # A first execution hands its steps to its recorder. Only a taken-over one (no recorder) has
        # an earlier attempt in the log to supersede; a first one writes no reset (each would cost
        # the log a write of its own).
        self._taken_over = recorder is None
        self._recorder = recorder
        run_id: str = run.state.run_id
        self.message_id = message_id or uuid.uuid5(_IDS, run_id).hex
        self.runner: TurnRunner | None = None
        self._log: ChunkLog | None = None
        self.steps = _ModelSteps(run_id, self._new_attempt, self._record_results, recorder=recorder)

    def attach(self, log: ChunkLog | None) -> None:
        self._log = log

    def mark_durable(self) -> None:
        """The workflow exists: the run's stream log marks it durable with its next write."""
        if self._log is not None:
            self._log.mark_durable()

    async def before_save(self) -> None:
        """The turn is saved next: its model requests are recorded first, so a worker that dies
        while saving leaves a turn whose take-over replays every request."""
        if self._recorder is not None:
            await self._recorder.settled()

    def _new_attempt(self) -> None:
        """What follows is produced afresh: it supersedes whatever an earlier attempt logged from here."""
        if self._log is not None and self._taken_over:
            self._log.reset()

    async def _record_results(self) -> None:
        await self._persistence.record_tool_results(self._context, self._run.state)

    def execute_tool(self, hook: ExecuteToolHook) -> ExecuteToolHook:
        async def execute_tool(
            *,
            name: str,
            tool_call_id: str,
            input: Any,
            execute: Callable[[str], Awaitable[Any]],
            origin: CallOrigin,
            idempotent: bool,
        ) -> Any:
            async def run_it(key: str) -> Any:
                if self._recorder is not None:
                    await self._recorder.settled()  # the request that called this tool is recorded
                self._new_attempt()
                return await execute(key)

            try:
                return await hook(
                    name=name,
                    tool_call_id=tool_call_id,
                    input=input,
                    execute=run_it,
                    origin=origin,
                    idempotent=idempotent,
                )
            except Exception:
                self._new_attempt()  # a refusal (an outcome unknown) is not what a dead attempt logged
                raise

        return execute_tool


class _ModelSteps:
    """`ModelSteps` on DBOS: each model request of a turn is a step.

    A first execution of a turn streams each request straight from the model and records it as a
    step when it ends, before anything depends on it (its tools, the turn's save): the model is
    asked at once, without waiting on DBOS's check for a recorded result, which a first execution
    cannot have. An execution taking over runs each request as the step's body, so a recorded
    request is replayed without the model and an unrecorded one (in flight when its worker died)
    is asked again, starting a new attempt in the stream log.
    """

    def __init__(
        self,
        id_seed: str,
        new_attempt: Callable[[], None],
        before_request: Callable[[], Awaitable[None]],
        *,
        recorder: _StepRecorder | None,
    ) -> None:
        self.id_seed = id_seed
        self._new_attempt = new_attempt
        self._before_request = before_request
        self._recorder = recorder

    def request(
        self,
        step: int,
        produce: Callable[[], AsyncIterator[Chunk]],
        response: list[ModelResponse],
    ) -> AsyncIterator[Chunk]:
        if self._recorder is None:
            return self._replayable(produce, response)
        return self._first(self._recorder, produce, response)

    async def _first(
        self,
        recorder: _StepRecorder,
        produce: Callable[[], AsyncIterator[Chunk]],
        response: list[ModelResponse],
    ) -> AsyncIterator[Chunk]:
        # The results this request sees are written while it runs, and before its step is recorded:
        # a recorded request never saw a result the store lacks.
        results = asyncio.ensure_future(self._before_request())
        chunks: list[Chunk] = []
        failure: BaseException | None = None
        outcome = "completed"
        try:
            async for chunk in produce():
                chunks.append(chunk)
                yield chunk
        except AgentCancelledError as error:
            failure, outcome = error, "cancelled"
        except Exception as error:
            failure, outcome = error, "failed"
        finally:
            if not results.done():
                await asyncio.wait([results])
        results.result()
        recorder.hand_over(_recorded(outcome, chunks, response))
        if failure is not None:
            raise failure

    async def _replayable(
        self, produce: Callable[[], AsyncIterator[Chunk]], response: list[ModelResponse]
    ) -> AsyncIterator[Chunk]:
        live: asyncio.Queue[Chunk | None] = asyncio.Queue()
        failure: list[BaseException] = []

        async def body() -> dict[str, Any]:
            self._new_attempt()
            await self._before_request()
            chunks: list[Chunk] = []
            outcome = "completed"
            try:
                async for chunk in produce():
                    chunks.append(chunk)
                    live.put_nowait(chunk)
            except AgentCancelledError:
                outcome = "cancelled"
            except Exception as error:
                failure.append(error)
                outcome = "failed"
            return _recorded(outcome, chunks, response)

        task = asyncio.ensure_future(model_request_step(body))
        task.add_done_callback(lambda _: live.put_nowait(None))
        sent = 0
        try:
            while (chunk := await live.get()) is not None:
                sent += 1
                yield chunk
            recorded = await task
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for chunk in recorded["chunks"][sent:]:
            yield chunk
        if recorded["outcome"] == "cancelled":
            raise AgentCancelledError
        if recorded["outcome"] == "failed":
            if failure:
                raise failure[0]
            raise DurableTurnError("The model request failed in an earlier execution of this turn.")
        if not response:
            [replayed] = ModelMessagesTypeAdapter.validate_json(recorded["response"])
            assert isinstance(replayed, ModelResponse)
            response.append(replayed)


class _StepRecorder:
    """Records a first execution's model steps from its workflow's task, where DBOS records steps.

    The turn streams in the response's task and `hand_over`s each finished request; the workflow's
    body `serve`s the hand-overs in order until the turn `close`s. Only what depends on a record
    waits for it (`settled`): a tool's side effect, so a request whose tools ran is replayed, never
    asked again; and the turn's save, so a worker dying while it saves leaves every request
    recorded. So a request's record is written beside its tools' claims, or its turn's final
    writes, off the path to the next token. When the workflow could not start, the recorder is
    `unavailable` and records nothing: the turn runs without durability.
    """

    def __init__(self) -> None:
        self._requests: asyncio.Queue[tuple[dict[str, Any], asyncio.Future[None]] | None] = asyncio.Queue()
        self._pending: list[asyncio.Future[None]] = []
        self._available = True

    def hand_over(self, recorded: dict[str, Any]) -> None:
        if not self._available:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(done)
        self._requests.put_nowait((recorded, done))

    async def settled(self) -> None:
        """Wait until every request handed over is recorded; raises what recording one raised."""
        pending, self._pending = self._pending, []
        for done in pending:
            await done

    def unavailable(self) -> None:
        """Record nothing more, and release whatever waits for a record (handed over or queued)."""
        self._available = False
        waiting = list(self._pending)
        while not self._requests.empty():
            request = self._requests.get_nowait()
            if request is not None:
                waiting.append(request[1])
        for done in waiting:
            if not done.done():
                done.set_result(None)

    def close(self) -> None:
        self._requests.put_nowait(None)

    async def serve(self) -> None:
        """Record the hand-overs until the turn closes. When recording fails (the database went away
        and DBOS gave up the step), the turn goes on without durability: nothing it waits for is
        left pending, and the workflow ends in error rather than claim a turn it did not record."""
        while (request := await self._requests.get()) is not None:
            recorded, done = request

            async def body(recorded: dict[str, Any] = recorded) -> dict[str, Any]:
                return recorded

            try:
                await model_request_step(body)
            except BaseException:
                logger.warning("Recording a durable turn's model request failed; it runs on without.")
                self._pending.append(done)
                self.unavailable()
                raise
            if not done.done():
                done.set_result(None)


def _recorded(outcome: str, chunks: list[Chunk], response: list[ModelResponse]) -> dict[str, Any]:
    """A model step's recorded output: its outcome, its chunks and (completed) its response."""
    recorded: dict[str, Any] = {"outcome": outcome, "chunks": chunks}
    if outcome == "completed":
        recorded["response"] = ModelMessagesTypeAdapter.dump_json(list[ModelMessage](response)).decode()
    return recorded


def _context(turn: ChatTurn) -> TurnContext:
    return TurnContext(
        identity=turn.identity, conversation_id=turn.conversation_id, request_id=turn.request_id
    )


def _principal(data: dict[str, Any]) -> Principal:
    return Principal(
        id=data["id"],
        role=data["role"],
        email=data["email"],
        is_anonymous=bool(data["is_anonymous"]),
        aal=data["aal"],
        session_id=data["session_id"],
        tenant_id=data["tenant_id"],
        roles=tuple(data["roles"]),
        claims=data["claims"],
    )
