"""The assistant's HTTP application: the chat stream, conversations, events, feedback and the web page.

Identity comes only from the verified token; a missing and a foreign conversation answer 404 alike;
every error is JSON with a stable code.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic_ai.models import Model
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from bastion import AgentTools, start_agent_run
from bastion.assistant.agent import AssistantContext, assistant_agent
from bastion.assistant.demo_model import demo_model
from bastion.assistant.dev_auth import DevelopmentSignIn, InvalidUserNameError
from bastion.assistant.notes import PostgresNoteBook
from bastion.assistant.openapi import openapi_document
from bastion.assistant.remote import UserCredentials
from bastion.auth import Principal, SupabaseEnv, TokenVerifier
from bastion.stores import (
    InvalidInputError,
    NotFoundError,
    PostgresStore,
    StoreIdentity,
    TurnContext,
    check_storable_message,
)
from bastion.stores.routes import InvalidRequestError, conversation_routes, json_body
from bastion.stream import StreamStatus, create_agent_stream_response
from bastion.worker import RequestContext, Route, create_agent_worker

__all__ = ["AssistantApp", "build_routes"]

logger = logging.getLogger("bastion.assistant")

TRIGGERS = frozenset({"submit-message", "regenerate-message"})
TITLE_LENGTH = 80
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css"}


@dataclass
class AssistantApp:
    """Everything the routes share: the store, the agent, the model, and how users sign in."""

    store: PostgresStore
    model: Model | None
    env: SupabaseEnv
    development_sign_in: DevelopmentSignIn | None = None
    history_window: int = 50
    remote_tools: Callable[[Principal], Callable[[], Awaitable[AgentTools]]] | None = None
    remote_tool_names: tuple[str, ...] = ()
    user_credentials: UserCredentials | None = None
    agent: Any = field(init=False)

    def __post_init__(self) -> None:
        self.agent = assistant_agent(remote_tool_names=self.remote_tool_names)
        self.persistence = self.store.persistence(history_window=self.history_window)
        self.demo = self.model is None
        self.active_model: Model = self.model or demo_model()

    def asgi(self, *, lifespan: Any = None) -> Any:
        verifier = TokenVerifier(self.env)
        middleware = []
        if self.development_sign_in is not None:
            # Development tokens are free for the asking, so only this machine's own names may ask: a web
            # page that rebinds its domain to 127.0.0.1 still sends its own Host and is refused.
            middleware.append(Middleware(LoopbackHostOnly))
        return create_agent_worker(
            env=self.env,
            routes=build_routes(self),
            verifier=verifier,
            lifespan=lifespan,
            middleware=middleware,
        )

    # Chat

    async def chat(self, request: Request, context: RequestContext) -> Response:
        """Run one turn of a conversation and answer with the AI SDK UI message stream."""
        principal = _principal(context)
        body = await json_body(request)
        conversation_id = _uuid(body.get("id"), "id")
        trigger = body.get("trigger", "submit-message")
        messages = body.get("messages")
        if trigger not in TRIGGERS:
            raise InvalidRequestError("trigger must be 'submit-message' or 'regenerate-message'.")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise InvalidRequestError("messages must be a non-empty list of UI messages.")
        identity = StoreIdentity.from_principal(principal)
        turn = TurnContext(identity=identity, conversation_id=conversation_id, request_id=str(uuid.uuid4()))
        if len(messages) == 1:
            await self._create_for_chat(identity, conversation_id, messages)
        run = await start_agent_run(
            persistence=self.persistence, context=turn, messages=messages, trigger=trigger
        )
        assistant_context = AssistantContext(
            principal=principal,
            conversation_id=conversation_id,
            notes=PostgresNoteBook(self.store, identity),
            remote_tools=self.remote_tools(principal) if self.remote_tools is not None else None,
        )
        session = None
        try:
            # A closed tab does not stop the run: the reply is finished and saved for the next visit.
            session = await self.agent.prepare(context=assistant_context, execute_tool=run.execute_tool)
            result = await session.stream(model=self.active_model, messages=run.messages)
        except BaseException:
            if session is not None:
                await session.close()
            await run.finish(status="failed")
            raise

        async def on_finish(*, response_message: dict[str, Any], status: StreamStatus) -> None:
            await run.finish(response_message=response_message, status=status)

        async def on_settled(*, status: StreamStatus) -> None:
            try:
                await run.finish(status=status)
            finally:
                await session.close()

        return create_agent_stream_response(
            result, original_messages=run.messages, on_finish=on_finish, on_settled=on_settled
        )

    async def _create_for_chat(
        self, identity: StoreIdentity, conversation_id: str, messages: list[Any]
    ) -> None:
        """A conversation's first message (the AI SDK client sends one message then) creates it for the
        caller. An id that is taken is left alone: the claim that follows finds the caller's own
        conversation, and answers 404 for anyone else's. A message that could not be stored is
        refused first, so it leaves no empty conversation behind."""
        check_storable_message(messages[0])
        with contextlib.suppress(InvalidInputError):
            await self.store.create_conversation(
                identity, conversation_id=conversation_id, title=_title_from(messages)
            )

    # The caller's own MCP credential (BASTION_MCP_AUTH=user only)

    async def connection_status(self, request: Request, context: RequestContext) -> Response:
        """Whether the caller has connected the MCP server; the credential itself is never returned."""
        credentials = self._user_credentials()
        return JSONResponse({"connected": await credentials.connected(_principal(context))})

    async def connect(self, request: Request, context: RequestContext) -> Response:
        """Store the caller's own bearer token for the MCP server, replacing any stored before."""
        credentials = self._user_credentials()
        body = await json_body(request)
        await credentials.connect(_principal(context), body.get("token"))
        return JSONResponse({"connected": True})

    async def disconnect(self, request: Request, context: RequestContext) -> Response:
        """Forget the caller's MCP credential; their next turn asks them to connect again."""
        credentials = self._user_credentials()
        await credentials.disconnect(_principal(context))
        return Response(status_code=204)

    def _user_credentials(self) -> UserCredentials:
        """The connection routes exist only while each user brings their own credential."""
        if self.user_credentials is None:
            raise NotFoundError()
        return self.user_credentials

    # Public routes

    async def health(self, request: Request, context: RequestContext) -> Response:
        """Whether the server is up."""
        return JSONResponse({"status": "ok"})

    async def info(self, request: Request, context: RequestContext) -> Response:
        """Which model runs and how users sign in."""
        return JSONResponse(
            {
                "demo_model": self.demo,
                "model": "demo" if self.demo else self.active_model.model_name,
                "development_sign_in": self.development_sign_in is not None,
            }
        )

    async def openapi(self, request: Request, context: RequestContext) -> Response:
        """This document."""
        return JSONResponse(openapi_document(build_routes(self)))

    async def jwks(self, request: Request, context: RequestContext) -> Response:
        """The development signing keys (development sign-in only)."""
        if self.development_sign_in is None:
            raise NotFoundError()
        return JSONResponse(self.development_sign_in.jwks)

    async def development_token(self, request: Request, context: RequestContext) -> Response:
        """Issue a development token for a user name (loopback only)."""
        if self.development_sign_in is None or not _from_loopback(request):
            raise NotFoundError()
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise InvalidRequestError("Send the user name as JSON (Content-Type: application/json).")
        body = await json_body(request)
        user = body.get("user")
        if not isinstance(user, str):
            raise InvalidRequestError(str(InvalidUserNameError()))
        try:
            token = self.development_sign_in.issue_token(user)
        except InvalidUserNameError as error:
            raise InvalidRequestError(str(error)) from None
        return JSONResponse(
            {
                "access_token": token,
                "token_type": "bearer",
                "expires_in": 3600,
                "user": {"id": DevelopmentSignIn.user_id(user), "email": f"{user.lower()}@localhost"},
            }
        )

    async def page(self, request: Request, context: RequestContext) -> Response:
        """The chat page."""
        return _static("index.html")

    async def static(self, request: Request, context: RequestContext) -> Response:
        """The chat page's assets."""
        return _static(str(context.params.get("name", "")))


