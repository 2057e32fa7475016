"""The authenticated ASGI worker: routes that declare their authentication, each user request verified
against Supabase before any application code runs, JSON errors, a request body limit, and a client
disconnect turned into a cancellation signal for the handler.

Routes declared under `/api` are served under the API's version prefix (`/v1`), their declared paths
kept as aliases (`bastion.versioning`).

A request to a route goes: method check (405), bearer token verification on `auth="user"` routes (401),
declared body size (413), the route's `authorize` hook, the body (read in full and counted, 413), then
`handler(request, context)`. Errors from routing and routes pass through the application's middleware.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as StarletteRoute
from starlette.types import Lifespan, Message, Receive, Scope, Send

from bastion.auth import (
    AuthenticationError,
    KeySetUnavailableError,
    Principal,
    SupabaseEnv,
    TokenVerifier,
    bearer_token,
)
from bastion.errors import BastionError, DatabaseUnavailableError
from bastion.request_log import RequestLogMiddleware, access_log_enabled
from bastion.versioning import DEFAULT_VERSIONING, ApiVersionHeader, ApiVersioning

__all__ = [
    "AuthMode",
    "AuthorizeHook",
    "ErrorFormatter",
    "Handler",
    "RequestContext",
    "RequestFailure",
    "Route",
    "create_agent_worker",
]

logger = logging.getLogger(__name__)

AuthMode: TypeAlias = Literal["user", "none"]

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_INTERNAL_MESSAGE = "Unable to complete the request. Try again."
_STATUS_ERRORS: Mapping[int, tuple[str, str]] = {
    400: ("bad_request", "The request is not valid."),
    401: ("unauthorized", "Sign in to continue."),
    403: ("forbidden", "You do not have access to this."),
    404: ("not_found", "Nothing exists at this address."),
    405: ("method_not_allowed", "This method is not allowed here."),
    409: ("conflict", "The request conflicts with the current state. Reload and try again."),
    413: ("body_too_large", "The request body is too large."),
    422: ("unprocessable", "The request could not be processed."),
    429: ("rate_limited", "Too many requests. Try again later."),
    500: ("internal", _INTERNAL_MESSAGE),
    503: ("unavailable", "The service is unavailable. Try again."),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestContext:
    """What a handler may trust about its request.

    `principal` is the verified user (None on `auth="none"` routes); `params` are the route's path
    parameters; `cancel` is set when the client disconnects before the response has completed.
    """

    principal: Principal | None
    params: Mapping[str, Any]
    env: SupabaseEnv
    cancel: asyncio.Event

    def require_principal(self) -> Principal:
        """The verified user of an `auth="user"` route. The worker verifies the token before such a
        route runs, so a missing principal is a bug in the server, never the request's fault."""
        if self.principal is None:
            raise RuntimeError("A user route ran without a verified principal.")
        return self.principal


Handler: TypeAlias = Callable[[Request, RequestContext], Awaitable[Response]]
AuthorizeResult: TypeAlias = bool | Response | None
AuthorizeHook: TypeAlias = Callable[[Request, RequestContext], Awaitable[AuthorizeResult] | AuthorizeResult]
"""Runs after authentication, before the body is read. None or True allows; False refuses with 403;
a returned `Response` refuses with that response; a raised `HTTPException` refuses with its status."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFailure:
    """An error about to be shown to a client. `exception` is the cause, for logs only; `field` names
    the request value at fault, when the error knows it."""

    status: int
    code: str
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)
    exception: BaseException | None = None
    field: str | None = None


ErrorFormatter: TypeAlias = Callable[[Request, RequestFailure], Awaitable[Response] | Response]


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One endpoint. `auth` has no default: every route says whether it is public.

    A `path` under `/api` is served under the API's version prefix (`/v1/...`) and, as an alias, at
    `path`; `keep_declared_path` makes `path` a documented home too, for a client library that finds the
    route there (the AI SDK posts to `/api/chat`).
    """

    method: str
    path: str
    auth: AuthMode
    handler: Handler
    authorize: AuthorizeHook | None = None
    keep_declared_path: bool = False

    def __post_init__(self) -> None:
        if self.auth not in ("user", "none"):
            raise ValueError(f"Route {self.method} {self.path}: auth must be 'user' or 'none'.")
        method = self.method.upper() if isinstance(self.method, str) else self.method
        if method not in _METHODS:
            raise ValueError(f"Route {self.path}: unsupported method {self.method!r}.")
        object.__setattr__(self, "method", method)
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ValueError(f"Route path {self.path!r} must start with '/'.")
        if not callable(self.handler) or (self.authorize is not None and not callable(self.authorize)):
            raise TypeError(f"Route {self.method} {self.path}: handler and authorize must be callable.")


