"""`PostgresAgentPersistence`: the `AgentPersistence` a turn runs through on the Postgres store.

A claim, a tool operation and a turn's end are each one pipelined transaction through the store's
security-definer functions, as the caller; a turn's tail is cached between turns (`TailCache`), so
a conversation's next turn usually costs a single round trip to claim.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Protocol

from bastion._extras import missing_extra

try:
    import psycopg
    from psycopg.rows import TupleRow
    from psycopg.types.json import Jsonb
except ImportError as error:
    raise missing_extra("bastion.stores.PostgresStore", "postgres", error) from error

from bastion.approvals import CanRespondToApproval
from bastion.history import AgentHistoryConflictError, reconcile_agent_messages
from bastion.persistence import (
    RunInput,
    RunOutcome,
    RunStart,
    ToolOperation,
)
from bastion.stores._leases import DEFAULT_LEASE_SECONDS, LeaseKeeper
from bastion.stores._postgres_connection import Connection, database_errors, single_value
from bastion.stores._tail_cache import (
    CachedTail,
    TailCache,
    TailKey,
    claimed_tail,
    finished_tail,
    loaded_tail,
    tail_key,
)
from bastion.stores._turn_persistence import (
    CheckedOperation,
    HistoryWrites,
    TurnPersistence,
    approval_request_events,
    approval_response_events,
    browser_message_ids,
    check_response,
    pending_approval_ids,
    plan_history_writes,
    recordable,
    run_event,
    run_status,
)
from bastion.stores.checkpoints import TurnCheckpoints
from bastion.stores.entities import (
    StoreIdentity,
    TurnContext,
    TurnState,
)
from bastion.stores.errors import (
    ConversationBusyError,
    NotFoundError,
    ToolOperationConflictError,
    ToolOperationMismatchError,
    ToolOperationUncertainError,
    TurnConflictError,
)
from bastion.stores.live import LogCarry
from bastion.stores.turn_workflows import TurnWorkflowRows, end_in_close


class PostgresRunHost(Protocol):
    """What `PostgresAgentPersistence` needs of its store (`PostgresStore` is one): transactions as the
    caller, the worker key it names itself with on the runs it claims (while it holds that key's lock),
    the leases it renews, and the tails it remembers to claim a later turn in one round trip."""

    @property
    def worker_key(self) -> int: ...

    @property
    def leases(self) -> LeaseKeeper: ...

    @property
    def claim_cache(self) -> TailCache: ...

    def transaction(self, identity: StoreIdentity) -> AbstractAsyncContextManager[Connection]: ...

    async def hold_worker_lock(self) -> int: ...

    def conversation_insert(
        self, conversation_id: str, *, title: str | None, agent_name: str | None
    ) -> tuple[str, dict[str, Any]]: ...


__all__ = ["PostgresAgentPersistence"]


class PostgresAgentPersistence(TurnPersistence):
    """Turns stored in Postgres: claims with revisions and leases, exactly-once tool operations, events.

    - `start_run` (two round trips, one transaction): lock the conversation without waiting, load
      its stored tail, reconcile the browser's messages, claim the turn and write what changed.
      The model gets the last `history_window` messages of the canonical history. A later turn
      takes one round trip when this process remembers the tail its previous claim or finish left
      (per identity and conversation): it reconciles against that tail, and the database claims
      only if the revision is unchanged, the browser names no stored message the tail lacks, no
      live run holds the conversation and the request id is new. A stale tail changes nothing and
      costs a fresh load; any error forgets the tail.
    - `start_new_conversation_run` (one round trip): a conversation's first message creates it and
      claims its turn in one transaction; an id that is taken writes nothing and leaves the answer
      to the usual create and `start_run`.
    - `execute_tool` (one round trip): claim the call before its side effect; the results of this
      run's earlier calls are recorded in the same trip (or by `finish_run`).
    - `finish_run` (one round trip): fenced by run id and idempotent; appends (or replaces, when
      continuing it) only the response message and releases the claim.

    A run holds its claim for `lease_seconds` (30 s by default), renewed while this process runs
    it; a newer turn replaces a run whose lease expired, or whose process provably died (its
    worker lock is free), and records it as interrupted. A conversation a live turn holds is
    refused with `ConversationBusyError`, which carries `Retry-After`.

    A run a durable workflow runs (`bastion.durable`) is not replaced when its process dies while
    that workflow waits: a live process adopts it (`adopt_run`) and finishes it, and only its lease
    running out frees its conversation then. A durable chat turn's run is known by its workflow's
    row (`turn_workflows`, stores migrations 0019-0020); `mark_durable` marks any other run.

    A turn's stream log (`TurnState.log`) rides its tool claims and its close, in the same statement
    (`ChunkLog.carry`): the log needs no transaction of its own.
    """

    carries_stream_logs: ClassVar[bool] = True

    def __init__(
        self,
        store: PostgresRunHost,
        *,
        history_window: int = 100,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        can_respond_to_approval: CanRespondToApproval[TurnContext] | None = None,
    ) -> None:
        super().__init__(
            history_window=history_window,
            lease_seconds=lease_seconds,
            can_respond_to_approval=can_respond_to_approval,
        )
        self._store = store
        self._tails = store.claim_cache

    async def mark_durable(self, context: TurnContext, state: TurnState) -> bool:
        """Mark the run durable, once a durable workflow runs it (one round trip of its own; a durable
        chat turn needs none: its workflow's row keeps its run live): from now on it waits for its
        take-over when its process dies instead of being replaced. False when it no longer runs."""
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute("select bastion.mark_run_durable(%s)", (state.run_id,))
            return bool(single_value(await cursor.fetchone()))

    async def adopt_run(self, context: TurnContext, state: TurnState) -> bool:
        """Take over the run of a durable workflow whose process died: this process runs it from now on
        (and the run is durable, if its process died before marking it).

        One round trip. False, and nothing changes, when the run is no longer the conversation's
        running turn (it was settled or replaced meanwhile) or its process is still alive. Operations
        the dead process left in flight are settled as failed: their outcome is unknown, so running
        them again is refused unless the tool is idempotent.
        """
        await self._store.hold_worker_lock()
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute(
                    "select bastion.adopt_run(%s, %s, %s)",
                    (state.run_id, self._store.worker_key, self._lease_seconds),
                )
            adopted = bool(single_value(await cursor.fetchone()))
        self._tails.evict(tail_key(context.identity, state.conversation_id))
        if adopted:
            self._store.leases.hold(state.run_id, self._lease_seconds)
        return adopted

    @property
    def turn_workflows(self) -> TurnWorkflowRows:
        """The durable turns' workflow rows, written and ended beside their runs."""
        return TurnWorkflowRows(self._store)

    def checkpoint(self, state: TurnState) -> TurnCheckpoints:
        """Make the run's turn checkpoint its model requests in the run's next writes, every write
        fenced by this process (see `bastion.stores.checkpoints`)."""
        state.checkpoints = TurnCheckpoints(worker=self._store.worker_key, results=state.unrecorded_results)
        return state.checkpoints

    async def adopt_turn(self, context: TurnContext, state: TurnState) -> list[dict[str, Any]] | None:
        """`adopt_run`, answering with the run's stored checkpoints (the records of its finished model
        requests, in step order), or None when the run was not adopted. One round trip."""
        await self._store.hold_worker_lock()
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute(
                    "select bastion.adopt_turn(%s, %s, %s)",
                    (state.run_id, self._store.worker_key, self._lease_seconds),
                )
            adopted: dict[str, Any] = single_value(await cursor.fetchone())
        self._tails.evict(tail_key(context.identity, state.conversation_id))
        if not adopted["adopted"]:
            return None
        self._store.leases.hold(state.run_id, self._lease_seconds)
        return list(adopted["steps"])

    async def saved_response(
        self, context: TurnContext, run_id: str, message_id: str
    ) -> dict[str, Any] | None:
        """The response message `message_id` the run saved when it completed (or paused for an
        approval), read as the caller; None when it ended otherwise or saved no such message."""
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute(
                    "select m.message from bastion.runs r join bastion.messages m"
                    " on m.conversation_id = r.conversation_id and m.id = %s"
                    " where r.id = %s and r.status in ('completed', 'waiting_for_approval')",
                    (message_id, run_id),
                )
                row = await cursor.fetchone()
        return dict(row[0]) if row is not None else None

    async def record_tool_results(self, context: TurnContext, state: TurnState) -> None:
        """Write the results of this run's finished operations now, in a transaction of their own,
        not with its next write (durable chat turns let their stream log's writes carry them)."""
        results = list(state.unrecorded_results)
        if not results:
            return
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                await conn.execute(
                    "select bastion.record_run_results(%s, %s, %s)",
                    (state.conversation_id, state.run_id, Jsonb(recordable(results))),
                )
        del state.unrecorded_results[: len(results)]

    async def start_run(self, context: TurnContext, input: RunInput) -> RunStart[TurnState]:
        key = tail_key(context.identity, context.conversation_id)
        cached = self._tails.get(key)
        await self._store.hold_worker_lock()
        try:
            if cached is not None:
                start = await self._claim_from_cache(context, input, key, cached)
                if start is not None:
                    return start
            return await self._claim_after_load(context, input, key)
        except BaseException:
            self._tails.evict(key)
            raise

    async def start_new_conversation_run(
        self, context: TurnContext, input: RunInput, *, title: str | None, agent_name: str | None
    ) -> RunStart[TurnState] | None:
        """Create the conversation a first message starts and claim its turn: one round trip (the
        insert and `claim_new_turn` in one pipelined transaction). None, having written nothing, when
        the id is taken (the caller's earlier request's, or anyone else's conversation) or the request
        is not one a new conversation starts with: the caller then creates and claims as usual, which
        answers as it always has (someone else's conversation is not found)."""
        if context.expected_revision is not None:
            return None
        try:
            history = await reconcile_agent_messages([], input.messages, trigger=input.trigger)
        except AgentHistoryConflictError:
            return None
        plan = plan_history_writes([], history, last_seq=0)
        if _answers_approvals(plan):
            return None
        key = tail_key(context.identity, context.conversation_id)
        insert, values = self._store.conversation_insert(
            context.conversation_id, title=title, agent_name=agent_name
        )
        run_id = str(uuid.uuid4())
        events = [run_event(run_id, "started")]
        await self._store.hold_worker_lock()
        try:
            with database_errors():
                async with self._store.transaction(context.identity) as conn:
                    await conn.execute(insert, values)
                    cursor = await conn.execute(
                        "select bastion.claim_new_turn(%s, %s, %s, %s, %s, %s, %s)",
                        (
                            context.conversation_id,
                            run_id,
                            context.request_id,
                            self._store.worker_key,
                            self._lease_seconds,
                            Jsonb(plan.writes),
                            Jsonb(events),
                        ),
                    )
                claimed = single_value(await cursor.fetchone())
            if claimed["outcome"] == "taken":
                return None
            base = loaded_tail(claimed["revision"] - 1, 0, [])
            return self._claimed(key, run_id, base, plan, history, claimed)
        except BaseException:
            self._tails.evict(key)
            raise

    async def _claim_from_cache(
        self, context: TurnContext, input: RunInput, key: TailKey, cached: CachedTail
    ) -> RunStart[TurnState] | None:
        """One round trip: reconcile against the remembered tail, then claim only if it is still current.

        Returns None when the remembered tail cannot serve this turn or turns out stale; the caller
        then loads afresh, so a refusal here is never final (a forged window is refused there). No
        callback runs here: a turn that answers approvals under a policy takes the locked path, so
        the policy is asked once, while the stored history cannot change.
        """
        if cached.incarnation is None or not cached.covers_window(self._window):
            return None
        if context.expected_revision is not None and context.expected_revision != cached.revision:
            return None
        tail = list(cached.rows)
        try:
            history = await reconcile_agent_messages(
                [message for _, message in tail], input.messages, trigger=input.trigger
            )
        except AgentHistoryConflictError:
            return None
        plan = plan_history_writes(tail, history, last_seq=cached.last_seq)
        if self._can_respond is not None and _answers_approvals(plan):
            return None
        known = cached.ids()
        uncached = [
            message_id for message_id in browser_message_ids(input.messages) if message_id not in known
        ]
        run_id = str(uuid.uuid4())
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await self._execute_claim(
                    conn, context, run_id, cached, plan, tail, history, uncached_ids=uncached
                )
            claimed = single_value(await cursor.fetchone())
        if claimed["outcome"] == "stale":
            return None
        return self._claimed(key, run_id, cached, plan, history, claimed)

    async def _claim_after_load(
        self, context: TurnContext, input: RunInput, key: TailKey
    ) -> RunStart[TurnState]:
        """Two round trips: load the stored tail under the conversation's lock, then claim."""
        run_id = str(uuid.uuid4())
        with database_errors():
            async with self._store.transaction(context.identity) as conn:
                cursor = await conn.execute(
                    "select bastion.load_turn(%s, %s, %s, %s)",
                    (
                        context.conversation_id,
                        context.request_id,
                        browser_message_ids(input.messages),
                        self._window,
                    ),
                )
                loaded = single_value(await cursor.fetchone())
                if loaded is None:
                    raise NotFoundError()
                revision = loaded["revision"]
                stale = context.expected_revision is not None and context.expected_revision != revision
                if loaded["busy"]:
                    raise ConversationBusyError(loaded["retry_after"])
                if loaded["repeated_request"] or stale:
                    raise TurnConflictError()
                tail = [(seq, message) for seq, message in loaded["messages"]]
                base = loaded_tail(revision, loaded["last_seq"], tail)
                history = await self._reconcile([message for _, message in tail], input, context)
                plan = plan_history_writes(tail, history, last_seq=base.last_seq)
                cursor = await self._execute_claim(conn, context, run_id, base, plan, tail, history)
            claimed = single_value(await cursor.fetchone())
        return self._claimed(key, run_id, base, plan, history, claimed)

    async def _execute_claim(
        self,
        conn: Connection,
        context: TurnContext,
        run_id: str,
        base: CachedTail,
        plan: HistoryWrites,
        tail: list[tuple[int, dict[str, Any]]],
        history: list[dict[str, Any]],
        *,
        uncached_ids: list[str] | None = None,
    ) -> psycopg.AsyncCursor[TupleRow]:
        """Queue `bastion.claim_turn`: the writes of `plan`, if the conversation is still at `base`."""
        events = [run_event(run_id, "started"), *approval_response_events(tail, history)]
        return await conn.execute(
            "select bastion.claim_turn(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                context.conversation_id,
                run_id,
                context.request_id,
                base.revision,
                base.incarnation,
                uncached_ids or [],
                self._store.worker_key,
                self._lease_seconds,
                plan.truncate_after,
                Jsonb(plan.writes),
                Jsonb(events),
            ),
        )

    def _claimed(
        self,
        key: TailKey,
        run_id: str,
        base: CachedTail,
        plan: HistoryWrites,
        history: list[dict[str, Any]],
        claimed: dict[str, Any],
    ) -> RunStart[TurnState]:
        """The started run, remembering the tail the claim left for the conversation's next turn."""
        if claimed["outcome"] == "busy":
            raise ConversationBusyError(claimed["retry_after"])
        if claimed["outcome"] != "claimed":
            raise TurnConflictError()
        revision = claimed["revision"]
        written_from = min((write["seq"] for write in plan.writes), default=None)
        written = [(seq, message) for seq, message in claimed["rows"]]
        after = claimed_tail(
            base,
            truncate_after=plan.truncate_after,
            written_from=written_from,
            revision=revision,
            last_seq=claimed["last_seq"],
            written=written,
            incarnation=claimed["incarnation"],
        )
        self._tails.put(key, after)
        self._store.leases.hold(run_id, self._lease_seconds)
        state = TurnState(
            conversation_id=key[2],
            run_id=run_id,
            revision=revision,
            pending_approval_ids=pending_approval_ids(history),
        )
        return RunStart(messages=history[-self._window :], state=state, operation_scope=run_id)

    async def execute_tool(self, context: TurnContext, state: TurnState, operation: ToolOperation) -> Any:
        checked = self._checked_operation(state, operation)
        replayed, output = self._replayed(state, checked)
        if replayed:
            return output
        results = list(state.unrecorded_results)
        state.running_tool_calls.add(checked.key)
        claimed = False
        try:
            claim = await self._claim_tool(context, state, checked, results)
            del state.unrecorded_results[: len(results)]
            outcome = claim["outcome"]
            if outcome == "completed":
                return claim["output"]
            if outcome == "in_flight":
                raise ToolOperationConflictError()
            if outcome == "mismatch":
                raise ToolOperationMismatchError()
            if outcome != "claimed":
                raise ToolOperationUncertainError()
            claimed = True
            return await self._execute(state, operation, checked)
        finally:
            if not claimed:
                state.running_tool_calls.discard(checked.key)

    async def _claim_tool(
        self, context: TurnContext, state: TurnState, checked: CheckedOperation, results: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """One round trip: record this run's earlier results, store its stream log so far (and a durable
        turn's checkpoints, fenced) and claim the operation."""
        try:
            async with _carried_log(state, closing=False) as log:
                checkpoints = _checkpoints(state)
                with database_errors():
                    async with self._store.transaction(context.identity) as conn:
                        cursor = await conn.execute(
                            "select bastion.claim_tool(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            (
                                state.conversation_id,
                                state.run_id,
                                checked.key,
                                checked.call_id,
                                checked.name,
                                Jsonb(checked.input),
                                checked.idempotent,
                                self._lease_seconds,
                                Jsonb(recordable(results)),
                                *_fence(state, checkpoints),
                                Jsonb(log.json(), dumps=_as_is),
                            ),
                        )
                    claim: dict[str, Any] = single_value(await cursor.fetchone())
                log.stop = bool(claim.get("stop"))
            _stored(state, checkpoints)
        except BaseException:
            self._tails.evict(tail_key(context.identity, state.conversation_id))
            raise
        return claim

    async def finish_run(self, context: TurnContext, state: TurnState, outcome: RunOutcome) -> None:
        message = outcome.response_message
        if message is not None:
            check_response(message)
        status = run_status(outcome.status, message)
        events = [
            *approval_request_events(message, known=state.pending_approval_ids),
            run_event(state.run_id, status, message),
        ]
        results = list(state.unrecorded_results)
        key = tail_key(context.identity, state.conversation_id)
        self._store.leases.release(state.run_id)
        try:
            async with _carried_log(state, closing=True) as log:
                checkpoints = _checkpoints(state)
                with database_errors():
                    async with self._store.transaction(context.identity) as conn:
                        cursor = await conn.execute(
                            "select bastion.close_turn(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            (
                                state.conversation_id,
                                state.run_id,
                                status,
                                Jsonb(message) if message is not None else None,
                                Jsonb(recordable(results)),
                                Jsonb(events),
                                *_fence(state, checkpoints),
                                Jsonb(log.json(), dumps=_as_is),
                            ),
                        )
                        ending = await end_in_close(conn, state)
                    closed = single_value(await cursor.fetchone())
            _stored(state, checkpoints)
            if ending is not None and state.checkpoints is not None:
                state.checkpoints.workflow_ended = True
        except BaseException:
            self._tails.evict(key)
            raise
        del state.unrecorded_results[: len(results)]
        self._remember_finish(key, state, closed)

    def _remember_finish(self, key: TailKey, state: TurnState, closed: dict[str, Any]) -> None:
        """Advance the remembered tail past this run's own finish; anything else forgets it."""
        before = self._tails.get(key)
        if before is None:
            return
        if (
            not closed["saved"]
            or before.revision != state.revision
            or closed["revision"] != state.revision + 1
        ):
            self._tails.evict(key)
            return
        row = closed["row"]
        saved = (row[0], row[1]) if row is not None else None
        self._tails.put(
            key, finished_tail(before, revision=closed["revision"], last_seq=closed["last_seq"], saved=saved)
        )


