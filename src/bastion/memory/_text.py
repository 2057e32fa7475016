"""Text rules shared by memory: scope names, the normal form duplicates are detected in, vectors as SQL."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Final

from bastion.stores.entities import check_text

__all__ = ["check_scope", "content_hash", "normalize", "vector_literal"]

_SCOPE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
_SPACE: Final = re.compile(r"\s+")
OPERATIONS_SCOPE: Final = "bastion-ops"


def check_scope(scope: object) -> str:
    """A scope name: letters, digits and `_.:-`, at most 100; the operations scope is reserved."""
    if not isinstance(scope, str) or not _SCOPE.fullmatch(scope) or scope == OPERATIONS_SCOPE:
        raise ValueError(
            f"Memory scope {scope!r} must be 1–100 letters, digits or _.:- (not {OPERATIONS_SCOPE})."
        )
    return scope


def normalize(text: str) -> str:
    """The form two writes of one fact share: case-folded, spaces collapsed, end punctuation dropped."""
    return _SPACE.sub(" ", text.casefold()).strip().rstrip(".!;").strip()


def content_hash(text: str) -> str:
    return hashlib.sha256(normalize(text).encode()).hexdigest()


def check_memory_text(text: object, *, max_length: int) -> str:
    """Stripped text Postgres can store, 1 to `max_length` characters."""
    if not isinstance(text, str):
        raise ValueError("Memory text must be a string.")
    return check_text(text.strip(), max_length=max_length)


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form, sent as a parameter and cast with `::vector` (no numpy, no adapter)."""
    return "[" + ",".join(format(float(value), ".8g") for value in vector) + "]"
