"""The assistant's HTTP application: the chat stream, conversations, events, feedback and the web page.

Identity comes only from the verified token; a missing and a foreign conversation answer 404 alike;
every error is JSON with a stable code.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pydantic_ai.models import Model
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from bastion import AgentTools, __version__
from bastion.api import (
    InvalidRequestError,
    PlainBody,
    json_response,
    openapi_document,
    operation,
)
from bastion.assistant.agent import AssistantContext, assistant_agent
from bastion.assistant.demo_model import demo_model
from bastion.assistant.dev_auth import DevelopmentSignIn, InvalidSessionError, InvalidUserNameError
from bastion.assistant.notes import PostgresNoteBook
from bastion.assistant.pages import error_response, page_policy
from bastion.assistant.remote import UserCredentials
from bastion.assistant.schemas import (
    AuthConfig,
    ConnectionStatus,
    ConnectionToken,
    DevelopmentAuthSettings,
    DevelopmentAuthUser,
    DevelopmentGrant,
    DevelopmentGrantQuery,
    DevelopmentSession,
    DevelopmentToken,
    DevelopmentTokenRequest,
    DevelopmentUser,
    Health,
    Info,
)
from bastion.assistant.support import INBOX_TENANT, inbox_staff, support_agent
from bastion.auth import Principal, SupabaseEnv, TokenVerifier
from bastion.chat.conversations import conversation_routes
from bastion.chat.endpoint import ChatEndpoint
from bastion.chat.turn import ChatTurn
from bastion.drain import Drain
from bastion.durable import DurableEngine
from bastion.inbox import ContactTokens, InboxChannels, InboxReplies, PostgresInbox, inbox_routes
from bastion.mcp.oauth import McpOAuth
from bastion.mcp.oauth_routes import oauth_connection_routes
from bastion.memory import (
    AgentMemory,
    Embedder,
    HashingEmbedder,
    OfflineEmbedder,
    PostgresMemoryStore,
    define_memory,
    memory_routes,
    offline_embedder_available,
)
from bastion.memory.offline import NEAR_DUPLICATE_THRESHOLD
from bastion.stores import NotFoundError, PostgresStore
from bastion.versioning import ApiVersioning
from bastion.worker import RequestContext, Route, create_agent_worker

__all__ = ["AssistantApp", "build_routes"]

logger = logging.getLogger("bastion.assistant")

MEMORY_SCOPE = "assistant"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}
DEVELOPMENT_EMAIL_DOMAIN = "@localhost"


@dataclass
class AssistantApp:
    """Everything the routes share: the store, the agent, the model, and how users sign in."""

    store: PostgresStore
    model: Model | None
    env: SupabaseEnv
    development_sign_in: DevelopmentSignIn | None = None
    history_window: int = 50
    remote_tools: Callable[[Principal, str], Callable[[], Awaitable[AgentTools]]] | None = None
    remote_tool_names: tuple[str, ...] = ()
    sign_in_tool_names: tuple[str, ...] = ()
    oauth: McpOAuth | None = None
    user_credentials: UserCredentials | None = None
    embedder: Embedder | None = None
    versioning: ApiVersioning = field(default_factory=ApiVersioning)
    inbox_token_secret: bytes = field(default_factory=lambda: os.urandom(32), repr=False)
    inbox_channels: InboxChannels = field(default_factory=InboxChannels)
    durable: DurableEngine | None = None
    drain: Drain = field(default_factory=Drain)
    agent: Any = field(init=False)

    def __post_init__(self) -> None:
        self.memory_store = _memory_store(self.store, self.embedder)
        self.memory: AgentMemory[AssistantContext] = define_memory(
            store=self.memory_store,
            identity=lambda context: context.identity,
            operation_id=lambda context: context.operation_id,
            scope=MEMORY_SCOPE,
        )
        self.agent = assistant_agent(
            remote_tool_names=self.remote_tool_names,
            sign_in_tool_names=self.sign_in_tool_names,
            memory=self.memory,
        )
        self.demo = self.model is None
        self._active_model: Model = self.model or demo_model()
        self.chat = ChatEndpoint(
            agent=self.agent,
            store=self.store,
            model=self._active_model,
            context=self._context,
            history_window=self.history_window,
            usage_metadata=True,
            durable=self.durable,
            durable_name="assistant",
            drain=self.drain,
        )
        self.persistence = self.chat.persistence
        # The support inbox: its bot's replies run as durable jobs once `inbox_replies.start(engine)`.
        self.inbox = PostgresInbox(self.store)
        self.inbox_replies = InboxReplies(self.inbox, agent=support_agent(), model=self._active_model)
        self.contact_tokens = ContactTokens(self.inbox_token_secret)

    @property
    def active_model(self) -> Model:
        """The model every turn runs: the configured one, else the demo model."""
        return self._active_model

    @active_model.setter
    def active_model(self, model: Model) -> None:
        self._active_model = model
        self.chat.model = model
        self.inbox_replies.model = model

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
            versioning=self.versioning,
            on_error=error_response,
        )

    # Chat

    def _context(self, turn: ChatTurn) -> AssistantContext:
        """The assistant's trusted context for one turn: the caller, their notes, their MCP tools and
        their memories, whose writes are keyed by the turn's run."""
        return AssistantContext(
            principal=turn.principal,
            conversation_id=turn.conversation_id,
            notes=PostgresNoteBook(self.store, turn.identity),
            remote_tools=self.remote_tools(turn.principal, turn.conversation_id)
            if self.remote_tools is not None
            else None,
            identity=turn.identity,
            operation_id=turn.run_id,
        )

    # The caller's own MCP credential (BASTION_MCP_AUTH=user only)

    @operation(responses={200: ConnectionStatus}, errors=(404,))
    async def connection_status(self, request: Request, context: RequestContext) -> Response:
        """Whether the caller has connected the MCP server; the credential itself is never returned."""
        credentials = self._user_credentials()
        return json_response(
            ConnectionStatus(connected=await credentials.connected(context.require_principal()))
        )

    @operation(body=ConnectionToken, responses={200: ConnectionStatus}, errors=(404,))
    async def connect(self, request: Request, context: RequestContext, *, body: ConnectionToken) -> Response:
        """Store the caller's own bearer token for the MCP server, replacing any stored before."""
        credentials = self._user_credentials()
        await credentials.connect(context.require_principal(), body.token)
        return json_response(ConnectionStatus(connected=True))

    @operation(responses={204: None}, errors=(404,))
    async def disconnect(self, request: Request, context: RequestContext) -> Response:
        """Forget the caller's MCP credential; their next turn asks them to connect again."""
        credentials = self._user_credentials()
        await credentials.disconnect(context.require_principal())
        return Response(status_code=204)

    def _user_credentials(self) -> UserCredentials:
        """The connection routes exist only while each user brings their own credential."""
        if self.user_credentials is None:
            raise NotFoundError()
        return self.user_credentials

    # Public routes

    @operation(responses={200: Health})
    async def health(self, request: Request, context: RequestContext) -> Response:
        """Whether the server is up (liveness: still 200 while it stops; `GET /ready` is readiness)."""
        return json_response(Health(status="ok"))

    @operation(responses={200: Info})
    async def info(self, request: Request, context: RequestContext) -> Response:
        """Which model runs and how users sign in: the page's Supabase Auth client is made from `auth`
        (in development, the Auth API below on this same server, so `url` is null)."""
        if self.development_sign_in is not None:
            auth = AuthConfig(mode="development", url=None, publishable_key=None)
        else:
            keys = list(self.env.publishable_keys.values())
            auth = AuthConfig(mode="supabase", url=self.env.url, publishable_key=keys[0] if keys else None)
        return json_response(
            Info(
                demo_model=self.demo,
                model="demo" if self.demo else self.active_model.model_name,
                development_sign_in=self.development_sign_in is not None,
                auth=auth,
            )
        )

    @operation(responses={200: PlainBody("The OpenAPI 3.1 document", ("application/json",))})
    async def openapi(self, request: Request, context: RequestContext) -> Response:
        """This document."""
        return JSONResponse(
            openapi_document(
                build_routes(self),
                title="bastion assistant",
                version=__version__,
                versioning=self.versioning,
            )
        )

    @operation(responses={200: PlainBody("A JSON Web Key Set", ("application/json",))}, errors=(404,))
    async def jwks(self, request: Request, context: RequestContext) -> Response:
        """The development signing keys (development sign-in only)."""
        if self.development_sign_in is None:
            raise NotFoundError()
        return JSONResponse(self.development_sign_in.jwks)

    def development_sign_in_reachable(self, request: Request, context: RequestContext) -> None:
        """Development tokens exist only with development sign-in and only for this machine: 404 before
        the body is read otherwise, as for any address that is not there."""
        if self.development_sign_in is None or not _from_loopback(request):
            raise NotFoundError()

    @operation(body=DevelopmentTokenRequest, responses={200: DevelopmentToken}, errors=(404,))
    async def development_token(
        self, request: Request, context: RequestContext, *, body: DevelopmentTokenRequest
    ) -> Response:
        """Issue a development token for a user name (loopback only)."""
        if self.development_sign_in is None:
            raise NotFoundError()
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise InvalidRequestError("Send the user name as JSON (Content-Type: application/json).")
        try:
            token = self.development_sign_in.issue_token(body.user)
        except InvalidUserNameError as error:
            raise InvalidRequestError(str(error), field="user") from None
        user = DevelopmentUser(
            id=DevelopmentSignIn.user_id(body.user), email=f"{body.user.lower()}@localhost"
        )
        return json_response(
            DevelopmentToken(access_token=token, token_type="bearer", expires_in=3600, user=user)
        )

    # The part of the Supabase Auth API that supabase-js uses, for development sign-in (loopback only)

    @operation(
        body=DevelopmentGrant,
        query=DevelopmentGrantQuery,
        responses={200: DevelopmentSession},
        errors=(404,),
    )
    async def auth_token(
        self,
        request: Request,
        context: RequestContext,
        *,
        body: DevelopmentGrant,
        query: DevelopmentGrantQuery,
    ) -> Response:
        """Sign in (`grant_type=password`: the email's local part is the user name, any password) or
        refresh a session (`grant_type=refresh_token`), answering a Supabase Auth session."""
        sign_in = self._development_auth()
        if query.grant_type == "refresh_token":
            try:
                return json_response(DevelopmentSession.model_validate(sign_in.refresh(body.refresh_token)))
            except (InvalidSessionError, InvalidUserNameError):
                raise InvalidRequestError(str(InvalidSessionError()), field="refresh_token") from None
        email = body.email or ""
        if not email.lower().endswith(DEVELOPMENT_EMAIL_DOMAIN):
            raise InvalidRequestError(f"Sign in as name{DEVELOPMENT_EMAIL_DOMAIN}.", field="email")
        try:
            session = sign_in.session(email[: -len(DEVELOPMENT_EMAIL_DOMAIN)])
        except InvalidUserNameError as error:
            raise InvalidRequestError(str(error), field="email") from None
        return json_response(DevelopmentSession.model_validate(session))

    @operation(responses={200: DevelopmentAuthUser}, errors=(401, 404))
    async def auth_user(self, request: Request, context: RequestContext) -> Response:
        """The signed-in development user, from the bearer token."""
        sign_in = self._development_auth()
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        try:
            if scheme.lower() != "bearer":
                raise InvalidSessionError()
            user = sign_in.user(sign_in.user_name(token.strip()))
        except (InvalidSessionError, InvalidUserNameError):
            return JSONResponse(
                {"code": "invalid_session", "message": str(InvalidSessionError())}, status_code=401
            )
        return json_response(DevelopmentAuthUser.model_validate(user))

    @operation(responses={204: None}, errors=(404,))
    async def auth_logout(self, request: Request, context: RequestContext) -> Response:
        """Sign out. Development tokens are not revoked: they end with their lifetime."""
        self._development_auth()
        return Response(status_code=204)

    @operation(responses={200: DevelopmentAuthSettings}, errors=(404,))
    async def auth_settings(self, request: Request, context: RequestContext) -> Response:
        """Which sign-in methods there are: email only (no magic link, no anonymous sign-in)."""
        self._development_auth()
        return json_response(
            DevelopmentAuthSettings(external={"email": True, "anonymous_users": False}, disable_signup=False)
        )

    def _development_auth(self) -> DevelopmentSignIn:
        """The development sign-in; its routes are refused first by `development_sign_in_reachable`."""
        if self.development_sign_in is None:
            raise NotFoundError()
        return self.development_sign_in

    @operation(responses={200: PlainBody("The chat page", ("text/html",))})
    async def page(self, request: Request, context: RequestContext) -> Response:
        """The chat page. Its policy lets it load only its own files and talk only to this server and
        the Supabase project, so an injected script or a link to elsewhere has nowhere to go."""
        auth_origin = "" if self.development_sign_in is not None else f" {self.env.url}"
        return _static("index.html", policy=page_policy(connect=auth_origin))

    @operation(responses={200: PlainBody("The support widget's demo page", ("text/html",))})
    async def widget_page(self, request: Request, context: RequestContext) -> Response:
        """A demo page where a visitor talks to the support inbox as a contact."""
        return _static("widget.html", policy=page_policy())

    @operation(responses={200: PlainBody("The API reference page", ("text/html",))})
    async def docs_page(self, request: Request, context: RequestContext) -> Response:
        """The API reference: this server's OpenAPI document in Swagger UI, served from the package."""
        return _static("docs.html", policy=page_policy())

    @operation(
        responses={200: PlainBody("A script, style sheet, icon or page", tuple(STATIC_TYPES.values()))},
        errors=(404,),
    )
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
        *app.chat.routes(),
        *conversation_routes(app.store),
        *memory_routes(app.memory_store, scope=MEMORY_SCOPE),
        Route(method="GET", path="/api/connections/mcp", auth="user", handler=app.connection_status),
        Route(method="PUT", path="/api/connections/mcp", auth="user", handler=app.connect),
        Route(method="DELETE", path="/api/connections/mcp", auth="user", handler=app.disconnect),
        *(oauth_connection_routes(app.oauth) if app.oauth is not None else ()),
        Route(method="GET", path="/health", auth="none", handler=app.health),
        app.drain.ready_route(),
        Route(method="GET", path="/api/info", auth="none", handler=app.info),
        Route(method="GET", path="/api/openapi.json", auth="none", handler=app.openapi),
        Route(method="GET", path="/openapi.json", auth="none", handler=app.openapi),
        Route(method="GET", path="/auth/v1/.well-known/jwks.json", auth="none", handler=app.jwks),
        # Development sign-in, including the part of the Supabase Auth API that supabase-js uses.
        *(
            Route(
                method=method,
                path=path,
                auth="none",
                handler=handler,
                authorize=app.development_sign_in_reachable,
            )
            for method, path, handler in (
                ("POST", "/auth/dev/token", app.development_token),
                ("POST", "/auth/v1/token", app.auth_token),
                ("GET", "/auth/v1/user", app.auth_user),
                ("POST", "/auth/v1/logout", app.auth_logout),
                ("GET", "/auth/v1/settings", app.auth_settings),
            )
        ),
        *inbox_routes(
            app.inbox,
            channels=app.inbox_channels,
            tokens=app.contact_tokens,
            widget_tenant=INBOX_TENANT if app.development_sign_in is not None else None,
            staff=inbox_staff,
        ),
        Route(method="GET", path="/", auth="none", handler=app.page),
        Route(method="GET", path="/widget", auth="none", handler=app.widget_page),
        # Where a user's sign-in at the MCP server comes back: the page finishes it with their session.
        Route(method="GET", path="/connections/{name}/callback", auth="none", handler=app.page),
        Route(method="GET", path="/docs", auth="none", handler=app.docs_page),
        Route(method="GET", path="/static/{name}", auth="none", handler=app.static),
    ]


def _memory_store(store: PostgresStore, embedder: Embedder | None) -> PostgresMemoryStore:
    """The configured embedder; else the offline model (the `memory-offline` extra); else lexical hashing."""
    if embedder is not None:
        return PostgresMemoryStore(store, embedder=embedder)
    if offline_embedder_available():
        return PostgresMemoryStore(
            store, embedder=OfflineEmbedder(), near_duplicate_threshold=NEAR_DUPLICATE_THRESHOLD
        )
    logger.info("Memory recalls by shared words: install bastion[memory-offline] to recall by meaning.")
    return PostgresMemoryStore(store, embedder=HashingEmbedder())


def _from_loopback(request: Request) -> bool:
    host = request.client.host if request.client is not None else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _static(name: str, *, policy: str = "frame-ancestors 'none'") -> Response:
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
            "content-security-policy": policy,
        },
    )
