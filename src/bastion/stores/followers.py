"""Followers of running turns in one process: one shared reader per turn and owner feeds every local
follower, and caps per user and per turn bound how many follow at once.

A resumed stream (`GET …/stream`) follows its turn's log until the turn ends. Read one per follower,
N followers of one turn would cost the database N reads per written batch, so a user opening many
slowed everyone's turns. Here the first follower of a (run, owner) starts a `_Feed` that reads the log
(as that owner, under row-level security) and keeps every batch it read; each follower replays the
batches from the first and then waits for the feed's next ones. The feed stops when its last follower
leaves or the turn ends. Feeds are keyed by run *and* owner (user and tenant), so followers of
different users never share one, whatever run id they name.

The caps are per process: a follower past `FollowerLimits.per_user` (all of a user's turns) or
`per_turn` (one turn) is refused with `TooManyFollowersError` (429, `Retry-After`) before anything
is read. Per process on purpose: what a follower costs (a connection, memory, a share of a reader) is its
process's, and a count shared by the workers would cost a database round trip on every resume and its
end (the chat docs' followers section says more).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from bastion._ui_chunks import Chunk
from bastion.stores.entities import StoreIdentity
from bastion.stores.errors import TooManyFollowersError
from bastion.stores.live import ChunkBatch, StreamAssembly, StreamInterrupted, StreamSuperseded

__all__ = ["DEFAULT_FOLLOWER_LIMITS", "FollowedStream", "FollowerLimits", "TurnFollowers"]

LogRows: TypeAlias = Sequence[tuple[int, int, bool, list[Chunk]]]
"""Rows of a run's log: (row id, turn position, reset, chunks)."""

