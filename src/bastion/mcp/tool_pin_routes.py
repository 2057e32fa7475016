"""HTTP routes for administrators to review MCP tool changes held by the approved lists, and decide them.

Only a user whose verified token carries `admin_role` among its roles (`Principal.roles`, read from the
server-controlled claims, never the user-editable metadata) may use them; anyone else is refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from bastion.api import StrictModel, json_response, operation
from bastion.errors import BastionError
from bastion.mcp.tool_pins import ToolChange, ToolPinReview, change_diff
from bastion.worker import RequestContext, Route

__all__ = ["ToolChangeNotFoundError", "tool_pin_routes"]


class ToolChangeNotFoundError(BastionError):
    """No open change has that id (never recorded, or already decided)."""

    code: ClassVar[str] = "tool_change_not_found"
    status: ClassVar[int] = 404


class ToolChangeOut(StrictModel):
    id: int
    connection: str
    tool: str
    kind: str
    status: str
    detected_at: datetime
    detected_by: str | None
    decided_at: datetime | None
    decided_by: str | None
    diff: str


class ToolChangeList(StrictModel):
    changes: list[ToolChangeOut]


class ChangesQuery(StrictModel):
    status: Annotated[Literal["pending", "approved", "refused", "accepted", "all"], Field()] = "pending"


class Decision(StrictModel):
    id: int
    status: str


def tool_pin_routes(
    review: ToolPinReview, *, admin_role: str = "admin", prefix: str = "/api/admin/mcp/tool-changes"
) -> list[Route]:
    """`GET {prefix}` (`?status=pending` by default), `POST {prefix}/{id}/approve` and `.../refuse`."""

    async def administrators_only(request: Request, context: RequestContext) -> bool:
        return context.principal is not None and admin_role in context.principal.roles

    @operation(query=ChangesQuery, responses={200: ToolChangeList}, errors=(400, 403))
    async def list_changes(request: Request, context: RequestContext, *, query: ChangesQuery) -> Response:
        """The recorded tool changes, newest first, each with a diff of the approved and offered tool."""
        changes = await review.changes(status=None if query.status == "all" else query.status)
        return json_response(ToolChangeList(changes=[_out(change) for change in changes]))

    async def decide(context: RequestContext, *, approve: bool) -> Response:
        change_id = _change_id(context.params.get("id"))
        principal = context.principal
        by = (principal.email or principal.id) if principal is not None else "unknown"
        if change_id is None or not await review.decide(change_id, approve=approve, by=by):
            raise ToolChangeNotFoundError("No open tool change has that id.")
        return json_response(Decision(id=change_id, status="approved" if approve else "refused"))

    @operation(responses={200: Decision}, errors=(403, 404))
    async def approve_change(request: Request, context: RequestContext) -> Response:
        """Approve the change: the tool is offered as the server now lists it."""
        return await decide(context, approve=True)

    @operation(responses={200: Decision}, errors=(403, 404))
    async def refuse_change(request: Request, context: RequestContext) -> Response:
        """Refuse the change: the tool stays out while the server lists it so."""
        return await decide(context, approve=False)

    return [
        Route(method="GET", path=prefix, auth="user", handler=list_changes, authorize=administrators_only),
        Route(
            method="POST",
            path=f"{prefix}/{{id}}/approve",
            auth="user",
            handler=approve_change,
            authorize=administrators_only,
        ),
        Route(
            method="POST",
            path=f"{prefix}/{{id}}/refuse",
            auth="user",
            handler=refuse_change,
            authorize=administrators_only,
        ),
    ]


def _change_id(value: object) -> int | None:
    text = str(value)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def _out(change: ToolChange) -> ToolChangeOut:
    return ToolChangeOut(
        id=change.id,
        connection=change.connection,
        tool=change.tool,
        kind=change.kind,
        status=change.status,
        detected_at=change.detected_at,
        detected_by=change.detected_by,
        decided_at=change.decided_at,
        decided_by=change.decided_by,
        diff=change_diff(change),
    )
