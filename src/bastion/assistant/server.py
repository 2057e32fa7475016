"""Running the assistant: the database, migrations, sign-in, the model, and uvicorn on one address."""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from bastion.assistant.app import AssistantApp
from bastion.assistant.config import AssistantConfig, ConfigError, resolve_embedder, resolve_model
from bastion.assistant.database import Database, DatabaseError, migrate, open_database
from bastion.assistant.demo_model import DEMO_NOTICE
from bastion.assistant.dev_auth import DevelopmentSignIn
from bastion.assistant.hooks import assistant_hooks
from bastion.assistant.remote import (
    CREDENTIALS_KEY_FILE,
    UserCredentials,
    credentials_keyring,
    remote_tool_names,
    remote_tools,
    sign_in_tool_names,
    user_oauth,
)
from bastion.assistant.support import inbox_settings
from bastion.auth import SupabaseEnv
from bastion.draining_server import DrainingServer, leave_running_turns
from bastion.durable import DurableEngine
from bastion.hooks import HookDelivery
from bastion.retention import Retention, RetentionPolicy
from bastion.stores import PostgresStore

__all__ = ["RunningAssistant", "development_sign_in", "running_assistant", "serve", "supabase_env"]

logger = logging.getLogger("bastion.assistant")

# The issuer of development tokens: a fixed name, not where the server listens (see development_sign_in).
DEVELOPMENT_ISSUER_URL = "http://localhost"

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    logger.info(message)


@dataclass
class RunningAssistant:
    app: AssistantApp
    database: Database
    asgi: Any


def development_sign_in(config: AssistantConfig) -> DevelopmentSignIn:
    """Local sign-in with the data directory's key.

    Its issuer names development sign-in rather than an address, so a token from `bastion token`
    works with a server on any loopback host and port that uses the same data directory.
    """
    return DevelopmentSignIn(data_dir=config.data_dir, issuer=f"{DEVELOPMENT_ISSUER_URL}/auth/v1")


def supabase_env(config: AssistantConfig) -> tuple[SupabaseEnv, DevelopmentSignIn | None]:
    """Supabase's keys when configured; otherwise development sign-in, which needs a loopback host."""
    if config.supabase_url is not None:
        env = SupabaseEnv(
            url=config.supabase_url,
            publishable_keys={"default": config.supabase_publishable_key}
            if config.supabase_publishable_key
            else {},
            secret_keys={"default": config.supabase_secret_key} if config.supabase_secret_key else {},
            jwt_secret=config.supabase_jwt_secret,
        )
        return env, None
    if not config.loopback:
        raise ConfigError(
            f"Development sign-in only runs on this machine, but the host is {config.host!r}. "
            "Set SUPABASE_URL to use Supabase sign-in, or serve on 127.0.0.1."
        )
    sign_in = development_sign_in(config)
    return SupabaseEnv(url=DEVELOPMENT_ISSUER_URL, jwks=sign_in.jwks), sign_in


