"""bastion as the README tells an application to serve it: `chat_routes(...)` over `PostgresStore`.

The same agent, tool, model, token verification and database role as the hand-wired `bastion` system,
but the route is the one-call `chat_routes`: its request validation, its claim (a conversation's first
message creates it), its stream log (the resumable stream that `GET …/stream` follows), its stop signal
and its settlement. With `durable` each turn also runs as a DBOS workflow (`durable=DurableEngine`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from bastion.auth import SupabaseEnv
from bastion.chat import chat_routes
from bastion.stores import PostgresStore
from bastion.worker import RequestContext, Route, create_agent_worker
from bench.protocol import CHAT_PATH
from bench.systems import ServerConfig
from bench.systems._pydantic_ai_model import scripted_model
from bench.systems.bastion import APP_ROLE, POOL_SIZE, bench_agent, prepare_database


class WithoutLiveTurns:
    """A store that offers no live turns: `chat_routes` over it keeps no stream log (and serves no stop
    or resume), which isolates what the log costs a turn."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def persistence(self, *, history_window: int = 100) -> Any:
        return self._store.persistence(history_window=history_window)

    async def create_conversation(self, *args: Any, **kwargs: Any) -> Any:
        return await self._store.create_conversation(*args, **kwargs)


def create_app(config: ServerConfig, *, durable: bool, log: bool = True) -> Starlette:
    """The worker serving `chat_routes` at the bench's path; the store (and engine) open in its lifespan.
    Without `log` the route runs over `WithoutLiveTurns`."""
    assert config.database_url is not None, "bastion needs a database"
    admin_url = config.database_url
    handlers: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app_url = await prepare_database(admin_url)
        engine = None
        if durable:
            from bastion.durable import DurableEngine, migrate_durable

            await migrate_durable(admin_url, app_role=APP_ROLE)
            engine = await DurableEngine.launch(app_url)
        store = await PostgresStore.open(app_url, min_size=POOL_SIZE, max_size=POOL_SIZE)
        routes = chat_routes(
            agent=bench_agent(),
            store=store if log else WithoutLiveTurns(store),
            model=scripted_model(),
            context=lambda turn: turn.principal,
            path=CHAT_PATH,
            durable=engine,
        )
        [chat] = [route for route in routes if route.method == "POST" and route.path == CHAT_PATH]
        handlers["chat"] = chat.handler
        try:
            yield
        finally:
            await store.close()
            if engine is not None:
                await engine.close()

    async def chat(request: Request, context: RequestContext) -> Response:
        response: Response = await handlers["chat"](request, context)
        return response

    env = SupabaseEnv(url=config.supabase_url, jwks=config.jwks)
    return create_agent_worker(
        env=env,
        routes=[Route(method="POST", path=CHAT_PATH, auth="user", handler=chat, keep_declared_path=True)],
        lifespan=lifespan,
    )
