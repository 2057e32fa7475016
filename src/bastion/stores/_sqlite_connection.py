"""The SQLite store's one connection, on its own thread: opening it, transactions, and migrations.

All database work runs on one dedicated thread that owns the only connection (a single-worker
executor is the queue). SQLite admits one writer at a time anyway; serializing the process's
transactions on one connection means none of them waits on a file lock or fails to upgrade a read
lock to a write lock, each runs from `begin` to `commit` without interleaving, and no Python callback
(reconciliation, an approval policy, a tool) ever runs while a transaction is open. `asyncio.to_thread`
would spread transactions over a pool of threads and connections that contend for the same lock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Final, TypeVar

from bastion.stores._migrations import Migration, MigrationChangedError
from bastion.stores._sqlite_statements import microseconds_now

__all__ = ["Work", "apply_sqlite_migrations", "available_sqlite_migrations", "connect", "run_transaction"]

T = TypeVar("T")
Work = Callable[[sqlite3.Connection], T]

_MIGRATION_FILE: Final = "sqlite_migrations"


def available_sqlite_migrations() -> list[Migration]:
    """The SQLite migrations shipped with bastion (`sqlite_migrations/NNNN_name.sql`), in order."""
    found: list[Migration] = []
    for entry in resources.files("bastion.stores").joinpath(_MIGRATION_FILE).iterdir():
        stem, _, suffix = entry.name.partition(".")
        version, _, name = stem.partition("_")
        if suffix == "sql" and version.isdigit() and len(version) == 4 and name:
            found.append(Migration(int(version), name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda migration: migration.version)
    return found


# Everything below runs on the store's thread.


def connect(path: str) -> sqlite3.Connection:
    """The store's one connection: autocommit mode (transactions are explicit), foreign keys on."""
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("pragma foreign_keys = on")
    connection.execute("pragma busy_timeout = 5000")
    if path != ":memory:":
        connection.execute("pragma journal_mode = wal")
    return connection


def run_transaction(connection: sqlite3.Connection, work: Work[T], write: bool) -> T:
    """Run `work` from `begin` to `commit`; any exception rolls it back."""
    connection.execute("begin immediate" if write else "begin")
    try:
        result = work(connection)
        connection.execute("commit")
    except BaseException:
        if connection.in_transaction:
            connection.execute("rollback")
        raise
    return result


def apply_sqlite_migrations(
    conn: sqlite3.Connection, migrations: Sequence[Migration], *, component: str = "bastion"
) -> list[int]:
    conn.execute(
        "create table if not exists bastion_migrations (version integer primary key, name text not null, "
        "checksum text not null, applied_at integer not null) strict"
    )
    conn.execute(
        "create table if not exists bastion_component_migrations (component text not null, "
        "version integer not null, name text not null, checksum text not null, applied_at integer not null, "
        "primary key (component, version)) strict"
    )
    if component == "bastion":
        applied = dict(conn.execute("select version, checksum from bastion_migrations").fetchall())
    else:
        applied = dict(
            conn.execute(
                "select version, checksum from bastion_component_migrations where component = ?", (component,)
            ).fetchall()
        )
    done: list[int] = []
    for migration in migrations:
        if migration.version in applied:
            if applied[migration.version] != migration.checksum:
                raise MigrationChangedError(migration.version)
            continue
        for statement in _statements(migration.sql):
            conn.execute(statement)
        if component == "bastion":
            conn.execute(
                "insert into bastion_migrations (version, name, checksum, applied_at) values (?, ?, ?, ?)",
                (migration.version, migration.name, migration.checksum, microseconds_now()),
            )
        else:
            conn.execute(
                "insert into bastion_component_migrations (component, version, name, checksum, applied_at) "
                "values (?, ?, ?, ?, ?)",
                (component, migration.version, migration.name, migration.checksum, microseconds_now()),
            )
        done.append(migration.version)
    return done


def _statements(script: str) -> list[str]:
    """Split a migration into statements, so that it runs inside the caller's transaction
    (`executescript` would commit first)."""
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        if not pending and (not line.strip() or line.lstrip().startswith("--")):
            continue
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending)
            pending = ""
    if pending.strip():
        raise ValueError("A migration ends with an incomplete statement.")
    return statements