@contextlib.asynccontextmanager
async def running_assistant(
    config: AssistantConfig, *, progress: Progress = _quiet
) -> AsyncIterator[RunningAssistant]:
    """The assistant with its database ready and migrated; everything is closed on exit."""
    model = resolve_model(config)
    env, sign_in = supabase_env(config)
    keys = None
    if config.mcp_auth in ("user", "oauth"):
        keys, generated = credentials_keyring(config)
        if generated:
            progress(
                f"Generated a key for users' MCP credentials in {config.data_dir / CREDENTIALS_KEY_FILE} "
                "(development only: set BASTION_CREDENTIALS_KEY in production)."
            )
    started = time.monotonic()
    progress(
        "Connecting to DATABASE_URL…"
        if config.database_url
        else f"Starting the embedded database in {config.data_dir / 'postgres'}…"
    )
    database = await open_database(
        database_url=config.database_url, app_database_url=config.app_database_url, data_dir=config.data_dir
    )
    try:
        applied = await migrate(database)
        progress(
            f"Database ready in {time.monotonic() - started:.1f} s"
            + (f" (applied {', '.join(applied)})." if applied else ".")
        )
        store = await PostgresStore.open(
            database.app_conninfo,
            admin_conninfo=database.admin_conninfo,
            follower_limits=config.follower_limits(),
        )
        user_credentials = None
        try:
            # One DBOS per process: the inbox's bot replies and the event hooks (unless BASTION_HOOKS=off)
            # run on it, and so do the chat turns (unless BASTION_DURABLE=off), which another worker on
            # the database then takes over.
            async with (
                await DurableEngine.launch(database.app_conninfo) as engine,
                _delivering(engine, store, database, hooks=config.hooks) as delivery,
            ):
                oauth = None
                if keys is not None and config.mcp_auth == "oauth":
                    oauth = user_oauth(config, pool=store.pool, keys=keys)
                elif keys is not None:
                    user_credentials = UserCredentials(pool=store.pool, keys=keys)
                app = AssistantApp(
                    store=store,
                    model=model,
                    env=env,
                    development_sign_in=sign_in,
                    history_window=config.history_window,
                    remote_tools=remote_tools(config, user_credentials=user_credentials, oauth=oauth),
                    remote_tool_names=remote_tool_names(config),
                    sign_in_tool_names=sign_in_tool_names(config),
                    oauth=oauth,
                    user_credentials=user_credentials,
                    embedder=resolve_embedder(config),
                    **inbox_settings(config),
                    durable=engine if config.durable else None,
                )
                # Once stopping, this process takes no queued job and starts no hook batch (durable
                # turns or not): the other workers run them.
                app.drain.on_start(engine.stop_taking_work)
                if delivery is not None:
                    app.drain.on_start(delivery.stop_dispatching)
                # The inbox's jobs first: DBOS may already be handing this process recovered ones.
                await app.inbox_replies.start(engine)
                purged = await app.memory_store.purge()
                if purged:
                    progress(f"Purged {purged} expired memory operation records.")
                retention = Retention(
                    store,
                    conninfo=database.app_conninfo,
                    policy=RetentionPolicy(
                        finished_turns=config.retain_turns,
                        inbox_jobs=config.retain_inbox_jobs,
                        delivered_events=config.retain_events,
                    ),
                    memory=app.memory_store,
                )
                await retention.start(engine)
                try:
                    yield RunningAssistant(app=app, database=database, asgi=app.asgi())
                finally:
                    retention.stop()
                    app.inbox_replies.stop()
        finally:
            await store.close()
    finally:
        database.close()


@contextlib.asynccontextmanager
async def _delivering(
    engine: DurableEngine, store: PostgresStore, database: Database, *, hooks: bool
) -> AsyncIterator[HookDelivery | None]:
    """The assistant's hooks (chat tables, usage) delivered from this process while it serves (with
    `hooks`; else nothing)."""
    if not hooks:
        yield None
        return
    delivery = await HookDelivery.start(
        engine, store.pool, assistant_hooks(store), listen_conninfo=database.app_conninfo
    )
    try:
        yield delivery
    finally:
        await delivery.close()


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"Port {port} on {host} is in use. Stop the other server or choose another port: "
                    f"bastion serve --port {port + 1}"
                ) from None
            raise ConfigError(f"Cannot listen on {host}:{port}: {error.strerror}.") from None


async def serve(config: AssistantConfig, *, progress: Progress) -> None:
    """Run the assistant until interrupted. SIGTERM drains first: no new turn, the running ones get
    `config.drain_seconds` to finish, and those left then are taken over by another worker."""
    _check_port_free(config.host, config.port)
    async with running_assistant(config, progress=progress) as running:
        if running.app.demo:
            logger.warning(DEMO_NOTICE)
        if running.app.development_sign_in is not None:
            progress("Development sign-in is on: pick any user name on the page (this machine only).")
        progress(f"bastion assistant at {config.base_url}/  (Ctrl+C to stop)")

        def abandon(left: int) -> None:
            progress(f"{left} turn(s) still running after {config.drain_seconds:g} s: left to other workers.")
            # The process is leaving as if it died: what its threads (DBOS's) would log about the
            # embedded database going away is noise. That database stops with the server, as always.
            logging.disable(logging.CRITICAL)
            running.database.close()
            leave_running_turns(left)

        server = DrainingServer(
            uvicorn.Config(
                running.asgi, host=config.host, port=config.port, log_level="warning", lifespan="off"
            ),
            drain=running.app.drain,
            seconds=config.drain_seconds,
            abandon=abandon,
        )
        await server.serve()


def fail(error: Exception) -> int:
    """Print a startup error the way a user needs it: what went wrong and what to try."""
    print(f"bastion: {error}", file=sys.stderr)
    return 2


STARTUP_ERRORS = (ConfigError, DatabaseError)
