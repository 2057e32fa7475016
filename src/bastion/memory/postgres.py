"""Memory in Postgres: core memory, archival memories, tenant knowledge and per-operation recall.

Every call runs in one transaction as the verified caller (`PostgresStore.transaction`), so row-level
security decides what each user reaches: their own memories inside their tenant, and their tenant's
knowledge. Recall is exact (the caller's rows first, then ordered by distance), so when k rows are
visible, k come back, whatever approximate index exists. Versioned documents and the purge of
expired operation records are `PostgresMemoryDocuments`, reached as `documents`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Final

from bastion._extras import missing_extra

try:
    import psycopg
except ImportError as error:
    raise missing_extra("bastion.memory", "memory", error) from error

from bastion.memory._text import check_memory_text, check_scope, content_hash, vector_literal
from bastion.memory.chunking import chunk_text
from bastion.memory.documents import PostgresMemoryDocuments
from bastion.memory.embedders import Embedder
from bastion.memory.entities import (
    KnowledgeChunk,
    KnowledgeDocument,
    MemoryItem,
    MemoryVersion,
    Recall,
    RecalledMemory,
    RememberResult,
)
from bastion.memory.errors import MemoryNotSupportedError, MemoryUnavailableError
from bastion.stores import NotFoundError, PostgresStore, StoreIdentity, apply_application_migrations
from bastion.stores._migrations import available_migrations
from bastion.stores.entities import check_limit, check_text, parse_uuid

__all__ = [
    "DEFAULT_NEAR_DUPLICATE_THRESHOLD",
    "DEFAULT_OPERATION_TTL",
    "PostgresMemoryStore",
    "apply_memory_migrations",
]

DEFAULT_NEAR_DUPLICATE_THRESHOLD: Final = 0.95
DEFAULT_OPERATION_TTL: Final = timedelta(days=7)
MAX_MEMORY_LENGTH: Final = 2000
MAX_CORE_LENGTH: Final = 4000
MAX_QUERY_LENGTH: Final = 8000
MAX_K: Final = 100
_SOURCES: Final = frozenset({"tool", "extract", "api"})

_REMEMBER: Final = "select bastion.remember_memory(%s, %s, %s, %s::vector, %s, %s, %s)"
_RECALL: Final = "select bastion.recall_memory(%s, %s, %s::vector, %s, %s, %s, %s)"
# Exact: `offset 0` keeps the ORDER BY away from any index, so every visible row is compared (see
# the migration); the text is read for the k nearest only.
_SEARCH: Final = """
with nearest as (
  select id, distance from (
    select id, embedding <=> %(query)s::vector as distance from bastion.memories
     where scope = %(scope)s and embedding_model = %(model)s and superseded_at is null
    offset 0
  ) mine
  order by distance limit %(k)s
)
select m.memory_id::text, m.content, 1 - n.distance
  from nearest n join bastion.memories m on m.id = n.id order by n.distance
"""
_SEARCH_KNOWLEDGE: Final = """
with nearest as (
  select id, distance from (
    select id, embedding <=> %(query)s::vector as distance from bastion.knowledge_chunks
     where collection = any (%(collections)s) and embedding_model = %(model)s
    offset 0
  ) shared
  order by distance limit %(k)s
)
select c.document_id::text, d.title, c.seq, c.content, 1 - n.distance
  from nearest n
  join bastion.knowledge_chunks c on c.id = n.id
  join bastion.knowledge_documents d on d.id = c.document_id
 order by n.distance
"""
_LIST: Final = """
select memory_id::text, content, source, created_at from bastion.memories
 where scope = %s and superseded_at is null order by created_at desc, id limit %s
"""
_HISTORY: Final = """
select content, source, created_at, superseded_at from bastion.memories
 where memory_id = %s and scope = %s order by created_at, id
