"""Errors every bastion store raises: a stable machine `code` and a message safe to show a user.

A missing and a foreign row raise the same `NotFoundError`, so ids cannot be probed. Database
details never reach these messages; they stay in the chained exception for logs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from bastion.errors import BastionError, ToolError

__all__ = [
    "ConversationBusyError",
    "InvalidInputError",
    "NotFoundError",
    "StoreError",
    "TooManyFollowersError",
    "ToolOperationConflictError",
    "ToolOperationError",
    "ToolOperationMismatchError",
    "ToolOperationUncertainError",
    "TurnConflictError",
]


class StoreError(BastionError):
    """Base class of the errors a store raises on purpose."""

    code: ClassVar[str] = "store_error"
    default_message: ClassVar[str] = "The request could not be completed."

    def __init__(self) -> None:
        super().__init__(self.default_message)


class InvalidInputError(StoreError):
    """A malformed id, cursor, limit or field, refused before any query runs."""

    code = "invalid_input"
    status = 400
    default_message = "The request is not valid."


class NotFoundError(StoreError):
    """The conversation or message does not exist, or belongs to someone else: the same answer."""

    code = "not_found"
    status = 404
    default_message = "The conversation or message was not found."


class TurnConflictError(StoreError):
    """Another turn holds the conversation, the revision is stale, or the request id was used before."""

    code = "turn_conflict"
    status = 409
    default_message = "The conversation is busy or changed. Reload it before continuing."


class ConversationBusyError(TurnConflictError):
    """A live turn holds the conversation; `Retry-After` says when its lease runs out (at most)."""

    default_message = "Another turn is running in this conversation. Retry when it has finished."

    def __init__(self, retry_after: float = 1.0) -> None:
        super().__init__()
        self.retry_after = max(1, math.ceil(retry_after))

    @property
    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": str(self.retry_after)}


class TooManyFollowersError(StoreError):
    """The caller (or the turn) already has as many streams following running turns as a process
    allows (`bastion.stores.FollowerLimits`); `Retry-After` says when to try again."""

    code = "too_many_followers"
    status = 429
    default_message = "Too many streams of your replies are open. Close one or try again shortly."

    def __init__(self, retry_after: int = 5) -> None:
        super().__init__()
        self.retry_after = max(1, retry_after)

    @property
    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ToolOperationError(StoreError, ToolError):
    """A claim that refuses to run a tool call. Also a `ToolError`: the agent loop shows its message
    to the model and the UI as the call's error, instead of a generic failure."""


class ToolOperationConflictError(ToolOperationError):
    """The same tool call is running right now, in this request or another."""

    code = "operation_in_progress"
    status = 409
    default_message = "This tool call is already running."


class ToolOperationMismatchError(ToolOperationError):
    """A tool call id was claimed before with another tool name or input."""

    code = "operation_mismatch"
    status = 409
    default_message = "This tool call does not match the one recorded earlier."


class ToolOperationUncertainError(ToolOperationError):
    """An earlier attempt failed or was interrupted, so the side effect may have happened: no replay.

    Only a tool declared idempotent runs again; for any other the outcome stays unknown.
    """

    code = "operation_uncertain"
    status = 409
    default_message = (
        "The outcome of this tool call is unknown: an earlier attempt may have completed it, "
        "so it was not run again. Check its effect before asking for it again."
    )
