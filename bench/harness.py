"""Runs the measurement: every system in its own server process, the same cells, interleaved rounds.

A cell is a scenario (new conversations, or conversations of several turns whose history grows), a
concurrency and a word count. Each round runs every cell for every system, rotating the order of the
systems, so slow drifts of the machine reach all of them alike. Every turn is verified; a turn that
fails counts as a failure of its system, never as a fast turn.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from bench.client import HttpConnection, HttpProtocolError
from bench.protocol import TurnVerificationError, user_message
from bench.script import WORDS
from bench.servers import SystemServer
from bench.systems import ClientConfig, ServerConfig, load_system
from bench.tokens import SUPABASE_URL, signing_project

if TYPE_CHECKING:
    from bench.postgres import BenchPostgres, DatabaseCounters

Scenario = Literal["new", "conversation"]


@dataclass(frozen=True, slots=True)
class Cell:
    scenario: Scenario
    concurrency: int
    words: int = WORDS

    @property
    def label(self) -> str:
        kind = "new" if self.scenario == "new" else "conversation"
        suffix = "" if self.words == WORDS else f", {self.words} words"
        return f"{kind} c={self.concurrency}{suffix}"


@dataclass(frozen=True, slots=True)
class Options:
    """What to measure and how much. `min_turns` is the least number of turns in one batch;
    `conversation_concurrency` limits the conversations to those concurrencies (default: all)."""

    systems: Sequence[str]
    rounds: int = 3
    concurrency: Sequence[int] = (1, 16, 32)
    scenarios: Sequence[Scenario] = ("new", "conversation")
    min_turns: int = 24
    conversation_turns: int = 5
    words: int = WORDS
    calibration_words: int = 20
    calibration_concurrency: int = 16
    warmup_turns: int = 8
    round_trip_turns: int = 0
    conversation_concurrency: Sequence[int] = ()

    def cells(self) -> list[Cell]:
        cells = [
            Cell(s, c, self.words)
            for s in self.scenarios
            for c in self.concurrency
            if s == "new" or not self.conversation_concurrency or c in self.conversation_concurrency
        ]
        if self.calibration_words and self.calibration_words != self.words:
            full = Cell("new", self.split_concurrency, self.words)
            if full not in cells:
                cells.append(full)
            cells.append(Cell("new", self.split_concurrency, self.calibration_words))
        return cells

    @property
    def split_concurrency(self) -> int:
        """The concurrency at which the CPU split is measured: 16 when measured, else the highest."""
        if self.calibration_concurrency in self.concurrency or not self.concurrency:
            return self.calibration_concurrency
        return max(self.concurrency)


@dataclass(slots=True)
class Batch:
    """One system running one cell once: its turns, their latencies, and what the server spent."""

    system: str
    cell: Cell
    round: int
    turns: int = 0
    deltas: int = 0
    latencies: list[float] = field(default_factory=list)
    first_deltas: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0
    server_cpu_seconds: float = 0.0
    database: DatabaseCounters | None = None


@dataclass(frozen=True, slots=True)
class Run:
    options: Options
    batches: list[Batch]
    roles: dict[str, str]
    postgres_version: str | None
    round_trips: dict[str, float] = field(default_factory=dict)
    load_average: tuple[tuple[float, float, float], tuple[float, float, float]] | None = None


async def run_cell(
    system: ModuleType, port: int, cell: Cell, client: ClientConfig, *, options: Options, batch: Batch
) -> None:
    """Drive `cell` against the server on `port` with `cell.concurrency` simulated users."""
    if cell.scenario == "new":
        conversations, turns = max(1, math.ceil(options.min_turns / cell.concurrency)), 1
    else:
        per_user = options.min_turns / (cell.concurrency * options.conversation_turns)
        conversations, turns = max(1, math.ceil(per_user)), options.conversation_turns
    start = time.perf_counter()
    await asyncio.gather(
        *(_user(system, port, cell, client, conversations, turns, batch) for _ in range(cell.concurrency))
    )
    batch.wall_seconds = time.perf_counter() - start


async def _user(
    system: ModuleType,
    port: int,
    cell: Cell,
    client: ClientConfig,
    conversations: int,
    turns: int,
    batch: Batch,
) -> None:
    connection = HttpConnection(port)
    try:
        for _ in range(conversations):
            chat_id, history = str(uuid.uuid4()), []
            for _ in range(turns):
                history.append(user_message(cell.words))
                request = system.build_request(chat_id, history, client)
                started = time.perf_counter()
                try:
                    response = await connection.request(request)
                    elapsed = time.perf_counter() - started
                    verified = system.verify_stream(response, words=cell.words)
                except (TurnVerificationError, HttpProtocolError, OSError) as exc:
                    batch.failures.append(f"{type(exc).__name__}: {exc}")
                    await connection.close()
                    break
                batch.latencies.append(elapsed)
                if response.first_delta_at is not None:
                    batch.first_deltas.append(response.first_delta_at - started)
                batch.turns += 1
                batch.deltas += verified.deltas
                history.append(verified.message)
    finally:
        await connection.close()


def run_benchmark(options: Options, *, progress: Callable[[str], None] = lambda line: None) -> Run:
    """Start Postgres (if a system needs it) and every system's server, measure, and stop them all."""
    modules = {name: load_system(name) for name in options.systems}
    project = signing_project()
    client = ClientConfig(bearer_token=project.token)
    workdir = Path(tempfile.mkdtemp(prefix="bastion-bench-"))
    postgres: BenchPostgres | None = None
    servers: dict[str, SystemServer] = {}
    databases: dict[str, str] = {}
    try:
        if any(module.NEEDS_POSTGRES for module in modules.values()):
            from bench.postgres import BenchPostgres  # only runs that need Postgres load its driver

            postgres = BenchPostgres(workdir)
        for name, module in modules.items():
            url = None
            if module.NEEDS_POSTGRES and postgres is not None:
                databases[name] = "bench_" + name.replace("-", "_")
                url = postgres.create_database(databases[name])
            config = ServerConfig(database_url=url, supabase_url=SUPABASE_URL, jwks=project.jwks)
            servers[name] = SystemServer(name, config, workdir)
            # One after another: bastion's migrations create roles the cluster's databases share.
            servers[name].wait_ready()
        load_before = os.getloadavg()
        batches = asyncio.run(_measure(options, modules, servers, client, postgres, databases, progress))
        load_after = os.getloadavg()
        counted: dict[str, float] = {}
        if options.round_trip_turns and postgres is not None:
            from bench.turn_costs import count_round_trips

            urls = {name: postgres.uri(database) for name, database in databases.items()}
            progress(f"counting round trips: {options.round_trip_turns} turns per system at c=1")
            counted = asyncio.run(
                count_round_trips(
                    postgres,
                    {name: modules[name] for name in urls},
                    urls,
                    project.jwks,
                    client,
                    workdir,
                    options.round_trip_turns,
                )
            )
        roles = {name: str(module.ROLE) for name, module in modules.items()}
        return Run(
            options,
            batches,
            roles,
            postgres.version if postgres is not None else None,
            round_trips=counted,
            load_average=(load_before, load_after),
        )
    finally:
        for server in servers.values():
            server.stop()
        if postgres is not None:
            postgres.close()
        shutil.rmtree(workdir, ignore_errors=True)


