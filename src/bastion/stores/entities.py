"""The shapes every bastion store shares: who is asking, what a turn carries, and the rows it returns.

`StoreIdentity` is the verified caller as a store needs it; `StoreIdentity.from_principal` converts
the `bastion.auth.Principal` a token verifier returns. Ids and cursors are checked here, before any
query, so a malformed one is `InvalidInputError` and never a database error.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeAlias, TypeVar

from bastion.stores.checkpoints import TurnCheckpoints
from bastion.stores.errors import InvalidInputError

if TYPE_CHECKING:
    from bastion.auth import Principal
    from bastion.stores.live import ChunkLog

__all__ = [
    "Conversation",
    "Feedback",
    "Rating",
    "RunEvent",
    "StoreIdentity",
    "StoredMessage",
    "TurnContext",
    "TurnState",
]

StateT = TypeVar("StateT")

Rating: TypeAlias = Literal["up", "down"]

_MAX_TEXT: Final = 200
MAX_CURSOR: Final = 2**63 - 1
MAX_COMMENT: Final = 4000


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreIdentity:
    """The verified caller: a Supabase user id (a UUID), their tenant if any, and the token's claims.

    Only ever built from a verified token. The database reads the same identity from the claims the
    store sets per transaction: `sub` is the user and `app_metadata.tenant_id` the tenant, whatever
    claim the verifier read the tenant from.
    """

    user_id: str
    tenant_id: str | None = None
    claims: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "user_id", parse_uuid(self.user_id))
        if self.tenant_id is not None:
            check_text(self.tenant_id)

    @classmethod
    def from_principal(cls, principal: Principal) -> StoreIdentity:
        """The identity of a principal verified by `bastion.auth.TokenVerifier`."""
        return cls(user_id=principal.id, tenant_id=principal.tenant_id, claims=principal.claims)

    def database_claims(self) -> str:
        """The JSON set as `request.jwt.claims`: the verified claims, with subject and tenant pinned."""
        claims = dict(self.claims)
        app_metadata = claims.get("app_metadata")
        app_metadata = dict(app_metadata) if isinstance(app_metadata, Mapping) else {}
        app_metadata.pop("tenant_id", None)
        if self.tenant_id is not None:
            app_metadata["tenant_id"] = self.tenant_id
        claims.update(sub=self.user_id, role="authenticated", app_metadata=app_metadata)
        return json.dumps(claims, separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnContext:
    """What the application passes to `start_run`: the caller and the turn they asked for.

    `request_id` is unique per turn request (a repeat is a conflict); `expected_revision`, when the
    client sent one, must still be the conversation's revision.
    """

    identity: StoreIdentity
    conversation_id: str
    request_id: str
    expected_revision: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "conversation_id", parse_uuid(self.conversation_id))
        check_text(self.request_id)
        if self.expected_revision is not None:
            check_cursor(self.expected_revision)


@dataclass(slots=True, kw_only=True, eq=False)
class TurnState:
    """A claimed turn: plain, serializable ids, plus what this process still has to record.

    `unrecorded_results` and `running_tool_calls` name operations by their operation key.
    `checkpoints` is set on a durable turn's state (`bastion.stores.checkpoints`); `log` on a turn
    whose stream log the run's own writes carry (`ChunkLog.carry`).
    """

    conversation_id: str
    run_id: str
    revision: int
    pending_approval_ids: frozenset[str] = frozenset()
    unrecorded_results: list[dict[str, Any]] = field(default_factory=list, repr=False)
    running_tool_calls: set[str] = field(default_factory=set, repr=False)
    checkpoints: TurnCheckpoints | None = field(default=None, repr=False)
    log: ChunkLog | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Conversation(Generic[StateT]):
    """A conversation as the application sees it: the agent it belongs to, the application's typed
    state (None until set; see `bastion.stores.ConversationSchema`) and its registered columns."""

    id: str
    title: str | None
    tenant_id: str | None
    revision: int
    created_at: datetime
    updated_at: datetime
    agent_name: str | None = None
    state: StateT | None = None
    columns: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """One UI message as stored, with its position in the conversation."""

    seq: int
    id: str
    role: str
    message: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEvent:
    """One event of a conversation's ordered stream; `id` is the cursor for replay."""

    id: int
    run_id: str
    type: str
    data: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Feedback:
    conversation_id: str
    message_id: str
    rating: Rating
    comment: str | None
    updated_at: datetime


def parse_uuid(value: object) -> str:
    """The canonical text of a UUID; anything else is invalid input."""
    if not isinstance(value, str) or len(value) != 36:
        raise InvalidInputError()
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidInputError() from None


def check_text(value: object, *, max_length: int = _MAX_TEXT) -> str:
    """A non-empty string of at most `max_length` characters that Postgres can store."""
    if not isinstance(value, str) or not value or len(value) > max_length or not is_storable_text(value):
        raise InvalidInputError()
    return value


def is_storable_text(value: str) -> bool:
    """Whether Postgres can store `value`: no NUL and no lone surrogate (JSON can carry `\\ud800`)."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_cursor(value: object) -> int:
    """A non-negative bigint (event cursor, revision); `bool` is not a number here."""
    if type(value) is not int or not 0 <= value <= MAX_CURSOR:
        raise InvalidInputError()
    return value


def check_limit(value: object, *, maximum: int = 1000) -> int:
    if type(value) is not int or not 1 <= value <= maximum:
        raise InvalidInputError()
    return value


def title_from_text(text: str, *, max_length: int) -> str | None:
    """A conversation's title from a message: spaces collapsed, a long one cut at a word and marked `…`."""
    words = " ".join(text.split())
    if len(words) <= max_length:
        return words or None
    cut = words[: max_length - 1]
    space = cut.rfind(" ")
    if space >= max_length // 2:  # a word boundary not too far back; else one very long word is cut
        cut = cut[:space]
    return cut.rstrip(" ,;:.-") + "…"
