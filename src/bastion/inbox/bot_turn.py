"""One bot turn in a support conversation, run with the contact as principal.

The agent's context is an `InboxTurn`: the verified contact, the reply job and the inbox. It holds no
user and no `StoreIdentity`, so what needs a signed-in user finds none: `credential_auth(owner="user")`
answers "authorization required" before asking its provider, memory whose identity is looked up on the
turn (`identity=lambda turn: turn.identity`) recalls and stores nothing, and tools behind
`user_only_policy()` are never offered. `handoff_to_human(turn)` is the tool that asks for a human.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic_ai.models import KnownModelName, Model

from bastion.agent import Agent
from bastion.auth import Principal
from bastion.chat.turn_lifecycle import TurnLifecycle, message_text
from bastion.errors import ToolError
from bastion.inbox.principal import ContactPrincipal
from bastion.policies import ToolPolicy
from bastion.tools import Tool, tool

if TYPE_CHECKING:
    from bastion.inbox.store import PostgresInbox

__all__ = ["InboxTurn", "answer_as_contact", "handoff_to_human", "user_only_policy"]

ContextT = TypeVar("ContextT")

HANDOFF_TOOL = "handoff_to_human"


@dataclass(frozen=True, kw_only=True)
class InboxTurn:
    """The trusted context of a bot turn: `principal` is the contact, `job_id` the reply job."""

    principal: ContactPrincipal
    job_id: str
    inbox: PostgresInbox = field(repr=False)

    @property
    def identity(self) -> None:
        """A contact has no user identity: memory written for user turns (`identity=lambda ctx:
        ctx.identity`) finds none here, so it recalls and stores nothing."""
        return None


def handoff_to_human(turn: InboxTurn) -> Tool:
    """`handoff_to_human(reason)`: the conversation leaves bot mode for staff; this turn's reply posts."""

    @tool(name=HANDOFF_TOOL, idempotent=True)
    async def handoff(reason: str) -> dict[str, Any]:
        """Hand the conversation to a human member of staff, saying briefly why. Use it when the contact
        asks for a person or when you cannot help; then tell the contact someone will follow up."""
        text = reason.strip() if isinstance(reason, str) else ""
        if not text:
            raise ToolError("Say why the conversation needs a human.")
        await turn.inbox.request_handoff(turn.principal, text[:500], job_id=turn.job_id)
        return {"handed_off": True}

    return handoff


def _is_user(context: object) -> bool:
    return isinstance(getattr(context, "principal", None), Principal)


def user_only_policy(policy: ToolPolicy[ContextT] | None = None) -> ToolPolicy[ContextT]:
    """`policy` (or an open one) for a tool only a signed-in user may reach: hidden from any turn whose
    context's `principal` is not a verified user (a contact's, for one), and refused if called anyway."""
    base = policy or ToolPolicy[ContextT]()
    inner_visible = base.visible
    inner_execute = base.can_execute

    def visible(context: ContextT) -> bool:
        return _is_user(context) and (inner_visible is None or inner_visible(context))

    async def can_execute(context: ContextT, call: Any) -> bool:
        if not _is_user(context):
            return False
        if inner_execute is None:
            return True
        decision = inner_execute(context, call)
        return (await decision if inspect.isawaitable(decision) else decision) is True

    return ToolPolicy(
        visible=visible,
        can_execute=can_execute,
        needs_approval=base.needs_approval,
        model_output=base.model_output,
        model_error=base.model_error,
        denied_output=base.denied_output,
    )


async def answer_as_contact(
    agent: Agent[InboxTurn],
    *,
    turn: InboxTurn,
    model: Model | KnownModelName | str,
    history: Sequence[dict[str, Any]],
) -> str:
    """Run one turn of `agent` for the contact over `history`; the reply's text (may be empty)."""
    lifecycle = TurnLifecycle(None)  # a contact's turn stores no run: the job posts its reply
    result = await lifecycle.open(agent, context=lambda: _ready(turn), model=model, messages=history)
    return message_text((await lifecycle.collect(result)).message).strip()


async def _ready(turn: InboxTurn) -> InboxTurn:
    return turn
