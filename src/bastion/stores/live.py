"""Live turns, store-independent: a turn's UI message stream as a log written in batches, read back
from its start and followed, and the stop signal of a running turn.

A turn writes its chunks through a `ChunkLog`. Nobody reading, the log is written at each step
boundary (a `finish-step` chunk, or `step_boundary()`) and when flushed or closed: a turn writes a
bounded number of batches however long it takes. A log `carried` by the run's own writes (a tool's
claim, the turn's close: `carry()`) has no transaction of its own for that, unless a step boundary
stores more than chunks (a durable turn's tool results: `boundary_writes`). A reader that
follows the run (`follow()`, asked for across processes through the store's notification channel)
makes the log write what it holds at once and then every `interval` seconds, each write waking the
followers. Each batch names the turn position of its first chunk. A batch marked `reset` starts a
new attempt at its position (a durable step re-ran after its worker died): what an earlier attempt
wrote from there on is superseded. `StreamAssembly` applies batches in the order they were written
and tells a reader what to send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from bastion._ui_chunks import Chunk
from bastion.stores.checkpoints import TurnCheckpoints
from bastion.stores.entities import StoreIdentity

__all__ = [
    "ChunkBatch",
    "ChunkLog",
    "FollowedRun",
    "LiveRun",
    "LiveTurns",
    "LogCarry",
    "StreamAssembly",
    "StreamInterrupted",
    "StreamSuperseded",
]

logger = logging.getLogger("bastion.stores.live")


DEFAULT_FLUSH_INTERVAL: Final = 0.05
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class StreamSuperseded(Exception):
    """A follower already sent chunks a new attempt replaced, and cannot retract them (AI SDK 6)."""


class StreamInterrupted(Exception):
    """A follower's reader stopped before the turn ended (the store closed): the client resumes."""


@dataclass(frozen=True, slots=True)
class ChunkBatch:
    """One write of a run's stream: chunks from turn position `seq`; `reset` supersedes from there;
    `durable` marks the run durable as well (see `ChunkLog.mark_durable`); `notify` wakes the run's
    followers. `encoded` is each chunk's JSON text when the writer has it already (the wire's), so
    the batch is not encoded again."""

    seq: int
    chunks: Sequence[Chunk]
    reset: bool = False
    durable: bool = False
    notify: bool = False
    encoded: Sequence[bytes] = ()

    def json(self) -> bytes:
        """The chunks as one JSON array."""
        if len(self.encoded) == len(self.chunks):
            return b"[" + b",".join(self.encoded) + b"]"
        return _encode(list(self.chunks)).encode()


@dataclass(frozen=True, slots=True)
class LiveRun:
    """The conversation's run in flight: its id and whether it was asked to stop."""

    run_id: str
    stop_requested: bool = False


@dataclass
class StreamAssembly:
    """A run's stream as a reader sees it: batches applied in write order, resets resolved.

    `apply` takes each batch, `take` returns what is new to this reader. When a reset supersedes
    chunks the reader already took, `apply` says so, and the caller retracts them (AI SDK 7
    `reset-step`) or closes and lets the client replay. Chunks a batch repeats (a replayed durable
    turn rewrites its deterministic prefix) are skipped.
    """

    chunks: list[Chunk] = field(default_factory=list)
    sent: int = 0

    def apply(self, batch: ChunkBatch) -> bool:
        """Apply one batch; True when it supersedes chunks this reader already took."""
        if batch.reset and batch.seq < len(self.chunks):
            del self.chunks[batch.seq :]
        if batch.seq > len(self.chunks):
            # A batch past a gap (a lost write): only what continues the stream can be shown.
            logger.warning("A run's stream has a gap at position %d.", len(self.chunks))
            return False
        overlap = len(self.chunks) - batch.seq
        self.chunks.extend(batch.chunks[overlap:])
        if batch.reset and batch.seq < self.sent:
            self.sent = batch.seq
            return True
        return False

    def take(self) -> list[Chunk]:
        """The chunks not sent yet, now counted as sent."""
        fresh = self.chunks[self.sent :]
        self.sent = len(self.chunks)
        return fresh

    @property
    def finished(self) -> bool:
        return bool(self.chunks) and self.chunks[-1].get("type") == "finish"


@dataclass(slots=True)
class LogCarry:
    """A stream log's batches handed to a write the run makes anyway; `stop` is what it answered
    about the run being asked to stop."""

    batches: list[ChunkBatch]
    stop: bool = False

    def json(self) -> str:
        """The batches as `[{seq, reset, chunks, durable, notify}]`, each chunk's wire text reused."""
        return (
            "["
            + ",".join(
                f'{{"seq":{b.seq},"reset":{_flag(b.reset)},"durable":{_flag(b.durable)},'
                f'"notify":{_flag(b.notify)},"chunks":{b.json().decode()}}}'
                for b in self.batches
            )
            + "]"
        )


def _flag(value: bool) -> str:
    return "true" if value else "false"


