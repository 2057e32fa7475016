"""Where a served turn's costs go, system against system: statements, Postgres time, round trips, CPU.

Each named system (default: the hand-wired `bastion` and `bastion-chat-routes`) is served as in the
peer benchmark (its own uvicorn process and database on one embedded Postgres with
`pg_stat_statements`), and runs batches of new-conversation turns at each concurrency, systems
interleaved per round. Per system and concurrency it prints turns/s, server and Postgres CPU per turn,
transactions, statements, their execution time and WAL per turn, then every statement with its calls,
mean time and WAL per turn (top level and nested, as `pg_stat_statements.track = all` records them).

`--round-trips` adds a pass at c=1 through a proxy that counts each time a client waits for the server
(a simple query, a pipeline sync, a flush), on a second server of the same system and database;
background work of that process in the pass (DBOS's polling, hook delivery) counts too.

`--cprofile` profiles each server (cProfile on the event loop thread's CPU clock, started and paused
by signals) during one more batch at the highest concurrency, and prints CPU per turn and calls per
turn of the functions of interest (inclusive) and the hottest functions (exclusive). cProfile's own
overhead inflates every figure (most for small, frequent calls); compare systems, not absolutes.

`--py-spy` samples each server during one more batch at the highest concurrency (`py-spy record`, raw
stacks, idle frames excluded) and prints, per system, the CPU per turn under each frame of interest
(inclusive) and of the hottest functions (exclusive); `--py-spy-out DIR` keeps the raw stacks.

    bench/.venv/bin/python -m bench.turn_costs [--systems bastion,bastion-chat-routes] [--turns 96]
        [--concurrency 1,16] [--rounds 2] [--round-trips 16] [--py-spy] [--statements 25]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from bench.harness import Batch, Cell, Options, run_cell
from bench.postgres import BenchPostgres, DatabaseCounters
from bench.servers import SystemServer
from bench.systems import ClientConfig, ServerConfig, load_system
from bench.tokens import SUPABASE_URL, signing_project

_STATEMENTS = """
select s.toplevel, s.calls, s.total_exec_time, s.total_plan_time, s.wal_bytes, s.rows,
       left(regexp_replace(s.query, '\\s+', ' ', 'g'), 150)
