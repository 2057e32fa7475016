"""The inbox's refusals, each with a stable code and a message that leaks nothing."""

from __future__ import annotations

from typing import ClassVar

from bastion.errors import BastionError

__all__ = ["ChannelUnauthorizedError", "ContactTokenError", "NotInboxStaffError", "ThreadConflictError"]


class ChannelUnauthorizedError(BastionError):
    """The webhook's bearer secret is missing or is not the channel's (or there is no such channel)."""

    code: ClassVar[str] = "invalid_channel_secret"
    status: ClassVar[int] = 401

    def __init__(self) -> None:
        super().__init__("The channel's secret is missing or wrong.")


class ContactTokenError(BastionError):
    """The contact token is missing, malformed, forged or expired."""

    code: ClassVar[str] = "invalid_contact_token"
    status: ClassVar[int] = 401

    def __init__(self) -> None:
        super().__init__("Open the conversation again.")


class ThreadConflictError(BastionError):
    """The channel's thread already belongs to another contact."""

    code: ClassVar[str] = "thread_conflict"
    status: ClassVar[int] = 409

    def __init__(self) -> None:
        super().__init__("This thread belongs to another contact.")


class NotInboxStaffError(BastionError):
    """The signed-in user staffs no inbox here."""

    code: ClassVar[str] = "not_inbox_staff"
    status: ClassVar[int] = 403

    def __init__(self) -> None:
        super().__init__("You do not staff this inbox.")
