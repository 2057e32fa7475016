"""HTTP routes over the caller's memories: list them, read one's history, forget one.

User routes only: the caller is the verified principal, and row-level security decides the rest, so
another user's memory id is the same 404 as a missing one. Memories are written by the agent (the
`remember` tool, extraction), never through these routes.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bastion.auth import Principal
from bastion.memory._text import check_scope
from bastion.memory.postgres import PostgresMemoryStore
from bastion.stores import StoreIdentity
from bastion.worker import RequestContext, Route

__all__ = ["memory_routes"]


def memory_routes(memory: PostgresMemoryStore, *, scope: str, prefix: str = "/api/memories") -> list[Route]:
    """`GET {prefix}`, `GET {prefix}/{memory_id}/history` and `DELETE {prefix}/{memory_id}`."""
    check_scope(scope)

    async def list_memories(request: Request, context: RequestContext) -> Response:
        """The caller's memories, newest first."""
        items = await memory.list_memories(_identity(context), scope=scope)
        return JSONResponse(
            {
                "memories": [
                    {
                        "id": item.id,
                        "text": item.text,
                        "source": item.source,
                        "created_at": item.created_at.isoformat(),
                    }
                    for item in items
                ]
            }
        )

    async def history(request: Request, context: RequestContext) -> Response:
        """Every version of one of the caller's memories, oldest first."""
        versions = await memory.history(_identity(context), str(context.params.get("memory_id")), scope=scope)
        return JSONResponse(
            {
                "versions": [
                    {
                        "text": version.text,
                        "source": version.source,
                        "created_at": version.created_at.isoformat(),
                        "superseded_at": version.superseded_at.isoformat() if version.superseded_at else None,
                    }
                    for version in versions
                ]
            }
        )

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
    principal: Principal | None = context.principal
    if principal is None:
        raise RuntimeError("A user route ran without a verified principal.")
    return StoreIdentity.from_principal(principal)