from pg_stat_statements s join pg_database d on d.oid = s.dbid
where d.datname = %s
"""
_RESET = "select pg_stat_statements_reset(0, (select oid from pg_database where datname = %s), 0)"

# Frames whose inclusive CPU is shown for every system: (label, function name or "", path fragment).
FRAMES = (
    ("HTTP: uvicorn h11 protocol", "", "uvicorn/protocols/http/h11_impl.py"),
    ("worker: auth (TokenVerifier.verify)", "verify", "bastion/auth.py"),
    ("route: body parsing/validation (api.operation)", "", "bastion/api.py"),
    ("chat: claim (start_agent_run)", "start_agent_run", "bastion/persistence.py"),
    ("chat: conversation create", "create_conversation", "bastion/stores/postgres.py"),
    ("chat: reconcile history", "reconcile_agent_messages", "bastion/history.py"),
    ("chat: agent.prepare", "prepare", "bastion/agent.py"),
    ("chat: live.log / stop_signal", "", "bastion/stores/postgres_live.py"),
    ("loop: model + chunks (_loop)", "", "bastion/_loop.py"),
    ("tool: run.execute_tool", "execute_tool", "bastion/persistence.py"),
    ("stream: to_client_json", "to_client_json", "bastion/_ui_assembly.py"),
    ("stream: assembler.apply", "apply", "bastion/_ui_assembly.py"),
    ("stream: log.add", "add", "bastion/stores/live.py"),
    ("stream: log flush/write", "flush", "bastion/stores/live.py"),
    ("stream: event channel → ASGI send", "_deliver", "bastion/chat/stream_response.py"),
    ("save: run.finish", "finish", "bastion/persistence.py"),
    ("durable turns", "", "bastion/chat/durable_turns.py"),
    ("hooks", "", "bastion/hooks/"),
    ("memory", "", "bastion/memory/"),
    ("psycopg (all)", "", "/psycopg/"),
    ("pydantic-ai (all)", "", "/pydantic_ai/"),
    ("pydantic validation (all)", "", "/pydantic/"),
    ("DBOS (all)", "", "/dbos/"),
    ("SQLAlchemy (all)", "", "/sqlalchemy/"),
    ("json (all)", "", "/json/"),
)


def _frame_matches(frame: str, name: str, path: str) -> bool:
    """A raw py-spy frame is `function (path:line)`."""
    function, _, where = frame.partition(" (")
    return path in where and (not name or function == name)


@dataclass
class Statement:
    toplevel: bool
    query: str
    calls: int = 0
    exec_ms: float = 0.0
    plan_ms: float = 0.0
    wal_bytes: int = 0
    rows: int = 0


@dataclass
class Measured:
    """One system at one concurrency, summed over its rounds."""

    turns: int = 0
    wall: float = 0.0
    server_cpu: float = 0.0
    database: DatabaseCounters = field(default_factory=lambda: DatabaseCounters(0, 0, 0, 0.0, 0))
    statements: dict[tuple[bool, str], Statement] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def _statements(postgres: BenchPostgres, database: str) -> list[Statement]:
    rows = postgres._admin.execute(_STATEMENTS, (database,)).fetchall()
    return [
        Statement(bool(top), str(query), int(calls), float(exec_ms), float(plan_ms), int(wal), int(rows_))
        for top, calls, exec_ms, plan_ms, wal, rows_, query in rows
    ]


async def _batch(
    module: ModuleType, server: SystemServer, cell: Cell, client: ClientConfig, turns: int
) -> Batch:
    batch = Batch(server.name, cell, round=1)
    options = Options(systems=[server.name], min_turns=turns)
    cpu = server.cpu_seconds()
    await run_cell(module, server.port, cell, client, options=options, batch=batch)
    batch.server_cpu_seconds = server.cpu_seconds() - cpu
    return batch


async def measure(
    postgres: BenchPostgres,
    modules: dict[str, ModuleType],
    servers: dict[str, SystemServer],
    client: ClientConfig,
    *,
    concurrency: Sequence[int],
    rounds: int,
    turns: int,
) -> dict[tuple[str, int], Measured]:
    found: dict[tuple[str, int], Measured] = defaultdict(Measured)
    names = list(modules)
    for name in names:  # warm-up: connections, prepared statements, caches
        await _batch(modules[name], servers[name], Cell("new", 4), client, 16)
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for level in concurrency:
            for name in order:
                database = _database(name)
                postgres._admin.execute(_RESET, (database,))
                before = await asyncio.to_thread(postgres.settled_counters, database)
                batch = await _batch(modules[name], servers[name], Cell("new", level), client, turns)
                # What the turns left behind (log writes, hook work) lands, and the transaction counts
                # Postgres publishes late settle.
                after = await asyncio.to_thread(postgres.settled_counters, database)
                measured = found[(name, level)]
                measured.failures += batch.failures
                measured.turns += batch.turns
                measured.wall += batch.wall_seconds
                measured.server_cpu += batch.server_cpu_seconds
                delta = after - before
                total = measured.database
                measured.database = DatabaseCounters(
                    total.statements + delta.statements,
                    total.wal_bytes + delta.wal_bytes,
                    total.rows_written + delta.rows_written,
                    total.cpu_seconds + delta.cpu_seconds,
                    total.transactions + delta.transactions,
                )
                for statement in _statements(postgres, database):
                    key = (statement.toplevel, statement.query)
                    kept = measured.statements.setdefault(key, Statement(statement.toplevel, statement.query))
                    kept.calls += statement.calls
                    kept.exec_ms += statement.exec_ms
                    kept.plan_ms += statement.plan_ms
                    kept.wal_bytes += statement.wal_bytes
                    kept.rows += statement.rows
                rate = batch.turns / batch.wall_seconds if batch.wall_seconds else 0.0
                print(f"round {round_index + 1} c={level:<3} {name:<22} {rate:6.1f} turns/s", flush=True)
    return found


def _database(name: str) -> str:
    return "bench_" + name.replace("-", "_")


def report(found: dict[tuple[str, int], Measured], *, limit: int) -> list[str]:
    lines: list[str] = []
    for (name, level), measured in sorted(found.items(), key=lambda item: (item[0][1], item[0][0])):
        turns = measured.turns or 1
        db = measured.database
        top = [s for s in measured.statements.values() if s.toplevel]
        exec_ms = sum(s.exec_ms for s in top)
        lines += [
            "",
            f"## {name}, new conversations, c={level}: {measured.turns} turns"
            + (
                f", {len(measured.failures)} FAILED ({measured.failures[0][:120]})"
                if measured.failures
                else ""
            ),
            "",
            f"turns/s {measured.turns / measured.wall:.1f}; server CPU "
            f"{measured.server_cpu * 1000 / turns:.2f} ms/turn; Postgres CPU "
            f"{db.cpu_seconds * 1000 / turns:.2f} ms/turn; transactions "
            f"{db.transactions / turns:.1f}/turn; top-level statements {db.statements / turns:.1f}/turn, "
            f"executing {exec_ms / turns:.2f} ms/turn; WAL {db.wal_bytes / turns:.0f} B/turn; rows written "
            f"{db.rows_written / turns:.1f}/turn",
            "",
            "| level | calls/turn | mean µs | exec ms/turn | WAL B/turn | statement |",
            "|---|---|---|---|---|---|",
        ]
        ordered = sorted(measured.statements.values(), key=lambda s: (not s.toplevel, -s.exec_ms))
        shown = [s for s in ordered if s.toplevel][:limit] + [s for s in ordered if not s.toplevel][:limit]
        for s in shown:
            mean = s.exec_ms * 1000 / s.calls if s.calls else 0.0
            query = s.query.replace("|", "\\|")
            lines.append(
                f"| {'top' if s.toplevel else 'nested'} | {s.calls / turns:.2f} | {mean:.0f} | "
                f"{s.exec_ms / turns:.3f} | {s.wal_bytes / turns:.0f} | `{query}` |"
            )
    return lines


def _through(url: str, socket_dir: str) -> str:
    """`url` (a `postgresql://` URI with its socket directory in `host`) through another socket dir."""
    parts = urlsplit(url)
    query = [(k, socket_dir if k == "host" else v) for k, v in parse_qsl(parts.query)]
    if not any(k == "host" for k, _ in query):
        query.append(("host", socket_dir))
    return urlunsplit(parts._replace(query=urlencode(query)))


async def count_round_trips(
    postgres: BenchPostgres,
    modules: dict[str, ModuleType],
    urls: dict[str, str],
    jwks: dict[str, Any],
    client: ClientConfig,
    workdir: Path,
    turns: int,
) -> dict[str, float]:
    """Round trips per turn at c=1 (new conversations), each system's second server reaching Postgres
    through a proxy that counts each time a client waits for the server."""
    from types import SimpleNamespace

    from psycopg.conninfo import conninfo_to_dict

    from tests.pg import RoundTripCounter

    params = conninfo_to_dict(postgres._server.get_uri())
    cluster: Any = SimpleNamespace(socket_dir=str(params["host"]), port=int(params.get("port") or 5432))
    found: dict[str, float] = {}
    for name, module in modules.items():
        if name not in urls:
            continue
        counter = RoundTripCounter(cluster)
        await counter.start()
        url = _through(urls[name], counter.socket_dir)
        config = ServerConfig(database_url=url, supabase_url=SUPABASE_URL, jwks=jwks)
        server = SystemServer(name, config, workdir, label=f"{name}-counted")
        try:
            await asyncio.to_thread(server.wait_ready)
            await _batch(module, server, Cell("new", 1), client, 4)
            await asyncio.sleep(0.5)
            before = counter.round_trips
            batch = await _batch(module, server, Cell("new", 1), client, turns)
            await asyncio.sleep(0.5)
            found[name] = (counter.round_trips - before) / max(batch.turns, 1)
        finally:
            await asyncio.to_thread(server.stop)
            await counter.close()
    return found


async def sampled(
    modules: dict[str, ModuleType],
    servers: dict[str, SystemServer],
    client: ClientConfig,
    *,
    level: int,
    turns: int,
    out: Path,
) -> list[str]:
    """CPU per turn by frame, from `py-spy record` of each server during one batch at `level`."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    rate = 1000
    lines = ["", f"## Server CPU per turn by frame (py-spy, {rate} Hz, c={level}, new conversations)", ""]
    per_system: dict[str, tuple[dict[str, int], dict[str, int], int]] = {}
    for name, module in modules.items():
        path = out / f"{name}.txt"
        spy = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(servers[name].pid),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--output",
                str(path),
                "--nonblocking",
                "--gil",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(1.0)
        batch = await _batch(module, servers[name], Cell("new", level), client, turns)
        spy.send_signal(signal.SIGINT)
        await asyncio.to_thread(spy.wait, 30)
        per_system[name] = (*_frames(path), batch.turns)
    names = list(per_system)
    lines += ["| frame (inclusive) | " + " | ".join(f"{n} ms/turn" for n in names) + " |"]
    lines.append("|---|" + "---|" * len(names))
    for label, _, _ in FRAMES:
        values = [per_system[n][0].get(label, 0) / rate * 1000 / max(per_system[n][2], 1) for n in names]
        lines.append(f"| {label} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    totals = [per_system[n][0].get("total", 0) / rate * 1000 / max(per_system[n][2], 1) for n in names]
    lines.append("| **all samples** | " + " | ".join(f"{v:.2f}" for v in totals) + " |")
    for name in names:
        leaves, turns_done = per_system[name][1], max(per_system[name][2], 1)
        lines += ["", f"Hottest functions of {name} (exclusive, ms/turn):", ""]
        for frame, count in sorted(leaves.items(), key=lambda item: -item[1])[:25]:
            lines.append(f"- {count / rate * 1000 / turns_done:.3f} {frame}")
    return lines


# Functions whose inclusive CPU and calls are shown: (label, function name, path fragment).
FUNCTIONS = (
    ("whole request (h11 cycle run_asgi)", "run_asgi", "uvicorn/protocols/http/h11_impl.py"),
    ("worker: auth (TokenVerifier.verify)", "verify", "bastion/auth.py"),
    ("route: JSON body (api.json_body)", "json_body", "bastion/api.py"),
    ("route: ChatRequest validation (api._validated)", "_validated", "bastion/api.py"),
    ("chat: ChatEndpoint.chat (claim to response object)", "chat", "bastion/chat/endpoint.py"),
    ("chat: _start_turn (claim, create on first use)", "_start_turn", "bastion/chat/endpoint.py"),
    ("chat: _create_for_chat", "_create_for_chat", "bastion/chat/endpoint.py"),
    ("chat: start_agent_run", "start_agent_run", "bastion/persistence.py"),
    ("chat: reconcile_agent_messages", "reconcile_agent_messages", "bastion/history.py"),
    ("chat: create_conversation", "create_conversation", "bastion/stores/postgres.py"),
    ("chat: open_turn", "open_turn", "bastion/chat/endpoint.py"),
    ("chat: agent.prepare", "prepare", "bastion/agent.py"),
    ("turn: _Turn.run (stream, save, settle)", "run", "bastion/chat/stream_response.py"),
    ("turn: _consume (loop chunks → events)", "_consume", "bastion/chat/stream_response.py"),
    ("stream: to_client_json", "to_client_json", "bastion/_client_json.py"),
    ("stream: UIMessageAssembler.apply", "apply", "bastion/_ui_assembly.py"),
    ("stream: ChunkLog.add", "add", "bastion/stores/live.py"),
    ("log: ChunkLog._run (batch writer task)", "_run", "bastion/stores/live.py"),
    ("log: ChunkLog.flush", "flush", "bastion/stores/live.py"),
    ("log: write (append_chunks transaction)", "write", "bastion/stores/postgres_live.py"),
    ("log: stop_signal", "stop_signal", "bastion/stores/postgres_live.py"),
    ("stream: _EventChannel.batches", "batches", "bastion/chat/stream_response.py"),
    ("stream: _deliver (ASGI sends)", "_deliver", "bastion/chat/stream_response.py"),
    ("tool: AgentRun.execute_tool", "execute_tool", "bastion/persistence.py"),
    ("save: _settle (on_finish, on_settled)", "_settle", "bastion/chat/stream_response.py"),
    ("save: AgentRun.finish", "finish", "bastion/persistence.py"),
    ("store: PostgresStore.transaction", "transaction", "bastion/stores/postgres.py"),
    ("psycopg: AsyncCursor.execute", "execute", "psycopg/cursor_async.py"),
    ("psycopg: AsyncConnection.execute", "execute", "psycopg/connection_async.py"),
    ("pool: getconn", "getconn", "psycopg_pool/pool_async.py"),
    ("pool: putconn", "putconn", "psycopg_pool/pool_async.py"),
    ("durable: DurableTurns.respond", "respond", "bastion/chat/durable_turns.py"),
    ("memory: recall (context_messages)", "context_messages", "bastion/memory/"),
)


def _profile_table(paths: dict[str, Path], turns: dict[str, int]) -> list[str]:
    import pstats

    stats = {name: pstats.Stats(str(path)).stats for name, path in paths.items() if path.exists()}  # type: ignore[attr-defined]
    names = list(stats)
    lines = [
        "| function (inclusive) | " + " | ".join(f"{name} ms/turn (calls/turn)" for name in names) + " |",
        "|---|" + "---|" * len(names),
    ]

    def lookup(name: str, function: str, path: str) -> tuple[float, float]:
        cumulative = calls = 0.0
        for (filename, _, func), (_, total_calls, _, cum, _) in stats[name].items():
            if func == function and path in filename:
                cumulative += cum
                calls += total_calls
        per_turn = max(turns.get(name, 0), 1)
        return cumulative * 1000 / per_turn, calls / per_turn

    for label, function, path in FUNCTIONS:
        cells = [lookup(name, function, path) for name in names]
        if all(calls == 0 for _, calls in cells):
            continue
        lines.append(f"| {label} | " + " | ".join(f"{ms:.2f} ({calls:.1f})" for ms, calls in cells) + " |")
    for name in names:
        per_turn = max(turns.get(name, 0), 1)
        lines += ["", f"Hottest functions of {name} (exclusive CPU ms/turn, calls/turn):", ""]
        ranked = sorted(stats[name].items(), key=lambda item: -item[1][2])[:30]
        for (filename, line, func), (_, total_calls, total, _, _) in ranked:
            short = "/".join(Path(filename).parts[-2:])
            lines.append(
                f"- {total * 1000 / per_turn:.3f} ({total_calls / per_turn:.1f}) {func} ({short}:{line})"
            )
    return lines


async def profiled(
    modules: dict[str, ModuleType],
    servers: dict[str, SystemServer],
    client: ClientConfig,
    paths: dict[str, Path],
    *,
    level: int,
    turns: int,
) -> tuple[list[str], dict[str, int]]:
    """One batch per system with its cProfile on (its statistics written when it is turned off)."""
    served: dict[str, int] = {}
    for name, module in modules.items():
        os.kill(servers[name].pid, signal.SIGUSR1)
        await asyncio.sleep(0.2)
        batch = await _batch(module, servers[name], Cell("new", level), client, turns)
        await asyncio.sleep(0.5)  # the log's last writes and the settlement land inside the profile
        os.kill(servers[name].pid, signal.SIGUSR2)
        served[name] = batch.turns
    await asyncio.sleep(2.0)  # the statistics are written
    lines = [
        "",
        f"## Server CPU per turn by function (cProfile, c={level}, {turns} new-conversation turns)",
        "",
    ]
    return lines + _profile_table(paths, served), served


def _frames(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Inclusive samples per frame of interest (and `total`), and exclusive samples per leaf frame."""
    inclusive: dict[str, int] = defaultdict(int)
    leaves: dict[str, int] = defaultdict(int)
    if not path.exists():
        return inclusive, leaves
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        inclusive["total"] += count
        frames = stack.split(";")
        for label, name, where in FRAMES:
            if any(_frame_matches(frame, name, where) for frame in frames):
                inclusive[label] += count
        leaves[frames[-1]] += count
    return inclusive, leaves


async def run(arguments: argparse.Namespace) -> list[str]:
    names = [name for name in arguments.systems.split(",") if name]
    modules = {name: load_system(name) for name in names}
    project = signing_project()
    client = ClientConfig(bearer_token=project.token)
    workdir = Path(tempfile.mkdtemp(prefix="bastion-turn-costs-"))
    postgres = BenchPostgres(workdir)
    servers: dict[str, SystemServer] = {}
    urls: dict[str, str] = {}
    profiles = {name: workdir / f"{name}.prof" for name in names}
    lines = [f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}"]
    try:
        for name in names:
            urls[name] = postgres.create_database(_database(name))
            config = ServerConfig(database_url=urls[name], supabase_url=SUPABASE_URL, jwks=project.jwks)
            env = {"BENCH_CPROFILE": str(profiles[name])} if arguments.cprofile else None
            servers[name] = SystemServer(name, config, workdir, env=env)
            await asyncio.to_thread(servers[name].wait_ready)
        found = await measure(
            postgres,
            modules,
            servers,
            client,
            concurrency=arguments.concurrency,
            rounds=arguments.rounds,
            turns=arguments.turns,
        )
        lines += report(found, limit=arguments.statements)
        if arguments.py_spy:
            out = Path(arguments.py_spy_out or workdir / "py-spy")
            out.mkdir(parents=True, exist_ok=True)
            level = max(arguments.concurrency)
            lines += await sampled(modules, servers, client, level=level, turns=arguments.turns, out=out)
        if arguments.cprofile:
            level = max(arguments.concurrency)
            table, _ = await profiled(
                modules, servers, client, profiles, level=level, turns=arguments.cprofile
            )
            lines += table
        if arguments.round_trips:
            counted = await count_round_trips(
                postgres, modules, urls, project.jwks, client, workdir, arguments.round_trips
            )
            lines += [
                "",
                "## Round trips per turn (c=1, new conversations, a second server through a proxy)",
                "",
            ]
            lines += [f"- {name}: {value:.1f}" for name, value in counted.items()]
    finally:
        for server in servers.values():
            server.stop()
        postgres.close()
        shutil.rmtree(workdir, ignore_errors=True)
    lines.append(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_costs", description=__doc__.split("\n")[0])
    parser.add_argument("--systems", default="bastion,bastion-chat-routes")
    parser.add_argument("--turns", type=int, default=96, help="turns per batch")
    parser.add_argument("--concurrency", type=lambda t: [int(v) for v in t.split(",")], default=[1, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--statements", type=int, default=25, help="statements listed per level")
    parser.add_argument("--round-trips", type=int, default=0, help="turns of the counted pass (0: none)")
    parser.add_argument("--py-spy", action="store_true")
    parser.add_argument("--cprofile", type=int, default=0, help="turns of the profiled batch (0: none)")
    parser.add_argument("--py-spy-out", default=None)
    arguments = parser.parse_args(argv)
    started = time.monotonic()
    lines = asyncio.run(run(arguments))
    print("\n".join(lines))
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
