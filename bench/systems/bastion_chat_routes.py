"""bastion as the README wires it: `chat_routes(...)` over `PostgresStore`, with its resumable stream log.

The same agent, scripted model, token verification, application role, row-level security and pool
as `bench.systems.bastion` (the turn wired by hand from the store API); the difference between the
two rows is what the one-call route adds: the request's validation, the conversation created by a
first message, the stop signal and the stream log every turn writes.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette

from bastion.auth import Principal, SupabaseEnv
from bastion.chat import ChatTurn, chat_routes
from bastion.stores import PostgresStore
from bastion.worker import Route, create_agent_worker
from bench.client import HttpRequest
from bench.protocol import CHAT_PATH
from bench.systems import ClientConfig, ServerConfig
from bench.systems import bastion as hand_wired
from bench.systems._pydantic_ai_model import scripted_model
from bench.systems.bastion import POOL_SIZE, bench_agent, prepare_database, verify_stream

__all__ = ["NEEDS_POSTGRES", "ROLE", "build_request", "create_app", "verify_stream"]

ROLE = "subject"
NEEDS_POSTGRES = True


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    """The hand-wired row's request, with the conversation's id written as `chat_routes` requires it."""
    return hand_wired.build_request(str(uuid.UUID(chat_id)), messages, client)


def _context(turn: ChatTurn) -> Principal:
    return turn.principal


def create_app(config: ServerConfig) -> Starlette:
    assert config.database_url is not None, "bastion needs a database"
    admin_url = config.database_url
    opened: list[PostgresStore] = []
    routes: list[Route] = []

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        app_url = await prepare_database(admin_url)
        opened.append(await PostgresStore.open(app_url, min_size=POOL_SIZE, max_size=POOL_SIZE))
        try:
            yield
        finally:
            await opened[0].close()

    class _Deferred:
        """The store opens in the lifespan; the route is built against it on first use."""

        def __init__(self) -> None:
            self.handler: Any = None

        async def __call__(self, request: Any, context: Any) -> Any:
            if self.handler is None:
                [route] = [
                    r
                    for r in chat_routes(
                        agent=bench_agent(),
                        store=opened[0],
                        model=scripted_model(),
                        context=_context,
                        path=CHAT_PATH,
                    )
                    if r.method == "POST" and r.path == CHAT_PATH
                ]
                self.handler = route.handler
            return await self.handler(request, context)

    routes.append(Route(method="POST", path=CHAT_PATH, auth="user", handler=_Deferred()))
    env = SupabaseEnv(url=config.supabase_url, jwks=config.jwks)
    return create_agent_worker(env=env, routes=routes, lifespan=lifespan)
