"""The signed-in user's notes in Postgres, read and written as that user under row-level security."""

from __future__ import annotations

from typing import Any

from bastion.stores import PostgresStore, StoreIdentity

__all__ = ["PostgresNoteBook"]

_LIST = """
select id::text, body, created_at from assistant.notes order by created_at desc, id limit 50
"""
# A repeated key (the same tool call run again) returns the note it saved the first time.
_ADD = """
with inserted as (
  insert into assistant.notes (body, idempotency_key) values (%(body)s, %(key)s)
  on conflict (owner_id, tenant_id, idempotency_key) do nothing
  returning id, body, created_at
)
select id::text, body, created_at from inserted
union all
select id::text, body, created_at from assistant.notes
where idempotency_key = %(key)s and not exists (select 1 from inserted)
"""


class PostgresNoteBook:
    """One user's notes; every statement runs in a transaction carrying that user's identity."""

    def __init__(self, store: PostgresStore, identity: StoreIdentity) -> None:
        self._store = store
        self._identity = identity

    async def list(self) -> list[dict[str, Any]]:
        async with self._store.transaction(self._identity) as conn:
            cursor = await conn.execute(_LIST)
            rows = await cursor.fetchall()
        return [_note(row) for row in rows]

    async def add(self, text: str, *, idempotency_key: str) -> dict[str, Any]:
        async with self._store.transaction(self._identity) as conn:
            cursor = await conn.execute(_ADD, {"body": text, "key": idempotency_key})
            row = await cursor.fetchone()
        if row is None:
            raise RuntimeError("The note was neither saved nor found.")
        return _note(row)


def _note(row: tuple[Any, ...]) -> dict[str, Any]:
    note_id, body, created_at = row
    return {"id": note_id, "text": body, "created_at": created_at.isoformat()}
