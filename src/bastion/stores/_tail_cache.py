"""What this process last saw of a conversation's stored tail, so a later turn claims in one round trip.

An entry is the revision a claim or finish of this process left, the conversation's last position
and every stored row from `first_seq` on. It is only a guess: the database checks the revision
under the conversation's lock before anything is written (`bastion.claim_turn`), and a stale guess
costs a fresh load, never a wrong write. Entries are keyed by user, tenant and conversation, so one
identity never reconciles against what another loaded, and the least recently used ones go first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from bastion.stores.entities import StoreIdentity

__all__ = [
    "CachedTail",
    "TailCache",
    "TailKey",
    "claimed_tail",
    "finished_tail",
    "loaded_tail",
    "tail_key",
]

TailKey: TypeAlias = tuple[str, str | None, str]
DEFAULT_MAX_ROWS = 400
Row: TypeAlias = tuple[int, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class CachedTail:
    """Stored rows from `first_seq` to `last_seq` as of `revision`; rows before `first_seq` may exist.

    `incarnation` tells apart a conversation deleted and created again under the same id, whose
    revisions start again at zero; a tail without one has not been through a claim and is not used.
    """

    revision: int
    last_seq: int
    first_seq: int
    rows: tuple[Row, ...]
    incarnation: str | None = None

    def covers_window(self, window: int) -> bool:
        """Whether the rows hold the last `window` messages (or the whole conversation)."""
        return self.first_seq <= max(1, self.last_seq - window + 1)

    def ids(self) -> frozenset[str]:
        return frozenset(str(message.get("id")) for _, message in self.rows)


def tail_key(identity: StoreIdentity, conversation_id: str) -> TailKey:
    return (identity.user_id, identity.tenant_id, conversation_id)


def loaded_tail(revision: int, last_seq: int, rows: Sequence[Row]) -> CachedTail:
    """The tail a fresh load returned: it holds every stored row from its first one on."""
    first = rows[0][0] if rows else last_seq + 1
    return CachedTail(revision, last_seq, first, tuple(rows))


def claimed_tail(
    before: CachedTail,
    *,
    truncate_after: int | None,
    written_from: int | None,
    revision: int,
    last_seq: int,
    written: Sequence[Row],
    incarnation: str,
) -> CachedTail:
    """`before` after a claim dropped the rows after `truncate_after` and wrote `written` (as stored)."""
    kept = tuple(
        (seq, message)
        for seq, message in before.rows
        if (truncate_after is None or seq <= truncate_after) and (written_from is None or seq < written_from)
    )
    return CachedTail(revision, last_seq, before.first_seq, kept + tuple(written), incarnation)


def finished_tail(before: CachedTail, *, revision: int, last_seq: int, saved: Row | None) -> CachedTail:
    """`before` after a finish appended or replaced the response `saved` (as stored)."""
    if saved is None:
        return CachedTail(revision, last_seq, before.first_seq, before.rows, before.incarnation)
    kept = tuple(row for row in before.rows if row[0] < saved[0])
    return CachedTail(revision, last_seq, before.first_seq, (*kept, saved), before.incarnation)


class TailCache:
    """A bounded least-recently-used map of `CachedTail`s; `size` 0 remembers nothing.

    A tail of more than `max_rows` messages is not kept: memory stays bounded by `size * max_rows`
    messages, and a very long conversation simply claims in two round trips.
    """

    def __init__(self, size: int, *, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        if type(size) is not int or size < 0:
            raise ValueError("The claim cache size must be a non-negative integer.")
        if type(max_rows) is not int or max_rows < 1:
            raise ValueError("The claim cache's max_rows must be a positive integer.")
        self._size = size
        self._max_rows = max_rows
        self._entries: OrderedDict[TailKey, CachedTail] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: TailKey) -> CachedTail | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: TailKey, entry: CachedTail) -> None:
        """Remember `entry`, unless this process already saw a later revision of the conversation."""
        if self._size == 0:
            return
        if len(entry.rows) > self._max_rows:
            self._entries.pop(key, None)
            return
        current = self._entries.get(key)
        if current is not None and current.revision > entry.revision:
            return
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def evict(self, key: TailKey) -> None:
        self._entries.pop(key, None)
