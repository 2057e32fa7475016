"""What a hook receives: one event of a conversation's stream, with the outbox id that names it.

The types are the run events the store records (`run.*`, `tool.*`, `approval.*`) and the message
events of the outbox (`message.received`, `message.completed`, `message.deleted`). A hook sees an
event at least once; `id` is stable across redeliveries, so a hook that keys its writes by it acts
once in effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

__all__ = ["EVENT_TYPES", "HookEvent"]

EVENT_TYPES: Final = frozenset(
    {
        "run.started",
        "run.waiting_for_approval",
        "run.completed",
        "run.failed",
        "run.cancelled",
        "run.interrupted",
        "tool.started",
        "tool.completed",
        "tool.failed",
        "approval.requested",
        "approval.responded",
        "message.received",
        "message.completed",
        "message.deleted",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HookEvent:
    """One outbox event. `user_id`/`tenant_id` own the conversation; `signed_in` is false for an
    anonymous user. `run_event_id` is the event's cursor in the conversation's run events, if it is
    one; message events carry `messageId`, `seq`, `role`, `parentId` and (but deleted) `message`."""

    id: int
    type: str
    conversation_id: str
    run_id: str | None
    user_id: str
    tenant_id: str | None
    signed_in: bool
    data: dict[str, Any] = field(repr=False)
    run_event_id: int | None
    created_at: datetime
