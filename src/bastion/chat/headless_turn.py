"""One persisted agent turn without HTTP, for scripts and jobs: `run_agent`.

It does what a chat route does for a verified caller, with the identity given by trusted code
instead of a token: create the conversation (recording the agent's name) or continue one of the
caller's, claim the turn through the store's persistence (so every tool call goes through its
operation claim), run the agent, and save the reply with the turn's status. A conversation that is
missing and one that belongs to someone else raise the same `ConversationNotFoundError`.

The agent's tools get an `AgentRunContext` (or what the application's `context` factory builds from
it): the caller's identity and the store, so a child agent started with `AgentRunContext.run_agent`
acts as the same user in the same tenant.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, TypedDict, TypeVar, Unpack, overload

from pydantic_ai.models import KnownModelName, Model
from pydantic_ai.settings import ModelSettings

from bastion._ui_chunks import UIMessage
from bastion.agent import Agent
from bastion.chat.turn_lifecycle import TurnLifecycle, message_text
from bastion.persistence import RunStatus, start_agent_run
from bastion.stores.entities import StoreIdentity, TurnContext, title_from_text
from bastion.stores.errors import NotFoundError
from bastion.stores.protocol import Store

__all__ = [
    "AgentRunContext",
    "AgentRunResult",
    "ConversationNotFoundError",
    "RunOptions",
    "RunStore",
    "run_agent",
]

ContextT = TypeVar("ContextT")

_TITLE_LENGTH: Final = 80


class ConversationNotFoundError(NotFoundError):
    """The conversation does not exist or is not the caller's: the same error, the same message."""

    default_message = "The conversation was not found."


# What `run_agent` needs of a store: the one `Store` protocol both stores implement.
RunStore: TypeAlias = Store


@dataclass(frozen=True, kw_only=True)
class AgentRunResult:
    """A finished turn: its conversation, how it ended, and the assistant's UI message as stored."""

    conversation_id: str
    status: RunStatus
    message: UIMessage
    finish_reason: str | None

    @property
    def text(self) -> str:
        """The reply's text parts, joined."""
        return message_text(self.message)


@dataclass(frozen=True, kw_only=True)
class AgentRunContext:
    """What the agent's tools get: who the turn runs for, in which conversation, through which store."""

    identity: StoreIdentity
    conversation_id: str
    store: RunStore = field(repr=False)
    model: Model | KnownModelName | str = field(repr=False)

    async def run_agent(
        self,
        agent: Agent[AgentRunContext],
        *,
        message: str,
        model: Model | KnownModelName | str | None = None,
        conversation_id: str | None = None,
    ) -> AgentRunResult:
        """Run a child agent as the same caller (same user, tenant and claims), in a conversation of its own
        unless `conversation_id` names one of the caller's."""
        return await run_agent(
            agent,
            message=message,
            model=model if model is not None else self.model,
            store=self.store,
            user_id=self.identity.user_id,
            tenant_id=self.identity.tenant_id,
            claims=self.identity.claims,
            conversation_id=conversation_id,
        )


class RunOptions(TypedDict, total=False):
    """`run_agent`'s optional settings: `tenant_id` and `claims` (extra token claims the database's
    rules may read) complete the caller's identity; `conversation_id` continues one of the caller's
    conversations; `title`, `state` and `columns` go to the conversation a run creates;
    `history_window` (default 100) is how many stored messages the turn reads; `model_settings` go to
    the model."""

    tenant_id: str | None
    conversation_id: str | None
    claims: Mapping[str, Any] | None
    title: str | None
    state: object
    columns: Mapping[str, object] | None
    history_window: int
    model_settings: ModelSettings | None


@overload
async def run_agent(
    agent: Agent[AgentRunContext],
    *,
    message: str,
    model: Model | KnownModelName | str,
    store: RunStore,
    user_id: str,
    context: None = None,
    **options: Unpack[RunOptions],
) -> AgentRunResult: ...


@overload
async def run_agent(
    agent: Agent[ContextT],
    *,
    message: str,
    model: Model | KnownModelName | str,
    store: RunStore,
    user_id: str,
    context: Callable[[AgentRunContext], ContextT],
    **options: Unpack[RunOptions],
) -> AgentRunResult: ...


async def run_agent(
    agent: Agent[Any],
    *,
    message: str,
    model: Model | KnownModelName | str,
    store: RunStore,
    user_id: str,
    context: Callable[[AgentRunContext], Any] | None = None,
    **options: Unpack[RunOptions],
) -> AgentRunResult:
    """Run one persisted turn of `agent` for `user_id` (in `tenant_id`) and return how it ended.

    Without `conversation_id` a conversation is created for the caller with the agent's name (and
    `title`, `state`, `columns` when given); with one, it must be the caller's. The identity is trusted
    as given: call this from code that has verified who it acts for. `claims` are extra token claims
    the database's rules may read. A failure of the model or a tool is saved as a failed turn, then
    raised.
    """
    if not isinstance(message, str) or not message.strip():
        raise ValueError("run_agent needs a non-blank message.")
    claims = options.get("claims")
    identity = StoreIdentity(user_id=user_id, tenant_id=options.get("tenant_id"), claims=dict(claims or {}))
    conversation_id = options.get("conversation_id")
    if conversation_id is None:
        title = options.get("title")
        created = await store.create_conversation(
            identity,
            title=title if title is not None else _title(message),
            agent_name=agent.name,
            state=options.get("state"),
            columns=options.get("columns"),
        )
        conversation_id = created.id
    else:
        try:
            conversation_id = (await store.get_conversation(identity, conversation_id)).id
        except NotFoundError:
            raise ConversationNotFoundError() from None
    turn = TurnContext(identity=identity, conversation_id=conversation_id, request_id=str(uuid.uuid4()))
    user_message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": message}]}
    try:
        run = await start_agent_run(
            persistence=store.persistence(history_window=options.get("history_window", 100)),
            context=turn,
            messages=[user_message],
            trigger="submit-message",
        )
    except NotFoundError:
        raise ConversationNotFoundError() from None
    run_context = AgentRunContext(
        identity=identity, conversation_id=conversation_id, store=store, model=model
    )
    lifecycle = TurnLifecycle(run)
    result = await lifecycle.open(
        agent,
        context=lambda: _built(context, run_context),
        model=model,
        messages=run.messages,
        execute_tool=run.execute_tool,
        model_settings=options.get("model_settings"),
    )
    reply = await lifecycle.collect(result)
    return AgentRunResult(
        conversation_id=conversation_id,
        status=reply.status,
        message=reply.message,
        finish_reason=reply.finish_reason,
    )


async def _built(context: Callable[[AgentRunContext], Any] | None, run_context: AgentRunContext) -> Any:
    """The tools' context: what the application's factory builds from `run_context`, else itself."""
    return context(run_context) if context is not None else run_context


def _title(message: str) -> str | None:
    return title_from_text(message, max_length=_TITLE_LENGTH)
