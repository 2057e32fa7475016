"""HTTP routes over the caller's memories: list them, read one's history, forget one.

User routes only: the caller is the verified principal, and row-level security decides the rest, so
another user's memory id is the same 404 as a missing one. Memories are written by the agent (the
`remember` tool, extraction), never through these routes.
"""

from __future__ import annotations

from datetime import datetime

from starlette.requests import Request
from starlette.responses import Response

from bastion.api import StrictModel, json_response, operation
from bastion.memory._text import check_scope
from bastion.memory.postgres import PostgresMemoryStore
from bastion.stores import StoreIdentity
from bastion.worker import RequestContext, Route

__all__ = ["memory_routes"]


class MemoryOut(StrictModel):
    """One memory the agent keeps about the caller."""

    id: str
    text: str
    source: str
    created_at: datetime


class MemoryList(StrictModel):
    """The caller's memories, newest first."""

    memories: list[MemoryOut]


class MemoryVersionOut(StrictModel):
    """One version of a memory; `superseded_at` is null for the current one."""

    text: str
    source: str
    created_at: datetime
    superseded_at: datetime | None


class MemoryHistory(StrictModel):
    """Every version of one memory, oldest first."""

    versions: list[MemoryVersionOut]


def memory_routes(memory: PostgresMemoryStore, *, scope: str, prefix: str = "/api/memories") -> list[Route]:
    """`GET {prefix}`, `GET {prefix}/{memory_id}/history` and `DELETE {prefix}/{memory_id}`."""
    check_scope(scope)

    @operation(responses={200: MemoryList})
    async def list_memories(request: Request, context: RequestContext) -> Response:
        """The caller's memories, newest first."""
        items = await memory.list_memories(_identity(context), scope=scope)
        return json_response(
            MemoryList(
                memories=[
                    MemoryOut(id=item.id, text=item.text, source=item.source, created_at=item.created_at)
                    for item in items
                ]
            )
        )

    @operation(responses={200: MemoryHistory}, errors=(400, 404))
    async def history(request: Request, context: RequestContext) -> Response:
        """Every version of one of the caller's memories, oldest first."""
        versions = await memory.history(_identity(context), str(context.params.get("memory_id")), scope=scope)
        return json_response(
            MemoryHistory(
                versions=[
                    MemoryVersionOut(
                        text=version.text,
                        source=version.source,
                        created_at=version.created_at,
                        superseded_at=version.superseded_at,
                    )
                    for version in versions
                ]
            )
        )

    @operation(responses={204: None}, errors=(400, 404))
    async def forget(request: Request, context: RequestContext) -> Response:
        """Forget one of the caller's memories, with all its versions."""
        await memory.forget(_identity(context), str(context.params.get("memory_id")), scope=scope)
        return Response(status_code=204)

    return [
        Route(method="GET", path=prefix, auth="user", handler=list_memories),
        Route(method="GET", path=f"{prefix}/{{memory_id}}/history", auth="user", handler=history),
        Route(method="DELETE", path=f"{prefix}/{{memory_id}}", auth="user", handler=forget),
    ]


def _identity(context: RequestContext) -> StoreIdentity:
    return StoreIdentity.from_principal(context.require_principal())
