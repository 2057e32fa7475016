"""What this process last saw of a conversation's stored tail, so a later turn claims in one round trip.

An entry is the revision a claim or finish of this process left, the conversation's last position
and every stored row from `first_seq` on. It is only a guess: the database checks the revision
under the conversation's lock before anything is written (`bastion.claim_turn`), and a stale guess
costs a fresh load, never a wrong write. Entries are keyed by user, tenant and conversation, so one
identity never reconciles against what another loaded, and the least recently used ones go first.
The cache is bounded in messages and in bytes (each row's JSON length, measured once when it
enters), so large messages such as inline files cannot make a process hold more than its budget.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from bastion.stores.entities import StoreIdentity

__all__ = [
    "DEFAULT_MAX_BYTES",
    "CachedTail",
    "TailCache",
    "TailKey",
    "claimed_tail",
    "finished_tail",
    "loaded_tail",
    "row_size",
    "tail_key",
]

TailKey: TypeAlias = tuple[str, str | None, str]
DEFAULT_MAX_ROWS = 400
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
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
    sizes: tuple[int, ...] = ()  # each row's JSON length, in the order of `rows`; measured when not given

    def __post_init__(self) -> None:
        if not self.sizes and self.rows:
            object.__setattr__(self, "sizes", tuple(row_size(message) for _, message in self.rows))
        elif len(self.sizes) != len(self.rows):
            raise ValueError("A cached tail needs one size per row.")

    @property
    def size(self) -> int:
        return sum(self.sizes)

    def covers_window(self, window: int) -> bool:
        """Whether the rows hold the last `window` messages (or the whole conversation)."""
        return self.first_seq <= max(1, self.last_seq - window + 1)

    def ids(self) -> frozenset[str]:
        return frozenset(str(message.get("id")) for _, message in self.rows)


def tail_key(identity: StoreIdentity, conversation_id: str) -> TailKey:
    return (identity.user_id, identity.tenant_id, conversation_id)


def row_size(message: dict[str, Any]) -> int:
    """Roughly the memory a remembered message costs: the length of its JSON text."""
    return len(json.dumps(message, ensure_ascii=False, separators=(",", ":")))


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
    kept = [
        (row, size)
        for row, size in zip(before.rows, before.sizes, strict=True)
        if (truncate_after is None or row[0] <= truncate_after)
        and (written_from is None or row[0] < written_from)
    ]
    return CachedTail(
        revision,
        last_seq,
        before.first_seq,
        tuple(row for row, _ in kept) + tuple(written),
        incarnation,
        sizes=tuple(size for _, size in kept) + tuple(row_size(message) for _, message in written),
    )


def finished_tail(before: CachedTail, *, revision: int, last_seq: int, saved: Row | None) -> CachedTail:
    """`before` after a finish appended or replaced the response `saved` (as stored)."""
    if saved is None:
        return CachedTail(revision, last_seq, before.first_seq, before.rows, before.incarnation, before.sizes)
    kept = [(row, size) for row, size in zip(before.rows, before.sizes, strict=True) if row[0] < saved[0]]
    return CachedTail(
        revision,
        last_seq,
        before.first_seq,
        (*(row for row, _ in kept), saved),
        before.incarnation,
        sizes=(*(size for _, size in kept), row_size(saved[1])),
    )


class TailCache:
    """A bounded least-recently-used map of `CachedTail`s; `size` 0 remembers nothing.

    At most `size` tails and `max_bytes` of rows in all. A tail of more than `max_rows` messages or
    more than an eighth of `max_bytes` is not kept, so one conversation cannot push out the rest: a
    very long or very large conversation simply claims in two round trips.
    """

    def __init__(
        self, size: int, *, max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if type(size) is not int or size < 0:
            raise ValueError("The claim cache size must be a non-negative integer.")
        if type(max_rows) is not int or max_rows < 1:
            raise ValueError("The claim cache's max_rows must be a positive integer.")
        if type(max_bytes) is not int or max_bytes < 1:
            raise ValueError("The claim cache's max_bytes must be a positive integer.")
        self._size = size
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[TailKey, CachedTail] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """The bytes of rows remembered now."""
        return self._bytes

    def get(self, key: TailKey) -> CachedTail | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: TailKey, entry: CachedTail) -> None:
        """Remember `entry`, unless this process already saw a later revision of the conversation."""
        if self._size == 0:
            return
        if len(entry.rows) > self._max_rows or entry.size > self._max_bytes // 8:
            self.evict(key)
            return
        current = self._entries.get(key)
        if current is not None and current.revision > entry.revision:
            return
        self.evict(key)
        self._entries[key] = entry
        self._bytes += entry.size
        while len(self._entries) > self._size or self._bytes > self._max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= oldest.size

    def evict(self, key: TailKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
