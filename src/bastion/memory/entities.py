"""The shapes memory returns: memories and their versions, knowledge chunks, documents and recalls."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias

__all__ = [
    "KnowledgeChunk",
    "KnowledgeDocument",
    "MemoryDocument",
    "MemoryItem",
    "MemoryVersion",
    "Recall",
    "RecalledMemory",
    "RememberOutcome",
    "RememberResult",
]

RememberOutcome: TypeAlias = Literal["created", "duplicate", "updated"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryItem:
    """A current archival memory. `id` stays the same across the versions a near-duplicate makes."""

    id: str
    text: str
    source: str
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryVersion:
    """One version of a memory, oldest first in a history; the current one has no `superseded_at`."""

    text: str
    source: str
    created_at: datetime
    superseded_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RememberResult:
    """What a write did: `created` a memory, found it a `duplicate`, or `updated` a near-duplicate."""

    outcome: RememberOutcome
    memory_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RecalledMemory:
    id: str
    text: str
    similarity: float


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeChunk:
    document_id: str
    title: str
    seq: int
    text: str
    similarity: float


@dataclass(frozen=True, slots=True, kw_only=True)
class KnowledgeDocument:
    id: str
    collection: str
    title: str
    chunks: int
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Recall:
    """The memory context of one operation: core memory, nearest memories and knowledge chunks.

    `replayed` tells that the answer was stored by an earlier call with the same operation id.
    """

    core: dict[str, str] = field(default_factory=dict)
    memories: tuple[RecalledMemory, ...] = ()
    knowledge: tuple[KnowledgeChunk, ...] = ()
    replayed: bool = False

    @property
    def empty(self) -> bool:
        return not (self.core or self.memories or self.knowledge)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recall:
        return cls(
            core={str(label): str(text) for label, text in (data.get("core") or {}).items()},
            memories=tuple(
                RecalledMemory(
                    id=str(item["id"]), text=str(item["text"]), similarity=float(item["similarity"])
                )
                for item in data.get("memories") or []
            ),
            knowledge=tuple(
                KnowledgeChunk(
                    document_id=str(item["document_id"]),
                    title=str(item["title"]),
                    seq=int(item["seq"]),
                    text=str(item["text"]),
                    similarity=float(item["similarity"]),
                )
                for item in data.get("knowledge") or []
            ),
            replayed=bool(data.get("replayed", False)),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryDocument:
    """A versioned document: write it back with `expected_version=version`, or get a conflict."""

    path: str
    content: str
    version: int
    updated_at: datetime
