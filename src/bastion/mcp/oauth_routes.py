"""HTTP routes for users' OAuth connections: list them, start a sign-in, finish it, disconnect.

Every route is a user route: the caller is the verified principal, and the pending authorization a
callback finishes must be theirs. The authorization server sends the browser back to the application's
`redirect_uri` (a page, not these routes: a redirect carries no bearer token); that page posts the `state`
and `code` (or `error`) it was given to the callback route with the user's session.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from bastion.api import StrictModel, json_response, operation
from bastion.mcp.oauth import ConnectionStatus, McpOAuth
from bastion.worker import RequestContext, Route

__all__ = ["oauth_connection_routes"]

_Text = Annotated[str, Field(min_length=1, max_length=200)]
_Param = Annotated[str, Field(min_length=1, max_length=4096)]


class ConnectionOut(StrictModel):
    name: str
    status: str
    scopes: list[str]
    connected_at: datetime | None


class ConnectionList(StrictModel):
    connections: list[ConnectionOut]


class AuthorizeIn(StrictModel):
    conversation_id: _Text | None = None
    tool_call_id: _Text | None = None


class AuthorizeOut(StrictModel):
    authorization_url: str


class CallbackIn(StrictModel):
    state: _Param
    code: _Param | None = None
    error: _Param | None = None
    iss: _Param | None = None


def oauth_connection_routes(oauth: McpOAuth, *, prefix: str = "/api/connections") -> list[Route]:
    """`GET {prefix}`, and per connection `POST {prefix}/{name}/oauth/authorize`, `.../oauth/callback` and
    `DELETE {prefix}/{name}/oauth`."""

    @operation(responses={200: ConnectionList})
    async def list_connections(request: Request, context: RequestContext) -> Response:
        """The caller's OAuth connections: connected, not connected or expired, scopes, since when."""
        statuses = await oauth.connections(context.require_principal())
        return json_response(ConnectionList(connections=[_out(status) for status in statuses]))

    @operation(
        body=AuthorizeIn, body_required=False, responses={200: AuthorizeOut}, errors=(400, 404, 409, 502)
    )
    async def authorize(request: Request, context: RequestContext, *, body: AuthorizeIn) -> Response:
        """Start the caller's sign-in at the connection's server: the URL to send the browser to."""
        url = await oauth.start(
            context.require_principal(),
            str(context.params.get("name")),
            conversation_id=body.conversation_id,
            tool_call_id=body.tool_call_id,
        )
        return json_response(AuthorizeOut(authorization_url=url))

    @operation(body=CallbackIn, responses={200: ConnectionOut}, errors=(400, 404))
    async def callback(request: Request, context: RequestContext, *, body: CallbackIn) -> Response:
        """Finish the caller's sign-in with what the server sent back; refused ones store nothing."""
        name, user = str(context.params.get("name")), context.require_principal()
        await oauth.complete(user, name, state=body.state, code=body.code, error=body.error, iss=body.iss)
        statuses = {status.name: status for status in await oauth.connections(user)}
        return json_response(_out(statuses[name]))

    @operation(responses={204: None}, errors=(404,))
    async def disconnect(request: Request, context: RequestContext) -> Response:
        """Forget the caller's tokens for the connection, revoking them at the server when it can."""
        await oauth.disconnect(context.require_principal(), str(context.params.get("name")))
        return Response(status_code=204)

    return [
        Route(method="GET", path=prefix, auth="user", handler=list_connections),
        Route(method="POST", path=f"{prefix}/{{name}}/oauth/authorize", auth="user", handler=authorize),
        Route(method="POST", path=f"{prefix}/{{name}}/oauth/callback", auth="user", handler=callback),
        Route(method="DELETE", path=f"{prefix}/{{name}}/oauth", auth="user", handler=disconnect),
    ]


def _out(status: ConnectionStatus) -> ConnectionOut:
    return ConnectionOut(
        name=status.name, status=status.status, scopes=list(status.scopes), connected_at=status.connected_at
    )