def _checkpoints(state: TurnState) -> list[dict[str, Any]] | None:
    """A durable turn's pending checkpoints, for its next claim or close to store."""
    return state.checkpoints.take() if state.checkpoints is not None else None


def _fence(state: TurnState, taken: list[dict[str, Any]] | None) -> tuple[int | None, Jsonb | None]:
    """For a durable turn, the process running the run, which the write is fenced by (it fails unless
    this process still runs the run), and the checkpoints it stores."""
    if state.checkpoints is None:
        return None, None
    return state.checkpoints.worker, Jsonb(taken)


@contextlib.asynccontextmanager
async def _carried_log(state: TurnState, *, closing: bool) -> AsyncIterator[LogCarry]:
    """The run's stream log batches not written yet, for its claim or close to store in the same
    statement (`ChunkLog.carry`); none when the turn has no log."""
    if state.log is None:
        yield LogCarry([])
        return
    async with state.log.carry(closing=closing) as carried:
        yield carried


def _as_is(text: str) -> str:
    """The log's batches are JSON text already (each chunk's wire JSON): sent as they are."""
    return text


def _stored(state: TurnState, taken: list[dict[str, Any]] | None) -> None:
    if state.checkpoints is not None and taken:
        state.checkpoints.stored(taken)


def _answers_approvals(plan: HistoryWrites) -> bool:
    """Whether the claim changes a stored assistant message: only approval answers do."""
    return any(write["replace"] and write["message"].get("role") == "assistant" for write in plan.writes)
