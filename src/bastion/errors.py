"""Errors whose code and message are safe to show a client, and the one a tool raises on purpose."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

__all__ = ["BastionError", "DatabaseUnavailableError", "ToolError"]


class BastionError(Exception):
    """A refusal the client may see: a stable machine `code`, a message that leaks nothing, an HTTP status.

    The worker answers any of these with `{"code": ..., "message": ...}` and `status`, plus `field`
    (the request value at fault, such as `messages[0].role`) when the error names one; every other
    exception is an internal error and only its generic text leaves the server.
    """

    code: ClassVar[str] = "error"
    status: ClassVar[int] = 400
    field: str | None = None

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if field is not None:
            self.field = field

    @property
    def headers(self) -> Mapping[str, str]:
        """HTTP headers the answer carries (`Retry-After` for a busy conversation); none by default."""
        return {}


class DatabaseUnavailableError(BastionError):
    """The database cannot be reached right now (restarting, failing over, out of connections): the
    worker answers any connection-level database error with this, never a 500, until the pools have
    healthy connections again."""

    code: ClassVar[str] = "database_unavailable"
    status: ClassVar[int] = 503
    retry_after: ClassVar[int] = 2

    def __init__(self) -> None:
        super().__init__("The service is briefly unavailable. Try again in a few seconds.")

    @property
    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ToolError(Exception):
    """Raise from a tool to report a failure in words you chose; any other exception is shown generically.

    The message reaches the model and the UI (after the tool's `model_error` policy, if any), so it
    must not contain secrets or internal details.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
