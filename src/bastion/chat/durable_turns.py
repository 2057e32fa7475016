"""Durable chat turns: one turn is one DBOS workflow, and a live process finishes a dead one's turns.

`ChatEndpoint(..., durable=engine)` (or `chat_routes(durable=...)`) runs every turn, and every
approval continuation, as the workflow `bastion.turn` with the id `bastion.turn:{conversation}:{run}`.
Its input is plain data: the endpoint's name, the verified principal, the conversation, request and
run ids, the run's state, the messages the turn runs on and the response message's id. DBOS is the
envelope that outlives a process: the workflow's row, dead executors found, their work handed over.

- The fast path has no queue and DBOS does not run it: the POST claims the run as before, the
  store writes the workflow's row while the turn is prepared (`bastion.stores.turn_workflows`), the
  turn streams in the response's task once that row exists, and its close ends the row. Nothing
  marks the run durable: the store counts a run live while its workflow waits for a take-over.
- Model requests are not DBOS steps. A finished request's record (its response and the chunks it
  streamed) is stored by the run's next write that happens anyway, in the same transaction, keyed by
  (run, step): the claim of its first tool or the turn's close (a log batch when the next request
  starts with no claim between: `bastion.stores.checkpoints`). So a request is stored before any of
  its tools runs, and a turn costs DBOS nothing while its process lives. Each of those writes is
  fenced by the process running the run, so a process that lost its run to a successor cannot
  write over it.
  Tools are not steps either: their exactly-once guarantee stays the operation claim
  (`AgentRun.execute_tool`), which replays a completed call's stored output and refuses one whose
  outcome is unknown (unless the tool is idempotent).
- When the process dies, another process's janitor (`DurableEngine`) hands the workflow to a live
  process. Finding no local turn, the body rebuilds it from its input (principal, `ChatTurn`, the
  context factory, `agent.prepare`, `session.stream`), adopts the run and reads its stored requests
  in one round trip (`adopt_turn`: only while the run is still the conversation's running turn and
  its process is dead) and runs it headless from the start of its stream log: a stored request
  re-yields its chunks and response without asking the model, and its replayed chunks overlap what
  is logged. At the first thing that is not a replay (a model request that runs, a tool that runs
  or fails), the log starts a new attempt, superseding what the dead process logged from there on.
  Then the run finishes as usual.

A retried POST meets the run it started as busy (409 with `Retry-After`: a durable run stays live
until its lease ends, even while its process is dead) and resumes with `GET …/stream`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse

from bastion._turn_plan import ExecuteToolHook
from bastion._ui_chunks import Chunk
from bastion.auth import Principal
from bastion.chat.stream_response import AgentStreamResponse, TurnRunner
from bastion.chat.turn import ChatTurn, TurnOpener
from bastion.durable.engine import DURABLE_APPLICATION_VERSION, prune_finished_workflows
from bastion.durable.turn_workflow import (
    TURN_WORKFLOWS,
    WORKFLOW_NAME,
    DurableTurnError,
    turn_workflow_id,
)
from bastion.persistence import AgentRun, RunStart
from bastion.stores.checkpoints import TurnCheckpoints
from bastion.stores.entities import StoreIdentity, TurnContext, TurnState
from bastion.stores.live import ChunkLog
from bastion.stores.postgres import PostgresAgentPersistence, PostgresStore
from bastion.stores.turn_workflows import TurnWorkflowRow
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
    workflows = await prune_finished_workflows(WORKFLOW_NAME, older_than=older_than)
    return workflows, await store.prune_run_chunks(older_than=older_than)


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
        """The fast path: the claimed turn's response, streaming once its workflow's row exists.

        The store writes the workflow's row (one round trip, while the endpoint prepares the turn),
        so a client never sees a turn that no process could take over, and the turn's close ends it
        in the same transaction (after `after_turn` instead, when the endpoint has one). DBOS does
        not execute the workflow here: it finds it only if this process dies. A turn whose close did
        not end its row (it failed before streaming, its close failed, or it has an `after_turn`)
        ends it on its own: a turn's workflow never stays pending while its process lives. No write
        marks the run durable: while its workflow waits for a take-over, the store counts the run
        live (stores migration 0019).
        """
        persistence = self._persistence
        checkpoints = persistence.checkpoint(run.state)
        if not self.endpoint.runs_after_turn:
            # Its close ends the workflow. A turn with an `after_turn` ends it after that ran: a
            # process dying between the save and `after_turn` leaves the workflow to the one taking
            # it over, which runs `after_turn` for the saved turn.
            checkpoints.workflow_executor = self.engine.executor_id
        hooks = _TurnHooks(run, checkpoints)
        row = TurnWorkflowRow(
            executor_id=self.engine.executor_id,
            application_version=DURABLE_APPLICATION_VERSION,
            application_name=self.engine.application_name,
            input=self._input(turn, run, hooks.message_id),
        )
        context = _context(turn)
        begun = asyncio.ensure_future(self._begin(context, run.state, row))

        async def settle_workflow() -> None:
            """End the row if it was written and the turn's close did not end it."""
            if await asyncio.shield(begun) and not checkpoints.workflow_ended:
                try:
                    await persistence.turn_workflows.end(context, run.state, row.executor_id)
                except Exception:
                    logger.exception("Ending the workflow of the durable turn of run %s failed.", turn.run_id)

        async def runner(run_turn: Callable[[], Awaitable[None]]) -> None:
            try:
                # Nothing streams before the workflow's row exists: a process dying from the turn's
                # first chunk on leaves a workflow that another process takes over.
                await asyncio.shield(begun)
                await run_turn()
            finally:
                await settle_workflow()

        hooks.runner = runner
        try:
            return await self.endpoint.open_turn(turn, run, durable=hooks)
        except BaseException:
            await settle_workflow()  # the turn failed (and settled) before it streamed
            raise

    async def _begin(self, context: TurnContext, state: TurnState, row: TurnWorkflowRow) -> bool:
        """Write the turn's workflow row; whether it was. A turn whose row could not be written runs
        without durability, as it would without an engine."""
        try:
            begun = await self._persistence.turn_workflows.begin(context, state, row)
        except Exception:
            logger.exception("Starting a durable turn failed; it runs without durability.")
            return False
        if not begun:
            logger.info("The run %s no longer runs here; its turn gets no workflow.", state.run_id)
        return begun

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
        stored = await persistence.adopt_turn(context, state)
        if stored is None:
            logger.info("The durable turn of run %s was settled or replaced; nothing to run.", turn.run_id)
            await self._after_saved(turn, context, workflow_input)
            return "superseded"
        start = RunStart(messages=workflow_input["messages"], state=state, operation_scope=turn.run_id)
        run = AgentRun(persistence=persistence, context=context, start=start)
        hooks = _TurnHooks(
            run,
            persistence.checkpoint(state),
            message_id=workflow_input["message_id"],
            stored={record["step"]: record for record in stored},
        )
        response = await self.endpoint.open_turn(turn, run, durable=hooks)
        await response.run_detached()
        return "taken_over"

    async def _after_saved(
        self, turn: ChatTurn, context: TurnContext, workflow_input: dict[str, Any]
    ) -> None:
        """A turn its dead process saved as completed may have died before its `after_turn` (the
        save commits first): run it here, from the saved response."""
        try:
            saved = await self._persistence.saved_response(context, turn.run_id, workflow_input["message_id"])
        except Exception:
            logger.exception(
                "Reading the saved turn of run %s failed; its after_turn does not run.", turn.run_id
            )
            return
        if saved is not None:
            await self.endpoint.after_saved_turn(turn, workflow_input["messages"], saved)

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
    """One durable turn's additions to the chat route: its model steps and checkpoints, its tool hook
    (which marks where a taken-over turn stops replaying), its deterministic message id and its
    runner."""

    def __init__(
        self,
        run: AgentRun[Any, Any],
        checkpoints: TurnCheckpoints,
        *,
        message_id: str | None = None,
        stored: dict[int, dict[str, Any]] | None = None,
    ) -> None:
        # Only a taken-over turn (`stored`, maybe empty) has an earlier attempt in the log to
        # supersede; a first one writes no reset (each would cost the log a write of its own).
        self._taken_over = stored is not None
        self.checkpoints = checkpoints
        run_id: str = run.state.run_id
        self.message_id = message_id or uuid.uuid5(_IDS, run_id).hex
        self.runner: TurnRunner | None = None
        self._log: ChunkLog | None = None
        self.steps = _ModelSteps(run_id, checkpoints, stored or {}, self._new_attempt, self._store_pending)

    def attach(self, log: ChunkLog | None) -> None:
        self._log = log

    def _store_pending(self) -> None:
        """A model request is asked while an earlier one waits unstored (no tool claim came between
        them: its output was retried, say): the log writes it now, so a successor never asks it again."""
        if self._log is not None and self.checkpoints.pending:
            self._log.check()

    def _new_attempt(self) -> None:
        """What follows is produced afresh: it supersedes whatever an earlier attempt logged from here."""
        if self._log is not None and self._taken_over:
            self._log.reset()

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
                # The claim that let this run stored the request that called the tool.
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
            finally:
                if origin.step is None:
                    self._log_results()

        return execute_tool

    def _log_results(self) -> None:
        """An approval's answer ran: no step boundary follows it before the model is asked again, so
        its result rides a log write now, in the background, and a worker dying during the next
        request leaves no outcome unknown to the one taking over."""
        if self._log is not None and self.checkpoints.take_results():
            self._log.check()


