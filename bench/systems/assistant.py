"""The reference assistant as `bastion serve` runs it, on the bench's script: its defaults all on.

`bastion.assistant.server.running_assistant` composed here the same way, against the run's database
and the bench's signing keys: every migration of the assistant (`bastion.assistant.database.migrate`),
`PostgresStore` with its default pool, one `DurableEngine` for the process, the event hooks delivered
from this process (`persist_sessions` and the usage counter, `HookDelivery`), memory with the default
embedder (the offline model when the `memory-offline` extra is installed, else lexical hashing), the
support inbox's bot replies and the retention schedule started (the serve defaults' ages), and durable
chat turns. The model is the bench's script; since the assistant's agent has no `lookup`, the scripted
call is `get_identity` (an idempotent read), so the client checks that result instead. Everything else
of a turn is the assistant's own route (`POST /api/chat`: memory recall before the model, usage in the
`finish` chunk, the stream log).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Receive, Scope, Send

from bench.client import HttpRequest, HttpResponse
from bench.protocol import ExpectedTool, VerifiedTurn, chat_request
from bench.systems import ClientConfig, ServerConfig
from bench.systems import bastion as hand_wired
from bench.tokens import SUBJECT

ROLE = "subject"
NEEDS_POSTGRES = True
PATH = "/api/chat"
IDENTITY = ExpectedTool(
    name="get_identity",
    input={},
    output_ok=lambda output: isinstance(output, dict) and output.get("user_id") == SUBJECT,
)


@contextlib.asynccontextmanager
async def running(config: ServerConfig) -> AsyncIterator[Any]:
    """The assistant's ASGI application, its database migrated and everything it runs started."""
    from bastion.assistant.app import AssistantApp
    from bastion.assistant.config import AssistantConfig
    from bastion.assistant.database import Database, migrate
    from bastion.assistant.hooks import assistant_hooks
    from bastion.auth import SupabaseEnv
    from bastion.durable import DurableEngine
    from bastion.hooks import HookDelivery
    from bastion.retention import Retention, RetentionPolicy
    from bastion.stores import PostgresStore
    from bench.systems._pydantic_ai_model import scripted_model

    assert config.database_url is not None, "the assistant needs a database"
    app_url = await hand_wired.prepare_database(config.database_url)
    database = Database(app_conninfo=app_url, admin_conninfo=config.database_url)
    await migrate(database)
    store = await PostgresStore.open(app_url, admin_conninfo=config.database_url)
    try:
        async with await DurableEngine.launch(app_url) as engine:
            delivery = await HookDelivery.start(
                engine, store.pool, assistant_hooks(store), listen_conninfo=app_url
            )
            try:
                app = AssistantApp(
                    store=store,
                    model=scripted_model(tool_name=IDENTITY.name, tool_args=IDENTITY.input),
                    env=SupabaseEnv(url=config.supabase_url, jwks=config.jwks),
                    durable=engine,
                )
                await app.memory_store.purge()
                await app.inbox_replies.start(engine)
                defaults = AssistantConfig()
                retention = Retention(
                    store,
                    conninfo=app_url,
                    policy=RetentionPolicy(
                        finished_turns=defaults.retain_turns,
                        inbox_jobs=defaults.retain_inbox_jobs,
                        delivered_events=defaults.retain_events,
                    ),
                    memory=app.memory_store,
                )
                await retention.start(engine)
                try:
                    yield app.asgi()
                finally:
                    retention.stop()
                    app.inbox_replies.stop()
            finally:
                await delivery.close()
    finally:
        await store.close()


class _Assistant:
    """An ASGI application that starts the assistant in its lifespan, then hands it every request."""

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self._app: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self._app(scope, receive, send)
            return
        await receive()
        async with running(self._config) as app:
            self._app = app
            await send({"type": "lifespan.startup.complete"})
            await receive()
        await send({"type": "lifespan.shutdown.complete"})


def create_app(config: ServerConfig) -> Any:
    return _Assistant(config)


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    headers = {"authorization": f"Bearer {client.bearer_token}"}
    return chat_request(chat_id, messages, headers=headers, path=PATH)


def verify_stream(response: HttpResponse, *, words: int) -> VerifiedTurn:
    return hand_wired.verify_stream(response, words=words, tool=IDENTITY)
