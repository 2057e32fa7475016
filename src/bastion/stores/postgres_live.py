"""Live turns on Postgres: stream logs in `bastion.run_chunks`, stop requests on `bastion.runs`, and one
listening connection per process that wakes followers and running turns (channel `bastion_turns`).

A follower asks for its run to be streamed live (`follow:<run>`, with its first read and every
`poll_seconds` it waits in vain); the worker running the turn, whichever it is, then writes its log
at once and every `flush_interval`, each write notifying `chunk:<run>`. Nobody following, a turn's
log is written at its step boundaries only, and notifies nobody. However many follow one run in one
process, one reader reads its log for them all (`bastion.stores.followers`, which also caps them).

Everything a user reads runs as that user under row-level security; writes go through the
migration's SECURITY DEFINER functions. A missed notification costs at most `poll_seconds`: readers
re-read (and ask again) that often, and after the listener reconnects every running turn checks
for a stop with a write of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import psycopg
from psycopg.types.json import Jsonb

from bastion.stores._turn_persistence import recordable
from bastion.stores.checkpoints import TurnCheckpoints
from bastion.stores.entities import StoreIdentity, parse_uuid
from bastion.stores.errors import NotFoundError
from bastion.stores.followers import DEFAULT_FOLLOWER_LIMITS, FollowedStream, FollowerLimits, TurnFollowers
from bastion.stores.live import ChunkBatch, ChunkLog, LiveRun

if TYPE_CHECKING:
    from bastion.stores.postgres import PostgresStore

__all__ = ["PostgresLiveTurns"]

logger = logging.getLogger("bastion.stores.live")

CHANNEL: Final = "bastion_turns"

_LIVE_RUN: Final = (
    "select c.id, r.id::text, r.stop_requested_at is not null from bastion.conversations c "
    "left join bastion.runs r on r.id = c.active_run_id and r.status = 'running' "
    "and r.lease_expires_at > now() where c.id = %s"
)
_READ: Final = (
    "select (select r.status = 'running' and r.lease_expires_at > now() from bastion.runs r "
    "where r.id = %(run)s), coalesce((select jsonb_agg(jsonb_build_array(k.id, k.seq, k.reset, k.chunks) "
    "order by k.id) from bastion.run_chunks k where k.run_id = %(run)s and k.id > %(after)s), '[]'), "
    "%(follow)s and bastion.follow_run(%(run)s)"
)
_APPEND: Final = "select bastion.append_chunks(%s, %s, %s, %s::jsonb, %s, %s)"
_APPEND_DURABLE: Final = "select bastion.append_chunks(%s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s)"


class PostgresLiveTurns:
    """`LiveTurns` over a `PostgresStore`; get it with `store.live_turns()`."""

    def __init__(
        self,
        store: PostgresStore,
        *,
        listen_conninfo: str,
        flush_interval: float = 0.05,
        poll_seconds: float = 1.0,
        follower_limits: FollowerLimits = DEFAULT_FOLLOWER_LIMITS,
        outage_seconds: float = 30.0,
    ) -> None:
        self._store = store
        self._outage = outage_seconds
        self._conninfo = listen_conninfo
        self._flush_interval = flush_interval
        self._poll = poll_seconds
        self._stops: dict[str, set[asyncio.Event]] = {}
        self.followers: Final = TurnFollowers(
            self._read_log, limits=follower_limits, poll_seconds=poll_seconds
        )
        self._logs: dict[str, set[ChunkLog]] = {}
        self._listener: asyncio.Task[None] | None = None

    # Writing

    def log(
        self,
        identity: StoreIdentity,
        run_id: str,
        *,
        on_stop: Callable[[], None],
        checkpoints: TurnCheckpoints | None = None,
    ) -> ChunkLog:
        """The run's stream log; a write that finds the run asked to stop calls `on_stop`. A follower in
        any process makes it write live (`ChunkLog.follow`) until it is closed.

        With a durable turn's `checkpoints`, each write carries the pending ones and is fenced by the
        process running the run: once another process adopted it, writes store nothing and stop.
        """

        async def write(batch: ChunkBatch) -> bool:
            arguments = (run_id, batch.seq, batch.reset, batch.json().decode(), batch.durable, batch.notify)
            if checkpoints is None:
                async with self._store.transaction(identity) as conn:
                    cursor = await conn.execute(_APPEND, arguments)
                return _stop(await cursor.fetchone())
            taken, results = checkpoints.take(), checkpoints.take_results()
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(
                    _APPEND_DURABLE,
                    (*arguments, checkpoints.worker, Jsonb(taken), Jsonb(recordable(results))),
                )
            stop = _stop(await cursor.fetchone())
            checkpoints.stored(taken)
            checkpoints.results_logged(results)
            return stop

        def closed() -> None:
            _discard(self._logs, run_id, log)

        self._ensure_listening()

        def results_pending() -> bool:
            # A durable turn's step boundary stores its tools' results at once (a process dying during
            # the next request leaves no outcome unknown to its successor). A finished model request
            # waits: the tool claim or the close that follows carries it, or the next request's start
            # writes it (`ChunkLog.check`), so a successor never asks it again.
            return checkpoints is not None and bool(checkpoints.take_results())

        log = ChunkLog(
            write,
            interval=self._flush_interval,
            on_stop=on_stop,
            on_close=closed,
            boundary_writes=results_pending,
        )
        self._logs.setdefault(run_id, set()).add(log)
        return log

    # Stopping

    @contextlib.contextmanager
    def stop_signal(self, run_id: str) -> Iterator[asyncio.Event]:
        """An event set when someone, in any process, asks the run to stop."""
        self._ensure_listening()
        event = asyncio.Event()
        self._stops.setdefault(run_id, set()).add(event)
        try:
            yield event
        finally:
            _discard(self._stops, run_id, event)

    async def request_stop(self, identity: StoreIdentity, conversation_id: str) -> str | None:
        """Ask the conversation's running turn to stop; its run id, or None when none runs (404 when
        the conversation is not the caller's)."""
        conversation = parse_uuid(conversation_id)
        try:
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute("select bastion.stop_turn(%s)::text", (conversation,))
        except psycopg.Error as error:
            if error.sqlstate == "BS404":
                raise NotFoundError() from None
            raise
        row = await cursor.fetchone()
        run_id = row[0] if row else None
        if run_id is not None:
            # The turn may run in this very process: no need to wait for the notification.
            for event in self._stops.get(run_id, ()):
                event.set()
        return run_id

    # Reading

    async def live_run(self, identity: StoreIdentity, conversation_id: str) -> LiveRun | None:
        """The conversation's run in flight, None when none is; 404 when it is not the caller's."""
        conversation = parse_uuid(conversation_id)
        async with self._store.transaction(identity) as conn:
            cursor = await conn.execute(_LIVE_RUN, (conversation,))
        row = await cursor.fetchone()
        if row is None:
            raise NotFoundError()
        return None if row[1] is None else LiveRun(run_id=row[1], stop_requested=bool(row[2]))

    def follow(self, identity: StoreIdentity, run_id: str, *, reset_step: bool = False) -> FollowedStream:
        """The run's stream from its start, then live until it ends; refused with
        `TooManyFollowersError` (429) past the process's `FollowerLimits`.

        Every follower of one run and owner in this process shares one reader of the log
        (`bastion.stores.followers`). When a new attempt supersedes chunks already yielded, yields
        `reset-step` (AI SDK 7) if `reset_step`, else raises `StreamSuperseded` so the response closes
        and the client replays. Ends after the `finish` chunk, or when the run is no longer in flight
        and its log is read to the end (adding a `finish` the log lacks).
        """
        self._ensure_listening()
        return self.followers.follow(identity, run_id, reset_step=reset_step)

    async def _read_log(
        self, identity: StoreIdentity, run_id: str, after: int, ask: bool
    ) -> tuple[bool, list[tuple[int, int, bool, list[dict[str, Any]]]]]:
        """A shared reader's read; `ask`ing for the run to be streamed live asks this process's own log
        of it at once, without waiting for the notification."""
        if ask:
            for log in self._logs.get(run_id, ()):
                log.follow()
        return await self._read_through_outage(identity, run_id, after, follow=ask)

    async def _read_through_outage(
        self, identity: StoreIdentity, run_id: str, after: int, *, follow: bool
    ) -> tuple[bool, list[tuple[int, int, bool, list[dict[str, Any]]]]]:
        """`_read`, tried again every `poll_seconds` while the database cannot be reached (a restart, a
        failover) for up to `outage_seconds`: the turn followed rides the outage out, so its followers
        do too rather than losing their stream."""
        deadline: float | None = None
        while True:
            try:
                return await self._read(identity, run_id, after, follow=follow)
            except psycopg.OperationalError:
                now = asyncio.get_running_loop().time()
                deadline = now + self._outage if deadline is None else deadline
                if now >= deadline:
                    raise
                logger.warning("Reading a followed stream failed; trying again.", exc_info=True)
            await asyncio.sleep(self._poll)

    async def _read(
        self, identity: StoreIdentity, run_id: str, after: int, *, follow: bool
    ) -> tuple[bool, list[tuple[int, int, bool, list[dict[str, Any]]]]]:
        async with self._store.transaction(identity) as conn:
            cursor = await conn.execute(_READ, {"run": run_id, "after": after, "follow": follow})
        row = await cursor.fetchone()
        assert row is not None
        return bool(row[0]), [(int(i), int(s), bool(r), c) for i, s, r, c in row[1]]

    # The listener

    def _ensure_listening(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
                    await conn.execute(f"listen {CHANNEL}")
                    self._wake_everyone()
                    async for note in conn.notifies():
                        kind, _, run_id = note.payload.partition(":")
                        if kind == "follow":
                            for log in self._logs.get(run_id, ()):
                                log.follow()
                            continue
                        if kind != "stop":
                            self.followers.wake(run_id)
                            continue
                        for event in self._stops.get(run_id, ()):
                            event.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("Listening for live turns failed; reconnecting.", exc_info=True)
                self._wake_everyone()
                await asyncio.sleep(self._poll)

    def _wake_everyone(self) -> None:
        """After a (re)connect, notifications may have been missed: followers re-read, running turns
        check for a stop."""
        self.followers.wake_all()
        for logs in self._logs.values():
            for log in logs:
                log.check()

    async def close(self) -> None:
        await self.followers.close()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None


def _stop(row: tuple[Any, ...] | None) -> bool:
    return bool(row and row[0])


def _discard(registry: dict[str, set[Any]], key: str, event: Any) -> None:
    events = registry.get(key)
    if events is not None:
        events.discard(event)
        if not events:
            del registry[key]