ChunkSink = Callable[[ChunkBatch], Awaitable[bool]]
"""Writes one batch; returns whether the run was asked to stop."""


@dataclass(slots=True)
class _Segment:
    seq: int
    reset: bool
    chunks: list[Chunk] = field(default_factory=list)
    encoded: list[bytes] = field(default_factory=list)


class ChunkLog:
    """A run's stream log: `add` chunks as they are produced; a background task writes them in batches.

    Written at each step boundary, when `flush()`ed and when `close()`d (which also stops the
    writer); while followed (`follow()`), every `interval` as well. A failed write is retried with
    the next one; the turn itself never fails because its log could not be written. When a write
    reports that the run was asked to stop, `on_stop` is called; `on_close` once it is closed.
    """

    def __init__(
        self,
        sink: ChunkSink,
        *,
        interval: float = DEFAULT_FLUSH_INTERVAL,
        on_stop: Callable[[], None] | None = None,
        on_close: Callable[[], None] | None = None,
        position: int = 0,
        boundary_writes: Callable[[], bool] | None = None,
    ) -> None:
        self._sink = sink
        self._interval = interval
        self._on_stop = on_stop
        self._on_close = on_close
        self._segments: list[_Segment] = []
        self._position = position
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._followed = False
        self._due = False  # write at once, without waiting for more chunks
        self._owed = False  # a write is owed even with no chunks (a follower's answer, a stop check)
        self._mark_durable = False
        self._boundary_writes = boundary_writes
        self._last: tuple[Chunk, bytes | None] | None = None  # the turn's last chunk, held for its close
        self._last_written = False
        self.carried = False

    @property
    def position(self) -> int:
        """The turn position the next chunk gets."""
        return self._position

    @property
    def followed(self) -> bool:
        """Whether a reader follows the run, so every write wakes it."""
        return self._followed

    def add(self, chunk: Chunk, encoded: bytes | None = None) -> None:
        """Log `chunk` (`encoded`: its JSON text, when the caller has it); a `finish-step` chunk is a
        step boundary."""
        if self._closed:
            return
        last = self._segments[-1] if self._segments else None
        if last is None or last.seq + len(last.chunks) != self._position:
            last = _Segment(self._position, False)
            self._segments.append(last)
        last.chunks.append(chunk)
        if encoded is not None and len(last.encoded) == len(last.chunks) - 1:
            last.encoded.append(encoded)
        self._position += 1
        if chunk.get("type") == "finish-step":
            self.step_boundary()
        elif self._followed:
            self._schedule()

    def step_boundary(self) -> None:
        """A step ended: write what the log holds now, without waiting (the write runs in the background;
        `await flush()` to wait for it). A `carried` log leaves it to the run's next write, unless it
        is followed or its `boundary_writes()` says this boundary stores more than chunks."""
        if self.carried and not self._followed and not (self._boundary_writes and self._boundary_writes()):
            return
        self._write_soon()

    def _write_soon(self) -> None:
        self._due = True
        self._schedule()

    async def flush_before_close(self) -> None:
        """Before the turn's close: a carried log writes now only what a step boundary asked to be
        written on its own (a durable turn's tool results), after a write in flight; the close
        carries the rest. Any other log writes everything now."""
        if not self.carried or self._due or self._lock.locked():
            await self.flush()

    def closing(self, chunk: Chunk, encoded: bytes | None = None) -> None:
        """The turn's last chunk (`finish`), known before the turn closes: the write that closes the run
        carries it after everything else (`carry(closing=True)`), else `close()` writes it. Given again
        before it is written, it replaces the earlier one (the turn's outcome changed)."""
        if not self._closed and not self._last_written:
            self._last = (chunk, encoded)

    @contextlib.asynccontextmanager
    async def carry(self, *, closing: bool = False) -> AsyncIterator[LogCarry]:
        """What the log holds, for a write the run makes anyway (a tool's claim, the turn's close) to
        store in its own transaction: no write of its own. With `closing`, the turn's last chunk too.
        If the block fails, all of it stays for the next write."""
        async with self._lock:
            if closing and self._last is not None:
                chunk, encoded = self._last
                self._last = None
                self.add(chunk, encoded)
                last: tuple[Chunk, bytes | None] | None = (chunk, encoded)
            else:
                last = None
            pending, self._segments = self._segments, []
            if pending and not pending[-1].chunks and not (closing or self._closed):
                self._segments.append(pending.pop())  # a new attempt's start waits for its chunks
            marking = self._mark_durable
            batches = [
                ChunkBatch(
                    segment.seq,
                    segment.chunks,
                    segment.reset,
                    durable=marking and index == 0,
                    notify=self._followed,
                    encoded=segment.encoded,
                )
                for index, segment in enumerate(pending)
            ]
            if marking and not batches:
                batches.append(ChunkBatch(self._position, (), durable=True, notify=self._followed))
            carried = LogCarry(batches)
            try:
                yield carried
            except BaseException:
                if last is not None:
                    self._withdraw(pending, last)
                self._segments[:0] = pending
                raise
            if marking:
                self._mark_durable = False
            self._owed = False
            self._last_written = self._last_written or last is not None
        if carried.stop and self._on_stop is not None:
            self._on_stop()

    def _withdraw(self, pending: list[_Segment], last: tuple[Chunk, bytes | None]) -> None:
        """Take the turn's last chunk back out of `pending` (its write failed): it is held again."""
        segment = pending[-1]
        segment.chunks.pop()
        if len(segment.encoded) > len(segment.chunks):
            segment.encoded.pop()
        if not segment.chunks and not segment.reset:
            pending.pop()
        self._position -= 1
        self._last = last

    def follow(self) -> None:
        """A reader follows the run: write what the log holds at once, a write of no chunks if it holds
        nothing (which wakes the reader all the same), and from now on every `interval`. Asked again,
        nothing more is owed: every write already wakes the readers."""
        if not self._followed:
            self._followed = True
            self.check()

    def check(self) -> None:
        """Write at once even with nothing to log, to learn whether the run was asked to stop."""
        self._owed = True
        self._write_soon()

    def mark_durable(self) -> None:
        """The run's workflow exists: the next write marks the run durable too, so the mark costs
        no transaction of its own (a write of no chunks carries it if nothing else comes). Durable
        chat turns no longer mark (their workflow's row keeps the run live: stores migration 0019)."""
        self._mark_durable = True
        self.check()

    def reset(self) -> None:
        """The next chunks start a new attempt at the current position, superseding an earlier one's."""
        self._segments.append(_Segment(self._position, True))

    def _schedule(self) -> None:
        if self._closed:
            return
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        self._wake.set()

    async def _run(self) -> None:
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            if not self._due:
                await asyncio.sleep(self._interval)  # followed: what comes meanwhile joins the write
            self._due = False
            await self.flush()

    async def flush(self) -> None:
        """Write everything added so far, in order (what is added meanwhile waits for the next write)."""
        async with self._lock:
            pending, self._segments = self._segments, []
            if pending and not pending[-1].chunks and not self._closed:
                self._segments.append(pending.pop())  # a new attempt's start waits for its chunks
            wrote = False
            for index, segment in enumerate(pending):
                try:
                    written = await self._write(segment.seq, segment.chunks, segment.reset, segment.encoded)
                except BaseException:
                    # Cancelled mid-write (`close` stops the writer while the database is slow to
                    # answer): the next flush writes it again, or the log would have a gap.
                    self._segments[:0] = pending[index:]
                    raise
                if not written:
                    self._segments[:0] = pending[index:]
                    return
                wrote = True
            if self._mark_durable or (self._owed and not wrote):
                await self._write(self._position, (), False, ())
            self._owed = False

    async def _write(self, seq: int, chunks: Sequence[Chunk], reset: bool, encoded: Sequence[bytes]) -> bool:
        """One batch to the sink, carrying the durable mark if one is pending; False when it failed."""
        marking = self._mark_durable
        batch = ChunkBatch(seq, chunks, reset, durable=marking, notify=self._followed, encoded=encoded)
        try:
            stop = await self._sink(batch)
        except Exception:
            logger.warning("Writing a run's stream failed; it is retried with the next batch.")
            return False
        if marking:
            self._mark_durable = False
        if stop and self._on_stop is not None:
            self._on_stop()
        return True

    async def close(self) -> None:
        """Flush (with the turn's last chunk, if no write carried it) and stop writing; later chunks
        are dropped."""
        if self._last is not None:
            chunk, encoded = self._last
            self._last = None
            self.add(chunk, encoded)
        self._closed = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self.flush()
        finally:
            if self._on_close is not None:
                self._on_close()
                self._on_close = None


class LiveTurns(Protocol):
    """A store's live turns: stream logs, followers and stop requests, across processes."""

    def log(
        self,
        identity: StoreIdentity,
        run_id: str,
        *,
        on_stop: Callable[[], None],
        checkpoints: TurnCheckpoints | None = None,
    ) -> ChunkLog: ...

    def stop_signal(self, run_id: str) -> contextlib.AbstractContextManager[asyncio.Event]: ...

    async def request_stop(self, identity: StoreIdentity, conversation_id: str) -> str | None: ...

    async def live_run(self, identity: StoreIdentity, conversation_id: str) -> LiveRun | None: ...

    def follow(self, identity: StoreIdentity, run_id: str, *, reset_step: bool = False) -> FollowedRun:
        """The run's stream from its start, then live; may refuse a follower at once (a `StoreError`)."""
        ...


class FollowedRun(Protocol):
    """A follower's stream of a run: its chunks (or the groups each read brought), and `aclose()` to
    stop following at once."""

    def __aiter__(self) -> AsyncIterator[Chunk]: ...

    def groups(self) -> AsyncIterator[list[Chunk]]: ...

    async def aclose(self) -> None: ...