"""
# Forgetting removes every version, and the stored recall answers that quoted it, so a replayed
# step cannot bring a forgotten memory back (it recalls afresh instead).
_FORGET: Final = "delete from bastion.memories where memory_id = %s and scope = %s returning 1"
_FORGET_RECALLS: Final = (
    "delete from bastion.memory_documents where scope = 'bastion-ops' and strpos(content, %s) > 0"
)
_CORE: Final = "select label, content from bastion.memory_core where scope = %s order by label"
_SET_CORE: Final = """
insert into bastion.memory_core (scope, label, content) values (%s, %s, %s)
on conflict (owner_id, tenant_id, scope, label)
do update set content = excluded.content, updated_at = now()
"""
_CLEAR_CORE: Final = "delete from bastion.memory_core where scope = %s and label = %s returning 1"
_ADD_DOCUMENT: Final = """
insert into bastion.knowledge_documents (collection, title) values (%s, %s)
returning id::text, collection, title, created_at
"""
_ADD_CHUNKS: Final = """
insert into bastion.knowledge_chunks (document_id, collection, seq, content, embedding, embedding_model)
select %s::uuid, %s, c.seq - 1, c.content, c.embedding::vector, %s
  from unnest(%s::text[], %s::text[]) with ordinality as c (content, embedding, seq)
"""
_DELETE_DOCUMENT: Final = "delete from bastion.knowledge_documents where id = %s returning 1"
_LIST_DOCUMENTS: Final = """
select d.id::text, d.collection, d.title, count(c.id), d.created_at
  from bastion.knowledge_documents d left join bastion.knowledge_chunks c on c.document_id = d.id
 where d.collection = any (%s) group by d.id order by d.created_at desc, d.id limit %s
