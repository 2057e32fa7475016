"""Versioned SQL migrations: `migrations/NNNN_name.sql`, applied in order and recorded once each.

Every migrator takes the same transaction-scoped advisory lock first, so concurrent processes
starting at once apply each migration exactly once; the others wait, then find nothing to do. A
recorded migration whose file changed afterwards is refused rather than silently skipped.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, ClassVar, Final

from bastion._extras import missing_extra

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "Migration",
    "MigrationChangedError",
    "apply_application_migrations",
    "apply_migrations",
    "available_migrations",
]

_FILE_NAME: Final = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
_COMPONENT: Final = re.compile(r"[a-z][a-z0-9_]{0,40}")
# A fixed advisory lock key: the first eight bytes of sha256("bastion.migrations").
_LOCK_KEY: Final = int.from_bytes(hashlib.sha256(b"bastion.migrations").digest()[:8], "big", signed=True)

_BOOTSTRAP: Final = """
create schema if not exists bastion;
create table if not exists bastion.bastion_migrations (
  version integer primary key,
  name text not null,
  checksum text not null,
  applied_at timestamptz not null default now()
);
revoke all on bastion.bastion_migrations from public;
create table if not exists bastion.component_migrations (
  component text not null,
  version integer not null,
  name text not null,
  checksum text not null,
  applied_at timestamptz not null default now(),
  primary key (component, version)
);
revoke all on bastion.component_migrations from public;
"""


class MigrationChangedError(Exception):
    """A migration already applied to this database differs from the file shipped now."""

    code: ClassVar[str] = "migration_changed"

    def __init__(self, version: int) -> None:
        self.version = version
        super().__init__(f"Migration {version:04d} was changed after it was applied.")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: its version (the number in its name), name, SQL text and checksum."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available_migrations(package: str = "bastion.stores", directory: str = "migrations") -> list[Migration]:
    """The migrations shipped in `package`/`directory` (bastion's own by default), in version order."""
    found: list[Migration] = []
    for entry in resources.files(package).joinpath(directory).iterdir():
        match = _FILE_NAME.fullmatch(entry.name)
        if match is not None:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda migration: migration.version)
    return found


async def apply_migrations(conninfo: str, *, upto: int | None = None) -> list[int]:
    """Apply every pending migration (up to version `upto`) in one transaction; return their versions.

    Connect as a role that may create schemas, roles and functions (the database owner, or
    `postgres` on Supabase), never as the application's role.
    """
    migrations = [m for m in available_migrations() if upto is None or m.version <= upto]
    async with await _connect(conninfo) as conn, conn.transaction():
        await conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        await conn.execute(_BOOTSTRAP)
        return await _apply(conn, migrations, component=None)


async def apply_application_migrations(
    conninfo: str, *, component: str, migrations: list[Migration]
) -> list[int]:
    """Apply an application's own migrations after bastion's, recorded under `component`.

    An application keeps its tables (and their row-level security) in its own versioned files, so
    `bastion migrate` brings framework and application to the same state in one command.
    """
    check_component(component)
    async with await _connect(conninfo) as conn, conn.transaction():
        await conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        await conn.execute(_BOOTSTRAP)
        return await _apply(conn, migrations, component=component)


def check_component(component: str) -> None:
    """An application's migration component: a short lower-case name other than bastion's own."""
    if not _COMPONENT.fullmatch(component) or component == "bastion":
        raise ValueError("A migration component is a short lower-case name other than 'bastion'.")


async def _connect(conninfo: str) -> psycopg.AsyncConnection[Any]:
    """An autocommit connection; applying migrations is the one part of this module that needs psycopg."""
    try:
        import psycopg
    except ImportError as error:
        raise missing_extra("Applying migrations to Postgres", "postgres", error) from error
    return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)


async def _apply(
    conn: psycopg.AsyncConnection[Any], migrations: list[Migration], *, component: str | None
) -> list[int]:
    """Apply what is not yet recorded, refusing a recorded migration whose file changed."""
    if component is None:
        cursor = await conn.execute("select version, checksum from bastion.bastion_migrations")
    else:
        cursor = await conn.execute(
            "select version, checksum from bastion.component_migrations where component = %s", (component,)
        )
    applied = {version: checksum for version, checksum in await cursor.fetchall()}
    done: list[int] = []
    for migration in migrations:
        if migration.version in applied:
            if applied[migration.version] != migration.checksum:
                raise MigrationChangedError(migration.version)
            continue
        await conn.execute(migration.sql.encode())
        if component is None:
            await conn.execute(
                "insert into bastion.bastion_migrations (version, name, checksum) values (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
        else:
            await conn.execute(
                "insert into bastion.component_migrations (component, version, name, checksum)"
                " values (%s, %s, %s, %s)",
                (component, migration.version, migration.name, migration.checksum),
            )
        done.append(migration.version)
    return done
