"""Errors a tool raises on purpose, whose message is meant for the model and the user."""

from __future__ import annotations

__all__ = ["ToolError"]


class ToolError(Exception):
    """Raise from a tool to report a failure in words you chose; any other exception is shown generically.

    The message reaches the model and the UI (after the tool's `model_error` policy, if any), so it
    must not contain secrets or internal details.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