def create_agent_worker(
    *,
    env: SupabaseEnv,
    routes: Sequence[Route],
    middleware: Sequence[Middleware] = (),
    on_error: ErrorFormatter | None = None,
    max_body_bytes: int = 1_048_576,
    verifier: TokenVerifier | None = None,
    lifespan: Lifespan[Starlette] | None = None,
    access_log: bool | None = None,
    versioning: ApiVersioning | None = DEFAULT_VERSIONING,
) -> Starlette:
    """An ASGI application serving `routes`.

    `verifier` defaults to `TokenVerifier(env)`; pass one to choose the tenant and roles claims or the
    key refresh intervals. `middleware` wraps every response, errors included (CORS belongs here).
    Every request gets an id (`bastion.request_log`); `access_log` writes one `bastion.access` line
    per request, and by default follows the environment variable `BASTION_ACCESS_LOG`.
    `versioning` says where routes under `/api` are served (default: under `/v1`, their declared paths
    kept as aliases) and adds `X-Bastion-Api-Version` to every response; None serves every route at its
    declared path only. Give `openapi_document` the same versioning.
    """
    if verifier is not None and verifier.env is not env:
        raise ValueError("The verifier must be built from the same SupabaseEnv as the worker.")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 0:
        raise ValueError("max_body_bytes must be a non-negative integer.")
    by_path: dict[str, dict[str, Route]] = {}
    for route in routes:
        if not isinstance(route, Route):
            raise TypeError("routes must be bastion.worker.Route instances.")
        for served in _served_paths(route, versioning):
            methods = by_path.setdefault(served, {})
            if route.method in methods:
                raise ValueError(f"Route {route.method} {served} is declared twice.")
            methods[route.method] = route
    worker = _Worker(env, verifier or TokenVerifier(env), on_error, max_body_bytes)
    return Starlette(
        routes=[StarletteRoute(path, _PathEndpoint(worker, methods)) for path, methods in by_path.items()],
        middleware=[
            Middleware(
                RequestLogMiddleware,
                access_log=access_log_enabled() if access_log is None else access_log,
            ),
            *([Middleware(ApiVersionHeader, version=versioning.version)] if versioning is not None else []),
            *middleware,
        ],
        exception_handlers={HTTPException: worker.exception_response, Exception: worker.exception_response},
        lifespan=lifespan,
    )


def _served_paths(route: Route, versioning: ApiVersioning | None) -> list[str]:
    """Every path the worker serves `route` at under `versioning`, the versioned one first."""
    if versioning is None:
        return [route.path]
    return [
        served.path
        for served in versioning.served_paths(route.path, keep_declared_path=route.keep_declared_path)
    ]


class _BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        # Retrying cannot help: the message says the limit so the client can send less.
        said = f"The request body is too large: this server takes at most {_size(limit)}."
        super().__init__(status_code=413, detail=said)


def _size(limit: int) -> str:
    """A byte count as people read it: 1 MB, 64 KB, 300 bytes."""
    for unit, size in (("MB", 1 << 20), ("KB", 1 << 10)):
        if limit >= size:
            return f"{limit / size:.3g} {unit}"
    return f"{limit} bytes"