class LoopbackHostOnly:
    """Refuses requests whose Host is not a loopback name, with the JSON error every route uses."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and _host_name(Request(scope).headers.get("host", "")) not in LOOPBACK_HOSTS
        ):
            response = JSONResponse(
                {
                    "code": "invalid_host",
                    "message": "Development sign-in only answers requests sent to 127.0.0.1 or localhost.",
                },
                status_code=400,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _host_name(host: str) -> str:
    """The name part of a Host header (`[::1]:8000` → `[::1]`, `localhost:8000` → `localhost`)."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def build_routes(app: AssistantApp) -> list[Route]:
    """Every route of the assistant, each declaring its authentication."""
    return [
        Route(method="POST", path="/api/chat", auth="user", handler=app.chat),
        *conversation_routes(app.store),
        Route(method="GET", path="/api/connections/mcp", auth="user", handler=app.connection_status),
        Route(method="PUT", path="/api/connections/mcp", auth="user", handler=app.connect),
        Route(method="DELETE", path="/api/connections/mcp", auth="user", handler=app.disconnect),
        Route(method="GET", path="/health", auth="none", handler=app.health),
        Route(method="GET", path="/api/info", auth="none", handler=app.info),
        Route(method="GET", path="/openapi.json", auth="none", handler=app.openapi),
        Route(method="GET", path="/auth/v1/.well-known/jwks.json", auth="none", handler=app.jwks),
        Route(method="POST", path="/auth/dev/token", auth="none", handler=app.development_token),
        Route(method="GET", path="/", auth="none", handler=app.page),
        Route(method="GET", path="/static/{name}", auth="none", handler=app.static),
    ]


def _principal(context: RequestContext) -> Principal:
    if context.principal is None:
        raise RuntimeError("A user route ran without a verified principal.")
    return context.principal


def _uuid(value: object, name: str) -> str:
    try:
        return str(uuid.UUID(str(value))) if isinstance(value, str) else _invalid(name)
    except ValueError:
        return _invalid(name)


def _invalid(name: str) -> str:
    raise InvalidRequestError(f"{name} must be a conversation id (a UUID).")


def _title_from(messages: list[Any]) -> str | None:
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            for part in message.get("parts") or []:
                if (
                    isinstance(part, Mapping)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    text = " ".join(part["text"].split())
                    return text[:TITLE_LENGTH] or None
    return None


def _from_loopback(request: Request) -> bool:
    host = request.client.host if request.client is not None else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _static(name: str) -> Response:
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        raise NotFoundError()
    asset = resources.files("bastion.assistant").joinpath("static", name)
    if not asset.is_file():
        raise NotFoundError()
    return Response(
        asset.read_bytes(),
        media_type=STATIC_TYPES[suffix],
        headers={
            "cache-control": "no-cache",
            "x-content-type-options": "nosniff",
            "x-frame-options": "DENY",
            "content-security-policy": "frame-ancestors 'none'",
        },
    )