"""


async def apply_memory_migrations(conninfo: str) -> list[int]:
    """Apply memory's migrations (component `memory`), after bastion's own (`apply_migrations`)."""
    return await apply_application_migrations(
        conninfo, component="memory", migrations=available_migrations("bastion.memory", "migrations")
    )


class PostgresMemoryStore:
    """Memory over a `PostgresStore`'s pool, each call as the verified caller under row-level security.

    `near_duplicate_threshold` is the cosine similarity at or above which a new memory supersedes
    the closest one instead of being added (the threshold belongs to the embedder's model).
    `operation_ttl` is how long a recall answer stays stored for its operation.
    """

    def __init__(
        self,
        store: PostgresStore,
        *,
        embedder: Embedder,
        near_duplicate_threshold: float = DEFAULT_NEAR_DUPLICATE_THRESHOLD,
        operation_ttl: timedelta = DEFAULT_OPERATION_TTL,
    ) -> None:
        if not isinstance(store, PostgresStore):
            raise MemoryNotSupportedError(store)
        if not 0.0 < near_duplicate_threshold <= 1.0:
            raise ValueError("near_duplicate_threshold is a cosine similarity in (0, 1].")
        if operation_ttl <= timedelta(0):
            raise ValueError("operation_ttl must be positive.")
        self._store = store
        self.embedder = embedder
        self.near_duplicate_threshold = near_duplicate_threshold
        self.operation_ttl = operation_ttl
        self.documents = PostgresMemoryDocuments(store)

    # Core memory

    async def get_core(self, identity: StoreIdentity, *, scope: str) -> dict[str, str]:
        """The caller's core memory in `scope`: text per label."""
        check_scope(scope)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_CORE, (scope,))
        return {label: content for label, content in await cursor.fetchall()}

    async def set_core(self, identity: StoreIdentity, label: str, content: str, *, scope: str) -> None:
        """Replace one label of the caller's core memory."""
        check_scope(scope)
        check_text(label, max_length=100)
        text = check_memory_text(content, max_length=MAX_CORE_LENGTH)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                await conn.execute(_SET_CORE, (scope, label, text))

    async def clear_core(self, identity: StoreIdentity, label: str, *, scope: str) -> bool:
        check_scope(scope)
        check_text(label, max_length=100)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_CLEAR_CORE, (scope, label))
        return await cursor.fetchone() is not None

    # Archival memories

    async def remember(
        self, identity: StoreIdentity, text: str, *, scope: str, source: str = "api"
    ) -> RememberResult:
        """Keep a fact: a duplicate is the memory already there; a near-duplicate updates the closest."""
        check_scope(scope)
        content = check_memory_text(text, max_length=MAX_MEMORY_LENGTH)
        if source not in _SOURCES:
            raise ValueError(f"source must be one of {sorted(_SOURCES)}.")
        [vector] = await self.embedder.embed_documents([content])
        params = (
            scope,
            content,
            content_hash(content),
            vector_literal(vector),
            self.embedder.model,
            self.near_duplicate_threshold,
            source,
        )
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_REMEMBER, params)
        row = await cursor.fetchone()
        assert row is not None
        return RememberResult(outcome=row[0]["outcome"], memory_id=row[0]["memory_id"])

    async def search(
        self, identity: StoreIdentity, query: str, *, scope: str, k: int = 5
    ) -> list[RecalledMemory]:
        """The caller's `k` current memories nearest `query`, nearest first (exact, not approximate)."""
        check_scope(scope)
        check_limit(k, maximum=MAX_K)
        [vector] = await self.embedder.embed_queries([check_memory_text(query, max_length=MAX_QUERY_LENGTH)])
        params = {"scope": scope, "model": self.embedder.model, "query": vector_literal(vector), "k": k}
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_SEARCH, params)
        return [
            RecalledMemory(id=memory_id, text=content, similarity=float(similarity))
            for memory_id, content, similarity in await cursor.fetchall()
        ]

    async def list_memories(
        self, identity: StoreIdentity, *, scope: str, limit: int = 100
    ) -> list[MemoryItem]:
        """The caller's current memories in `scope`, newest first."""
        check_scope(scope)
        check_limit(limit)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_LIST, (scope, limit))
        return [
            MemoryItem(id=memory_id, text=content, source=source, created_at=created)
            for memory_id, content, source, created in await cursor.fetchall()
        ]

    async def history(self, identity: StoreIdentity, memory_id: str, *, scope: str) -> list[MemoryVersion]:
        """Every version of one of the caller's memories, oldest first; `NotFoundError` for anyone else's."""
        check_scope(scope)
        memory = parse_uuid(memory_id)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_HISTORY, (memory, scope))
        versions = [
            MemoryVersion(text=content, source=source, created_at=created, superseded_at=superseded)
            for content, source, created, superseded in await cursor.fetchall()
        ]
        if not versions:
            raise NotFoundError()
        return versions

    async def forget(self, identity: StoreIdentity, memory_id: str, *, scope: str) -> None:
        """Delete one of the caller's memories with all its versions; `NotFoundError` for anyone else's."""
        check_scope(scope)
        memory = parse_uuid(memory_id)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_FORGET, (memory, scope))
                await conn.execute(_FORGET_RECALLS, (memory,))
        if not await cursor.fetchall():
            raise NotFoundError()

    # Knowledge

    async def add_knowledge(
        self,
        identity: StoreIdentity,
        title: str,
        text: str,
        *,
        collection: str = "default",
        max_chunk_chars: int = 1000,
    ) -> KnowledgeDocument:
        """Share a document with the caller's tenant, chunked and embedded.

        Only the application server may (its login role is a member of `bastion_runtime`); it decides
        which users may add knowledge. A caller without a tenant cannot share anything.
        """
        check_scope(collection)
        check_text(title, max_length=500)
        if identity.tenant_id is None:
            raise MemoryUnavailableError()
        chunks = chunk_text(check_memory_text(text, max_length=1_000_000), max_chars=max_chunk_chars)
        vectors = await self.embedder.embed_documents(chunks)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_ADD_DOCUMENT, (collection, title))
                row = await cursor.fetchone()
                assert row is not None
                await conn.execute(
                    _ADD_CHUNKS,
                    (row[0], collection, self.embedder.model, chunks, [vector_literal(v) for v in vectors]),
                )
        return KnowledgeDocument(
            id=row[0], collection=row[1], title=row[2], chunks=len(chunks), created_at=row[3]
        )

    async def list_knowledge(
        self, identity: StoreIdentity, *, collections: Sequence[str] = ("default",), limit: int = 100
    ) -> list[KnowledgeDocument]:
        names = [check_scope(name) for name in collections]
        check_limit(limit)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_LIST_DOCUMENTS, (names, limit))
        return [
            KnowledgeDocument(id=doc_id, collection=collection, title=title, chunks=count, created_at=created)
            for doc_id, collection, title, count, created in await cursor.fetchall()
        ]

    async def delete_knowledge(self, identity: StoreIdentity, document_id: str) -> None:
        """Delete a document of the caller's tenant (application server only); `NotFoundError` otherwise."""
        document = parse_uuid(document_id)
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_DELETE_DOCUMENT, (document,))
        if await cursor.fetchone() is None:
            raise NotFoundError()

    async def search_knowledge(
        self,
        identity: StoreIdentity,
        query: str,
        *,
        collections: Sequence[str] = ("default",),
        k: int = 5,
    ) -> list[KnowledgeChunk]:
        """The `k` chunks of the caller's tenant's `collections` nearest `query` (exact)."""
        names = [check_scope(name) for name in collections]
        check_limit(k, maximum=MAX_K)
        if identity.tenant_id is None or not names:
            return []
        [vector] = await self.embedder.embed_queries([check_memory_text(query, max_length=MAX_QUERY_LENGTH)])
        params = {"collections": names, "model": self.embedder.model, "query": vector_literal(vector), "k": k}
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_SEARCH_KNOWLEDGE, params)
        return [
            KnowledgeChunk(document_id=doc, title=title, seq=seq, text=content, similarity=float(similarity))
            for doc, title, seq, content, similarity in await cursor.fetchall()
        ]

    # Recall for one operation

    async def recall(
        self,
        identity: StoreIdentity,
        query: str,
        *,
        operation_id: str,
        scope: str,
        k: int = 5,
        knowledge_collections: Sequence[str] = ("default",),
    ) -> Recall:
        """Core memory plus the `k` nearest memories and knowledge chunks, stored under `operation_id`.

        The first call for an operation recalls and stores the answer (for `operation_ttl`); every
        later call returns that answer, even after memories were added. Knowledge is searched only
        inside the caller's tenant, in `knowledge_collections`.
        """
        check_scope(scope)
        check_text(operation_id, max_length=300)
        check_limit(k, maximum=MAX_K)
        names = [check_scope(name) for name in knowledge_collections]
        [vector] = await self.embedder.embed_queries([check_memory_text(query, max_length=MAX_QUERY_LENGTH)])
        params = (
            operation_id,
            scope,
            vector_literal(vector),
            self.embedder.model,
            k,
            names if identity.tenant_id is not None else [],
            self.operation_ttl,
        )
        with _memory_errors():
            async with self._store.transaction(identity) as conn:
                cursor = await conn.execute(_RECALL, params)
        row = await cursor.fetchone()
        assert row is not None
        answer: dict[str, Any] = row[0] if isinstance(row[0], dict) else json.loads(row[0])
        return Recall.from_json(answer)

    async def purge(self) -> int:
        """Delete every expired operation record (and any other expired document); return how many."""
        return await self.documents.purge()


@contextmanager
def _memory_errors() -> Iterator[None]:
    """A refused write (no signed-in user, not the application server) is a 403, nothing else changes."""
    try:
        yield
    except psycopg.Error as error:
        if error.sqlstate in {"BS403", "42501"}:
            raise MemoryUnavailableError() from error
        raise
