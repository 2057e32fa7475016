"""Errors of memory: stable machine codes, messages safe to show a user."""

from __future__ import annotations

from typing import ClassVar

from bastion.errors import BastionError

__all__ = ["MemoryDocumentConflictError", "MemoryNotSupportedError", "MemoryUnavailableError"]


class MemoryDocumentConflictError(BastionError):
    """A document write named a version that is no longer current: read it again, then retry."""

    code: ClassVar[str] = "memory_document_conflict"
    status: ClassVar[int] = 409

    def __init__(self, path: str, *, current_version: int | None) -> None:
        super().__init__("The document changed since it was read. Read it again before writing.")
        self.path = path
        self.current_version = current_version


class MemoryUnavailableError(BastionError):
    """No signed-in user (or no tenant, for knowledge), or a write only the application server may make."""

    code: ClassVar[str] = "memory_unavailable"
    status: ClassVar[int] = 403

    def __init__(self) -> None:
        super().__init__("Memory is not available to this caller.")


class MemoryNotSupportedError(RuntimeError):
    """The store cannot hold memory: it needs Postgres with pgvector (the SQLite store has none)."""

    code: ClassVar[str] = "memory_not_supported"

    def __init__(self, store: object) -> None:
        super().__init__(
            f"Memory needs Postgres with pgvector; {type(store).__name__} does not support it. "
            "Use PostgresStore (the embedded Postgres works for one machine)."
        )