class _PathEndpoint:
    """The ASGI endpoint of one path: dispatches by method so 405 lists every method of the path."""

    def __init__(self, worker: _Worker, routes: Mapping[str, Route]) -> None:
        self._worker = worker
        self._routes = dict(routes)
        if "GET" in self._routes and "HEAD" not in self._routes:
            self._routes["HEAD"] = self._routes["GET"]
        self._allow = ", ".join(sorted(self._routes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._routes.get(scope["method"])
        if route is None:
            raise HTTPException(status_code=405, headers={"Allow": self._allow})
        await self._worker.serve(route, scope, receive, send)


class _Worker:
    def __init__(
        self,
        env: SupabaseEnv,
        verifier: TokenVerifier,
        on_error: ErrorFormatter | None,
        max_body_bytes: int,
    ) -> None:
        self._env = env
        self._verifier = verifier
        self._on_error = on_error
        self._max_body_bytes = max_body_bytes

    async def serve(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        channel = _RequestChannel(receive, limit=self._max_body_bytes)
        request = Request(scope, channel.receive)
        tracked = _TrackedSend(send, channel)
        try:
            try:
                response = await self._respond(route, request, channel)
            except ClientDisconnect:
                channel.client_disconnected()
                return
            except Exception as exc:
                response = await self.exception_response(request, exc)
            try:
                await response(scope, channel.receive, tracked)
            except ClientDisconnect:
                channel.client_disconnected()
            except Exception as exc:
                if tracked.started:
                    raise
                await (await self.exception_response(request, exc))(scope, channel.receive, tracked)
        finally:
            channel.close()

    async def _respond(self, route: Route, request: Request, channel: _RequestChannel) -> Response:
        principal = None
        if route.auth == "user":
            authorization = request.headers.getlist("authorization")
            if len(authorization) > 1:
                raise AuthenticationError("malformed_token")
            principal = await self._verifier.verify(bearer_token(authorization[0] if authorization else None))
        if _declared_length(request) > self._max_body_bytes:
            raise _BodyTooLarge(self._max_body_bytes)
        context = RequestContext(
            principal=principal,
            params=MappingProxyType(request.path_params),
            env=self._env,
            cancel=channel.cancel,
        )
        if route.authorize is not None:
            refusal = _refusal(await _resolved(route.authorize(request, context)))
            if refusal is not None:
                return refusal
        await request.body()
        response = await _resolved(route.handler(request, context))
        if not isinstance(response, Response):
            raise TypeError(f"The handler of {route.method} {route.path} returned {type(response).__name__}.")
        return response

    async def exception_response(self, request: Request, exc: Exception) -> Response:
        """Turn any exception into the response a client may see; the cause goes to logs only."""
        return await self._formatted(request, _failure(request, exc))

    async def _formatted(self, request: Request, failure: RequestFailure) -> Response:
        if self._on_error is not None:
            try:
                response = await _resolved(self._on_error(request, failure))
                if isinstance(response, Response):
                    return response
                raise TypeError(f"on_error returned {type(response).__name__}, not a Response.")
            except Exception:
                logger.exception("The on_error formatter failed; sending the default error.")
                failure = _internal(None)
        body = {"code": failure.code, "message": failure.message}
        if failure.field is not None:
            body["field"] = failure.field
        return JSONResponse(
            body,
            status_code=failure.status,
            headers=dict(failure.headers),
        )


class _RequestChannel:
    """The one reader of the ASGI `receive`: counts body bytes, then watches for the client leaving.

    Until the body is complete, messages pass through (so it is read once, by the request). After,
    a watcher awaits the next message: `http.disconnect` before the response completes sets `cancel`.
    Later readers (a streaming response listening for disconnects) wait on the watcher.
    """

    def __init__(self, receive: Receive, *, limit: int) -> None:
        self._receive = receive
        self._limit = limit
        self._received = 0
        self._watcher: asyncio.Task[None] | None = None
        self._gone = asyncio.Event()
        self.cancel = asyncio.Event()
        self.response_complete = False

    async def receive(self) -> Message:
        if self._watcher is not None:
            await self._gone.wait()
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.client_disconnected()
        elif message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._limit:
                raise _BodyTooLarge(self._limit)
            if not message.get("more_body", False):
                self._watcher = asyncio.ensure_future(self._watch())
        return message

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.client_disconnected()

    def client_disconnected(self) -> None:
        if not self.response_complete:
            self.cancel.set()
        self._gone.set()

    def close(self) -> None:
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()


class _TrackedSend:
    def __init__(self, send: Send, channel: _RequestChannel) -> None:
        self._send = send
        self._channel = channel
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self._channel.response_complete = True
        await self._send(message)


def _declared_length(request: Request) -> int:
    try:
        return int(request.headers.get("content-length", "0"))
    except ValueError:
        return 0


def _refusal(result: AuthorizeResult) -> Response | None:
    if result is None or result is True:
        return None
    if result is False:
        raise HTTPException(status_code=403)
    if isinstance(result, Response):
        return result
    raise TypeError(f"authorize returned {type(result).__name__}; expected None, a bool or a Response.")


async def _resolved(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _failure(request: Request, exc: Exception) -> RequestFailure:
    if isinstance(exc, AuthenticationError):
        challenge = "Bearer" if exc.code == "missing_token" else 'Bearer error="invalid_token"'
        return RequestFailure(
            status=401,
            code=exc.code,
            message=exc.message,
            headers={"WWW-Authenticate": challenge},
            exception=exc,
        )
    if isinstance(exc, KeySetUnavailableError):
        logger.error("Signing keys unavailable for %s %s.", request.method, request.url.path)
        return RequestFailure(status=503, code=exc.code, message=exc.message, exception=exc)
    if _database_unreachable(exc):
        logger.warning(
            "The database could not be reached for %s %s: %s", request.method, request.url.path, exc
        )
        exc = DatabaseUnavailableError()
    if isinstance(exc, BastionError):
        return RequestFailure(
            status=exc.status,
            code=exc.code,
            message=exc.message,
            headers=exc.headers,
            exception=exc,
            field=exc.field,
        )
    if isinstance(exc, HTTPException):
        code, message = _STATUS_ERRORS.get(exc.status_code, ("http_error", _phrase(exc.status_code)))
        # Starlette fills an absent detail with the status phrase; only a detail the application wrote counts.
        detail = exc.detail if exc.detail != _phrase(exc.status_code) else ""
        return RequestFailure(
            status=exc.status_code,
            code=code,
            message=detail or message,
            headers=exc.headers or {},
            exception=exc,
        )
    logger.error("Unhandled error in %s %s.", request.method, request.url.path, exc_info=exc)
    return _internal(exc)


def _database_unreachable(exc: BaseException) -> bool:
    """A database connection that failed, broke or could not be had from the pool (psycopg's
    `OperationalError`, a pool timeout among them), raised or chained as a cause.

    An error bastion already answers below 500 keeps its answer: a busy conversation is a
    `ConversationBusyError` chained from Postgres's `LockNotAvailable`, itself an `OperationalError`.
    """
    if isinstance(exc, BastionError) and exc.status < 500:
        return False
    psycopg = sys.modules.get("psycopg")  # only loaded when an application uses Postgres
    cause: BaseException | None = exc
    while psycopg is not None and cause is not None:
        if isinstance(cause, psycopg.OperationalError):
            return True
        cause = cause.__cause__
    return False


def status_error_code(status: int) -> str:
    """The code the worker gives an HTTP error of `status` that carries none of its own."""
    return _STATUS_ERRORS.get(status, ("http_error", ""))[0]


def _internal(exc: Exception | None) -> RequestFailure:
    return RequestFailure(status=500, code="internal", message=_INTERNAL_MESSAGE, exception=exc)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Request failed."