LogReader: TypeAlias = Callable[[StoreIdentity, str, int, bool], Awaitable[tuple[bool, LogRows]]]
"""Reads a run's log rows after a row id as its owner: (whether the run is in flight, the rows). Its
last argument asks the worker running the turn to write live (at first, and after a wait in vain)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowerLimits:
    """How many streams may follow running turns at once in one process: `per_user` over all of a
    user's turns, `per_turn` for one turn; a follower past either is refused with 429 and
    `Retry-After: retry_after_seconds`."""

    per_user: int = 20
    per_turn: int = 10
    retry_after_seconds: int = 5

    def __post_init__(self) -> None:
        for name in ("per_user", "per_turn", "retry_after_seconds"):
            if getattr(self, name) < 1:
                raise ValueError(f"FollowerLimits.{name} must be at least 1.")


DEFAULT_FOLLOWER_LIMITS: Final = FollowerLimits()

_FeedKey: TypeAlias = tuple[str, str, str | None]  # run, user, tenant


class _Feed:
    """One reader of one run's log for one owner: what it read, in order, for every local follower."""

    def __init__(self, key: _FeedKey, identity: StoreIdentity, read: LogReader, poll_seconds: float) -> None:
        self.key = key
        self.batches: list[ChunkBatch] = []
        self.ended = False
        self.error: Exception | None = None
        self.wake = asyncio.Event()  # new rows may be in the log (a notification, a reconnect)
        self.followers: set[asyncio.Event] = set()
        self._identity = identity
        self._read = read
        self._poll = poll_seconds
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Read the log from its start, then as the turn writes it, until the turn ends: after the
        `finish` chunk, or when the run is no longer in flight and its log is read to the end (adding
        a `finish` the log lacks). A run seen in flight writes its last chunks just after it settles:
        that write is waited for (at most `poll_seconds`) before the end."""
        run_id = self.key[0]
        assembly = StreamAssembly()
        after = 0
        ask = True  # for the run to be streamed live: at first, and whenever a wait found nothing
        tail_awaited = True  # nothing to wait for until the run is seen in flight
        try:
            while True:
                self.wake.clear()
                live, rows = await self._read(self._identity, run_id, after, ask)
                for row_id, seq, reset, chunks in rows:
                    after = row_id
                    self._add(assembly, ChunkBatch(seq, chunks, reset))
                self._notify()
                if assembly.finished:
                    return
                if live:
                    tail_awaited = False
                elif not rows and tail_awaited:
                    if assembly.chunks and assembly.chunks[0].get("type") == "start":
                        self._add(assembly, ChunkBatch(len(assembly.chunks), [{"type": "finish"}]))
                    return
                elif not rows:
                    tail_awaited = True
                try:
                    async with asyncio.timeout(self._poll):  # not wait_for: see hooks/delivery.py
                        await self.wake.wait()
                    ask = False
                except TimeoutError:
                    ask = True  # the request may have been missed, or the turn taken over elsewhere
        except Exception as error:
            self.error = error
        finally:
            self.ended = True
            self._notify()

    def _add(self, assembly: StreamAssembly, batch: ChunkBatch) -> None:
        assembly.apply(batch)
        self.batches.append(batch)

    def _notify(self) -> None:
        for event in self.followers:
            event.set()


class FollowedStream:
    """One follower's stream of a run: every chunk from the turn's start, then live until it ends.

    An async iterator of UI message chunks, or of the groups of chunks each read brought (`groups()`,
    which a response sends as one write each); `aclose()` (also run when it ends) frees its place at
    once, and stops the shared reader if it was the last follower.
    """

    def __init__(self, followers: TurnFollowers, feed: _Feed, user: str, *, reset_step: bool) -> None:
        self._followers = followers
        self._feed = feed
        self._user = user
        self._wake = asyncio.Event()
        self._left = False
        feed.followers.add(self._wake)
        self._groups = self._stream(reset_step)
        self._pending: deque[Chunk] = deque()

    def __aiter__(self) -> FollowedStream:
        return self

    async def __anext__(self) -> Chunk:
        while not self._pending:
            self._pending.extend(await anext(self._groups))
        return self._pending.popleft()

    def groups(self) -> AsyncIterator[list[Chunk]]:
        """The stream as the groups of chunks each read brought (read either this or the chunks)."""
        return self._groups

    async def aclose(self) -> None:
        """Stop following: the place is freed at once."""
        await self._groups.aclose()
        self._leave()

    async def _stream(self, reset_step: bool) -> AsyncGenerator[list[Chunk], None]:
        """The feed's batches from its first, each applied to this follower's own assembly. Everything
        read is applied before anything is sent: an attempt superseded within what was read (a
        take-over, read after the fact) is never sent, only what stands."""
        feed, assembly, index = self._feed, StreamAssembly(), 0
        try:
            while True:
                self._wake.clear()
                fresh = feed.batches[index:]
                index += len(fresh)
                superseded = False
                for batch in fresh:
                    superseded = assembly.apply(batch) or superseded
                group: list[Chunk] = []
                if superseded:
                    if not reset_step:
                        raise StreamSuperseded()
                    group.append({"type": "reset-step"})
                group += assembly.take()
                if group:
                    yield group
                if feed.ended and index == len(feed.batches):
                    if feed.error is not None:
                        raise feed.error
                    return
                await self._wake.wait()
        finally:
            self._leave()

    def _leave(self) -> None:
        if not self._left:
            self._left = True
            self._followers.leave(self._feed, self._wake, self._user)


class TurnFollowers:
    """The followers of running turns in this process: their shared feeds and the caps on them."""

    def __init__(self, read: LogReader, *, limits: FollowerLimits, poll_seconds: float) -> None:
        self.limits = limits
        self._read = read
        self._poll = poll_seconds
        self._feeds: dict[_FeedKey, _Feed] = {}
        self._per_user: dict[str, int] = {}

    def follow(self, identity: StoreIdentity, run_id: str, *, reset_step: bool = False) -> FollowedStream:
        """A new follower of `identity`'s run `run_id`, fed by the run's shared reader (started for the
        first). Refused with `TooManyFollowersError` when the user or the turn has its fill."""
        key: _FeedKey = (run_id, identity.user_id, identity.tenant_id)
        feed = self._feeds.get(key)
        if self._per_user.get(identity.user_id, 0) >= self.limits.per_user or (
            feed is not None and len(feed.followers) >= self.limits.per_turn
        ):
            raise TooManyFollowersError(self.limits.retry_after_seconds)
        if feed is None:
            feed = self._feeds[key] = _Feed(key, identity, self._read, self._poll)
            feed.task = asyncio.ensure_future(self._feed_until_done(feed))
        self._per_user[identity.user_id] = self._per_user.get(identity.user_id, 0) + 1
        return FollowedStream(self, feed, identity.user_id, reset_step=reset_step)

    @property
    def readers(self) -> int:
        """How many shared readers run now (one per followed turn and owner)."""
        return len(self._feeds)

    def count(self, user_id: str) -> int:
        """How many streams `user_id` follows now in this process."""
        return self._per_user.get(user_id, 0)

    def wake(self, run_id: str) -> None:
        """The run's log has new rows: its readers read them now rather than at their next poll."""
        for feed in self._feeds.values():
            if feed.key[0] == run_id:
                feed.wake.set()

    def wake_all(self) -> None:
        """Notifications may have been missed (the listener reconnected): every reader reads again."""
        for feed in self._feeds.values():
            feed.wake.set()

    def leave(self, feed: _Feed, wake: asyncio.Event, user_id: str) -> None:
        feed.followers.discard(wake)
        left = self._per_user.get(user_id, 0) - 1
        if left > 0:
            self._per_user[user_id] = left
        else:
            self._per_user.pop(user_id, None)
        if not feed.followers:
            self._drop(feed)
            if feed.task is not None and not feed.task.done():
                feed.task.cancel()

    async def _feed_until_done(self, feed: _Feed) -> None:
        try:
            await feed.run()
        finally:
            self._drop(feed)  # a later follower of an ended turn starts afresh

    def _drop(self, feed: _Feed) -> None:
        if self._feeds.get(feed.key) is feed:
            del self._feeds[feed.key]

    async def close(self) -> None:
        """Stop every reader; their followers end short (`StreamInterrupted`), so their clients resume."""
        feeds, self._feeds = list(self._feeds.values()), {}
        for feed in feeds:
            feed.error = StreamInterrupted()
            if feed.task is not None:
                feed.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feed.task
