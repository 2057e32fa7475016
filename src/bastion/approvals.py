"""Approval decisions: who may answer a paused tool call, asked only after the answer is proven genuine.

An AI SDK approval request pauses a turn; it does not say who may answer it. `reconcile_agent_messages`
first checks a browser's answer against the stored pending call, then asks the application's
`can_respond_to_approval` policy about each new decision through `authorize_approval_decision`.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias, TypeVar

from bastion.errors import BastionError

__all__ = [
    "AgentApprovalAuthorizationError",
    "ApprovalDecision",
    "CanRespondToApproval",
    "authorize_approval_decision",
]

Context = TypeVar("Context")


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecision:
    """A user's answer to one stored approval request.

    Everything but `approved` and `reason` comes from the server's stored copy of the call, never from
    the browser, so a policy can trust the tool name, call id and input it is shown.
    """

    message_id: str
    approval_id: str
    tool_name: str
    tool_call_id: str
    input: Any
    approved: bool
    reason: str | None = None


CanRespondToApproval: TypeAlias = Callable[[Context, ApprovalDecision], bool | Awaitable[bool]]
"""Application policy: may the caller described by the context give this decision? Sync or async."""


class AgentApprovalAuthorizationError(BastionError):
    """The approval policy refused a decision, or failed (which counts as a refusal)."""

    code: ClassVar[str] = "approval_unauthorized"
    status: ClassVar[int] = 403

    def __init__(self) -> None:
        super().__init__("You do not have permission to respond to this approval request.")


async def authorize_approval_decision(
    decision: ApprovalDecision,
    *,
    context: Context,
    can_respond_to_approval: CanRespondToApproval[Context],
) -> None:
    """Ask the policy about one already-validated decision; anything but `True` refuses it.

    The policy gets a deep copy, so it cannot rewrite the stored call. Its errors are not chained to
    the raised error: their text may hold internals, and a broken policy must never grant permission.
    Cancellation is not an error and propagates.
    """
    try:
        answer = can_respond_to_approval(context, copy.deepcopy(decision))
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception:
        raise AgentApprovalAuthorizationError() from None
    if answer is not True:
        raise AgentApprovalAuthorizationError()
