"""The assistant's agent: identity lookup, notes kept in Postgres for the user, a skill catalog and a
permission map — the framework's features as an integrator would combine them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bastion import (
    Agent,
    AgentTools,
    Skill,
    Tool,
    ToolCall,
    ToolError,
    ToolPolicy,
    compose_tools,
    define_agent,
    tool,
)
from bastion.auth import Principal
from bastion.memory import AgentMemory
from bastion.stores import StoreIdentity

__all__ = ["AssistantContext", "NoteBook", "assistant_agent"]

MAX_NOTE_LENGTH = 2000

INSTRUCTIONS = """You are bastion's reference assistant. Be brief and concrete.
You can look up who the user is, list their notes and save a new note (the user approves each save).
Never claim to have saved a note unless the save_note tool returned it."""

MEMORY_INSTRUCTIONS = """You remember lasting facts about the user across conversations: call remember
with one fact in a full sentence when the user tells you something worth keeping, and forget with a
memory's id when they ask you to. What you remember is shown to you before their message."""

NOTE_WRITING = """Good notes are short: one fact per note, written so that it still makes sense in a month.
Put the date in the note when it matters. Do not store passwords or other secrets in notes."""


class NoteBook(Protocol):
    """The signed-in user's notes; every call runs as that user under row-level security."""

    async def list(self) -> list[dict[str, Any]]: ...

    async def add(self, text: str, *, idempotency_key: str) -> dict[str, Any]: ...


@dataclass(frozen=True)
class AssistantContext:
    """The trusted context of one turn, built by the server from the verified token."""

    principal: Principal
    conversation_id: str
    notes: NoteBook
    remote_tools: Callable[[], Awaitable[AgentTools]] | None = field(default=None, repr=False)
    identity: StoreIdentity | None = field(default=None, repr=False)
    operation_id: str | None = None


def _local_tools(context: AssistantContext) -> list[Tool]:
    principal = context.principal

    # Reads, and a save keyed by its operation: each may run again after an uncertain outcome.
    @tool(idempotent=True)
    async def get_identity() -> dict[str, Any]:
        """Get the signed-in user's identity."""
        return {
            "user_id": principal.id,
            "email": principal.email,
            "role": principal.role,
            "is_anonymous": principal.is_anonymous,
        }

    @tool(idempotent=True)
    async def list_notes() -> dict[str, Any]:
        """List the user's saved notes, newest first."""
        return {"notes": await context.notes.list()}

    @tool(needs_approval=True, idempotent=True)
    async def save_note(text: str, call: ToolCall) -> dict[str, Any]:
        """Save a short note for the user. The user approves each save."""
        text = text.strip()
        if not text:
            raise ToolError("A note needs some text.")
        if len(text) > MAX_NOTE_LENGTH:
            raise ToolError(f"A note can be at most {MAX_NOTE_LENGTH} characters.")
        # The operation key, not the provider's call id (some reuse `call_0` everywhere): unique to
        # this call and the same for its retries, so a save run again after a crash finds its note.
        if call.operation_key is None:
            raise ToolError("A note can only be saved by a tool call.")
        return await context.notes.add(text, idempotency_key=call.operation_key)

    return [get_identity, list_notes, save_note]


async def _tools(context: AssistantContext, memory: AgentMemory[AssistantContext] | None) -> AgentTools:
    local = _local_tools(context) + (memory.tools(context) if memory is not None else [])
    if context.remote_tools is None:
        return AgentTools(tools=local)
    remote = await context.remote_tools()
    try:
        return AgentTools(
            tools=compose_tools(local, remote.tools), close=remote.close, instructions=remote.instructions
        )
    except BaseException:
        if remote.close is not None:
            await remote.close()
        raise


def _identity_for_model(output: Any, context: AssistantContext, call: ToolCall) -> Any:
    """The model learns who the user is, not their email address; the user's own screen shows it."""
    return {key: value for key, value in output.items() if key != "email"}


def _may_write_notes(context: AssistantContext, call: ToolCall) -> bool:
    return not context.principal.is_anonymous


def assistant_agent(
    *,
    remote_tool_names: Sequence[str] = (),
    sign_in_tool_names: Sequence[str] = (),
    memory: AgentMemory[AssistantContext] | None = None,
) -> Agent[AssistantContext]:
    """The assistant; `remote_tool_names` are the MCP tools the permission map admits, each approved by
    the user, and `sign_in_tool_names` the tools that ask the user to sign in to a server (their card is
    the pause). With `memory` it recalls what it knows about the user each turn and may remember and
    forget facts."""
    permissions: dict[str, ToolPolicy[AssistantContext]] = {
        "get_identity": ToolPolicy(model_output=_identity_for_model),
        "list_notes": ToolPolicy(),
        "save_note": ToolPolicy(
            can_execute=_may_write_notes,
            denied_output={"error": "sign_in_required", "message": "Sign in with an account to save notes."},
        ),
        "load_skill": ToolPolicy(),
    }
    if memory is not None:
        permissions[memory.remember_name] = ToolPolicy()
        permissions[memory.forget_name] = ToolPolicy()
    for name in remote_tool_names:
        permissions[name] = ToolPolicy(needs_approval=True)
    for name in sign_in_tool_names:
        permissions[name] = ToolPolicy()

    async def load_note_writing() -> str:
        return NOTE_WRITING

    async def tools(context: AssistantContext) -> AgentTools:
        return await _tools(context, memory)

    return define_agent(
        name="assistant",
        instructions=INSTRUCTIONS if memory is None else f"{INSTRUCTIONS}\n{MEMORY_INSTRUCTIONS}",
        tools=tools,
        skills=[
            Skill(
                name="note-writing",
                description="How to write notes that stay useful.",
                load=load_note_writing,
            )
        ],
        permissions=permissions,
        max_steps=6,
        context_messages=memory.context_messages if memory is not None else None,
    )