class _ModelSteps:
    """`ModelSteps` on bastion's own writes: a request stored by an earlier execution of the turn is
    replayed (its chunks and response, without the model); any other is asked, and its record
    waits in the turn's checkpoints for the run's next write. A request that failed or was
    cancelled is not stored: a take-over asks it again."""

    def __init__(
        self,
        id_seed: str,
        checkpoints: TurnCheckpoints,
        stored: dict[int, dict[str, Any]],
        new_attempt: Callable[[], None],
        store_pending: Callable[[], None],
    ) -> None:
        self.id_seed = id_seed
        self._checkpoints = checkpoints
        self._stored = stored
        self._new_attempt = new_attempt
        self._store_pending = store_pending

    def request(
        self,
        step: int,
        produce: Callable[[], AsyncIterator[Chunk]],
        response: list[ModelResponse],
    ) -> AsyncIterator[Chunk]:
        record = self._stored.get(step)
        if record is not None:
            return _replayed(record, response)
        return self._asked(step, produce, response)

    async def _asked(
        self, step: int, produce: Callable[[], AsyncIterator[Chunk]], response: list[ModelResponse]
    ) -> AsyncIterator[Chunk]:
        self._new_attempt()
        self._store_pending()
        chunks: list[Chunk] = []
        async for chunk in produce():
            chunks.append(chunk)
            yield chunk
        self._checkpoints.add(
            step,
            {
                "response": ModelMessagesTypeAdapter.dump_python(list[ModelMessage](response), mode="json"),
                "chunks": chunks,
            },
        )


async def _replayed(record: dict[str, Any], response: list[ModelResponse]) -> AsyncIterator[Chunk]:
    for chunk in record["chunks"]:
        yield chunk
    [replayed] = ModelMessagesTypeAdapter.validate_python(record["response"])
    if not isinstance(replayed, ModelResponse):
        raise DurableTurnError("A stored model request of this turn holds no model response.")
    response.append(replayed)


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
