"""Versioned documents in Postgres: the agent's own notes per user and scope, with optimistic writes.

Each write names the version it read (`expected_version`, or None to create); a stale one raises
`MemoryDocumentConflictError` and changes nothing, and `update` rereads and retries. Recall records
live here too (scope `bastion-ops`), expiring after their time to live; `purge()` deletes expired
documents of every user and is for the application server's own housekeeping.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Final

from bastion._extras import missing_extra

try:
    import psycopg
except ImportError as error:
    raise missing_extra("bastion.memory", "memory", error) from error

from bastion.memory._text import check_scope
from bastion.memory.entities import MemoryDocument
from bastion.memory.errors import MemoryDocumentConflictError, MemoryUnavailableError
from bastion.stores import PostgresStore, StoreIdentity
from bastion.stores.entities import check_limit, check_text, is_storable_text

__all__ = ["PostgresMemoryDocuments"]

MAX_DOCUMENT_LENGTH: Final = 1_000_000
_LIVE: Final = "(expires_at is null or expires_at > now())"
_GET: Final = f"""
select path, content, version, updated_at from bastion.memory_documents
 where scope = %s and path = %s and {_LIVE}
"""
# Creating succeeds only where no live document has the path (an expired one is replaced).
_CREATE: Final = """
insert into bastion.memory_documents (scope, path, content, expires_at)
values (%s, %s, %s, now() + %s::interval)
on conflict (owner_id, tenant_id, scope, path) do update
  set content = excluded.content, version = bastion.memory_documents.version + 1,
      expires_at = excluded.expires_at, updated_at = now()
  where bastion.memory_documents.expires_at <= now()
returning path, content, version, updated_at
"""
_UPDATE: Final = f"""
update bastion.memory_documents
   set content = %s, version = version + 1, expires_at = now() + %s::interval, updated_at = now()
 where scope = %s and path = %s and version = %s and {_LIVE}
returning path, content, version, updated_at
"""
_DELETE: Final = f"""
delete from bastion.memory_documents where scope = %s and path = %s and version = %s and {_LIVE}
returning 1
"""
_LIST: Final = f"""
select path, content, version, updated_at from bastion.memory_documents
 where scope = %s and starts_with(path, %s) and {_LIVE} order by path limit %s
"""
_PURGE: Final = "select bastion.purge_memory_documents()"


class PostgresMemoryDocuments:
    """The caller's documents in one scope, under row-level security (owner and tenant)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    async def get(self, identity: StoreIdentity, path: str, *, scope: str) -> MemoryDocument | None:
        _check(scope, path)
        async with self._store.transaction(identity) as conn:
            cursor = await conn.execute(_GET, (scope, path))
        row = await cursor.fetchone()
        return _document(row) if row is not None else None

    async def list(
        self, identity: StoreIdentity, *, scope: str, prefix: str = "", limit: int = 100
    ) -> list[MemoryDocument]:
        check_scope(scope)
        check_limit(limit)
        if not isinstance(prefix, str) or len(prefix) > 500 or not is_storable_text(prefix):
            raise ValueError("A document path prefix is text of at most 500 characters.")
        async with self._store.transaction(identity) as conn:
            cursor = await conn.execute(_LIST, (scope, prefix, limit))
        return [_document(row) for row in await cursor.fetchall()]

    async def put(
        self,
        identity: StoreIdentity,
        path: str,
        content: str,
        *,
        scope: str,
        expected_version: int | None,
        ttl: timedelta | None = None,
    ) -> MemoryDocument:
        """Write `content` if the document is still at `expected_version` (None: it must not exist yet)."""
        _check(scope, path)
        if (
            not isinstance(content, str)
            or len(content) > MAX_DOCUMENT_LENGTH
            or not is_storable_text(content)
        ):
            raise ValueError(f"A document is text of at most {MAX_DOCUMENT_LENGTH} characters.")
        if expected_version is not None and (type(expected_version) is not int or expected_version < 1):
            raise ValueError("expected_version is a version read before (a positive whole number) or None.")
        try:
            async with self._store.transaction(identity) as conn:
                if expected_version is None:
                    cursor = await conn.execute(_CREATE, (scope, path, content, ttl))
                else:
                    cursor = await conn.execute(_UPDATE, (content, ttl, scope, path, expected_version))
                row = await cursor.fetchone()
                if row is None:
                    current = await (await conn.execute(_GET, (scope, path))).fetchone()
        except psycopg.Error as error:
            if error.sqlstate == "42501":
                raise MemoryUnavailableError() from error
            raise
        if row is None:
            raise MemoryDocumentConflictError(path, current_version=current[2] if current else None)
        return _document(row)

    async def update(
        self,
        identity: StoreIdentity,
        path: str,
        change: Callable[[str | None], str | Awaitable[str]],
        *,
        scope: str,
        attempts: int = 5,
    ) -> MemoryDocument:
        """Read, `change(content or None)`, write; on a conflict read again and retry (`attempts` times)."""
        for attempt in range(attempts):
            current = await self.get(identity, path, scope=scope)
            produced = change(current.content if current is not None else None)
            content = produced if isinstance(produced, str) else await produced
            try:
                return await self.put(
                    identity,
                    path,
                    content,
                    scope=scope,
                    expected_version=current.version if current is not None else None,
                )
            except MemoryDocumentConflictError:
                if attempt == attempts - 1:
                    raise
        raise ValueError("attempts must be at least 1.")

    async def delete(self, identity: StoreIdentity, path: str, *, scope: str, expected_version: int) -> None:
        """Delete the document if it is still at `expected_version`; otherwise a conflict."""
        _check(scope, path)
        async with self._store.transaction(identity) as conn:
            cursor = await conn.execute(_DELETE, (scope, path, expected_version))
            deleted = await cursor.fetchone()
            if deleted is None:
                current = await (await conn.execute(_GET, (scope, path))).fetchone()
        if deleted is None:
            raise MemoryDocumentConflictError(path, current_version=current[2] if current else None)

    async def purge(self) -> int:
        """Delete the expired documents of every user (recall records after their 7 days); how many.

        Runs as the application's own login role, without any user's identity: only a member of
        `bastion_runtime` may.
        """
        async with self._store.pool.connection() as conn:
            cursor = await conn.execute(_PURGE)
            row = await cursor.fetchone()
        return int(row[0]) if row is not None else 0


def _check(scope: str, path: object) -> None:
    check_scope(scope)
    check_text(path, max_length=500)


def _document(row: tuple[Any, ...]) -> MemoryDocument:
    path, content, version, updated = row
    return MemoryDocument(path=path, content=content, version=version, updated_at=updated)