async def _measure(
    options: Options,
    modules: dict[str, ModuleType],
    servers: dict[str, SystemServer],
    client: ClientConfig,
    postgres: BenchPostgres | None,
    databases: dict[str, str],
    progress: Callable[[str], None],
) -> list[Batch]:
    names = list(modules)
    broken: set[str] = set()
    for name in names:
        for scenario in options.scenarios:
            warmup = Options(systems=[name], min_turns=options.warmup_turns, conversation_turns=2)
            batch = Batch(name, Cell(scenario, min(4, options.warmup_turns)), round=0)
            await run_cell(modules[name], servers[name].port, batch.cell, client, options=warmup, batch=batch)
            if batch.failures:
                broken.add(name)
                progress(f"{name}: warm-up failed: {batch.failures[0]}")
    batches: list[Batch] = []
    for round_index in range(1, options.rounds + 1):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for cell in options.cells():
            for name in order:
                batch = Batch(name, cell, round_index)
                if name in broken:
                    batch.failures.append("the warm-up failed")
                else:
                    await _timed(
                        modules[name],
                        servers[name],
                        cell,
                        client,
                        options,
                        batch,
                        postgres,
                        databases.get(name),
                    )
                batches.append(batch)
                progress(_progress_line(batch))
    return batches


async def _timed(
    module: ModuleType,
    server: SystemServer,
    cell: Cell,
    client: ClientConfig,
    options: Options,
    batch: Batch,
    postgres: BenchPostgres | None,
    database: str | None,
) -> None:
    before = postgres.counters(database) if postgres is not None and database is not None else None
    cpu_before = server.cpu_seconds()
    await run_cell(module, server.port, cell, client, options=options, batch=batch)
    batch.server_cpu_seconds = server.cpu_seconds() - cpu_before
    if before is not None and postgres is not None and database is not None:
        batch.database = postgres.counters(database) - before


def _progress_line(batch: Batch) -> str:
    rate = batch.turns / batch.wall_seconds if batch.wall_seconds else 0.0
    failed = f", {len(batch.failures)} FAILED" if batch.failures else ""
    where = f"round {batch.round} {batch.cell.label:<22} {batch.system:<20}"
    return f"{where} {batch.turns:>4} turns {rate:7.1f}/s{failed}"
