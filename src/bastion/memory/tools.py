"""The `remember` and `forget` tools: ordinary tools, so policies, approvals and claims apply as to any.
`remember` also waits for the user's approval in a turn where a tool's result came in, so content a tool
or an MCP server returned cannot store itself as a memory recalled into later turns.

They act for the turn's verified caller only (the identity is closed over, never an argument), and
return ids, so the model can forget what it remembered.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bastion.errors import ToolError
from bastion.memory.postgres import MAX_MEMORY_LENGTH, PostgresMemoryStore
from bastion.stores import InvalidInputError, NotFoundError, StoreIdentity
from bastion.tools import Tool, tool

__all__ = ["memory_tools"]


def memory_tools(
    store: PostgresMemoryStore,
    identity: StoreIdentity,
    *,
    scope: str,
    remember_name: str = "remember",
    forget_name: str = "forget",
) -> list[Tool]:
    """`remember(fact)` and `forget(memory_id)` for one caller and scope, under the given names."""

    @tool(name=remember_name)
    async def remember(fact: str) -> dict[str, Any]:
        """Remember a lasting fact about the user (one fact, in a full sentence) for later conversations.

        The same fact twice is kept once; a corrected fact replaces the one it corrects.
        """
        fact = fact.strip()
        if not fact:
            raise ToolError("A memory needs some text.")
        if len(fact) > MAX_MEMORY_LENGTH:
            raise ToolError(f"A memory can be at most {MAX_MEMORY_LENGTH} characters.")
        try:
            result = await store.remember(identity, fact, scope=scope, source="tool")
        except InvalidInputError:
            raise ToolError("That text cannot be stored.") from None
        return {"memory_id": result.memory_id, "outcome": result.outcome}

    @tool(name=forget_name)
    async def forget(memory_id: str) -> dict[str, Any]:
        """Forget one of the user's memories by its id (from the recalled memories or `remember`)."""
        try:
            await store.forget(identity, memory_id, scope=scope)
        except (NotFoundError, InvalidInputError):
            raise ToolError("There is no memory with that id.") from None
        return {"forgotten": memory_id}

    # A memory outlives the turn and is recalled into later ones: after a tool's result came in (which
    # may carry someone else's instructions), the user approves what is stored.
    return [replace(remember, approval_after_tool_results=True), forget]
