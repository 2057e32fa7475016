"""One bastion turn by component, its Postgres round trips, and the bytes a turn writes as history grows.

A dedicated in-process run, not the served hot path: the stages of `bench.systems.bastion`'s route are
called one by one with `time.perf_counter_ns` (wall) and `time.thread_time_ns` (this process's CPU)
around each, on the bench's script (one `lookup` call, then 200 words), against an embedded Postgres
reached through a proxy that counts round trips (a client waiting for the server: a simple query, a
pipeline sync or a flush). The stages are what the route does between the verified request and the
last event; the HTTP server, routing and event delivery are not in them.

- auth: `TokenVerifier.verify` of the ES256 token (warm key cache).
- claim: `start_agent_run` (the assistant's path: a new conversation is created on first use).
- session: `agent.prepare` (the turn's tools) and `session.stream` (UI history to model messages).
- model stream: reading the loop's chunks (the scripted model, tool validation, the UI chunks), less
  the tool operation and the encoding below.
- tool operation: `run.execute_tool`: the operation claim (one round trip), then `lookup`.
- encoding: each chunk to its wire JSON, applied to the assembled message, framed as an SSE event.
- save: `run.finish` (response message, run status, claim released) and closing the session.

Then one conversation of `--history` turns, each sending the whole history back as `useChat` does,
records per turn the WAL bytes (`pg_stat_statements.wal_bytes`), rows written and the JSON size of
the turn's new messages: a write proportional to the new messages stays flat as history grows.

    bench/.venv/bin/python -m bench.turn_profile [--turns 40] [--history 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bastion._ui_assembly import UIMessageAssembler, to_client_json
from bastion.auth import SupabaseEnv, TokenVerifier
from bastion.stores import PostgresStore
from bench.postgres import BenchPostgres
from bench.protocol import user_message
from bench.script import WORDS
from bench.systems import bastion as system
from bench.systems._pydantic_ai_model import scripted_model
from bench.tokens import SUPABASE_URL, signing_project
from tests.pg import RoundTripCounter

T = TypeVar("T")
STAGES = ("auth", "claim", "session", "model stream", "tool operation", "encoding", "save")


class Clock:
    """Wall and CPU nanoseconds and round trips per stage, for one turn at a time."""

    def __init__(self, counter: RoundTripCounter) -> None:
        self.counter = counter
        self.wall: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, int] = defaultdict(int)
        self.trips: dict[str, int] = defaultdict(int)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        trips, wall, cpu = self.counter.round_trips, time.perf_counter_ns(), time.thread_time_ns()
        try:
            yield
        finally:
            self.wall[name] += time.perf_counter_ns() - wall
            self.cpu[name] += time.thread_time_ns() - cpu
            self.trips[name] += self.counter.round_trips - trips

    async def timed(self, name: str, call: Callable[[], Awaitable[T]]) -> T:
        with self.stage(name):
            return await call()


async def profiled_turn(
    turns: system.ChatTurns,
    verifier: TokenVerifier,
    token: str,
    chat_id: str,
    history: list[dict[str, Any]],
    clock: Clock,
    *,
    words: int | None = WORDS,
) -> dict[str, Any]:
    """One turn through the route's stages; the assembled assistant message (checked to hold `words`)."""
    await asyncio.sleep(0.005)  # let the previous turn's leftovers (pool returns) run outside the stages
    principal = await clock.timed("auth", lambda: verifier.verify(token))
    run = await clock.timed("claim", lambda: turns.claim(principal, chat_id, history, "submit-message"))

    async def execute_tool(**operation: Any) -> Any:
        with clock.stage("tool operation"):
            return await run.execute_tool(**operation)

    async def open_session() -> Any:
        session = await turns.agent.prepare(context=principal, execute_tool=execute_tool)
        return session, await session.stream(model=turns.model, messages=run.messages)

    session, result = await clock.timed("session", open_session)
    assembler = UIMessageAssembler({"id": uuid.uuid4().hex, "role": "assistant", "parts": []})
    events: list[bytes] = []
    chunks = aiter(result)
    while True:
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        finally:
            clock.wall["model stream"] += time.perf_counter_ns() - wall
            clock.cpu["model stream"] += time.thread_time_ns() - cpu
        with clock.stage("encoding"):
            wire, parsed = to_client_json(chunk)
            assembler.apply(parsed)
            events.append(b"data: " + wire + b"\n\n")
    # The tool operation ran inside the model stream's reads: count it once, under its own name.
    clock.wall["model stream"] -= clock.wall["tool operation"]
    clock.cpu["model stream"] -= clock.cpu["tool operation"]
    message = assembler.assembled_message()

    async def save() -> None:
        await run.finish(response_message=message, status="completed")
        await session.close()

    await clock.timed("save", save)
    text = [part for part in message["parts"] if part.get("type") == "text"]
    if words is not None and (not text or not text[0]["text"].endswith(f"word{words - 1} ")):
        raise RuntimeError("The profiled turn did not stream the whole script.")
    return message


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _stage_table(clocks: list[Clock], trips: Clock, title: str) -> list[str]:
    lines = [
        f"{title} ({len(clocks)} turns, medians)",
        f"{'stage':16} {'wall µs':>9} {'CPU µs':>9} {'round trips':>12}",
    ]
    total_wall = total_cpu = 0.0
    total_trips = 0
    for name in STAGES:
        wall = _median([c.wall[name] / 1000 for c in clocks])
        cpu = _median([c.cpu[name] / 1000 for c in clocks])
        total_wall, total_cpu = total_wall + wall, total_cpu + cpu
        total_trips += trips.trips[name]
        lines.append(f"{name:16} {wall:9.0f} {cpu:9.0f} {trips.trips[name]:12}")
    lines.append(f"{'sum':16} {total_wall:9.0f} {total_cpu:9.0f} {total_trips:12}")
    return lines


async def profile(postgres: BenchPostgres, *, turns_count: int, history_turns: int) -> list[str]:
    """Time the stages on a direct connection; count round trips on a second one through the proxy.

    The proxy runs in this process, so its work would land in the timed stages: timing and counting
    are separate passes over the same kind of turn.
    """
    admin_url = postgres.create_database("bench_profile")
    params = conninfo_to_dict(admin_url)
    counter = RoundTripCounter(
        SimpleNamespace(socket_dir=str(params["host"]), port=int(params.get("port") or 5432))  # type: ignore[arg-type]
    )
    await counter.start()
    project = signing_project()
    verifier = TokenVerifier(SupabaseEnv(url=SUPABASE_URL, jwks=project.jwks))
    app_url = await system.prepare_database(admin_url)
    direct = await _turns(app_url)
    counted = await _turns(make_conninfo(app_url, host=counter.socket_dir))
    lines: list[str] = []
    try:
        for turns in (direct, counted):  # warm-up: prepared statements, caches, the key cache
            for _ in range(5):
                await _conversation(turns, verifier, project.token, Clock(counter), Clock(counter))
        first = [Clock(counter) for _ in range(turns_count)]
        later = [Clock(counter) for _ in range(turns_count)]
        for first_clock, later_clock in zip(first, later, strict=True):
            await _conversation(direct, verifier, project.token, first_clock, later_clock)
        first_trips, later_trips = Clock(counter), Clock(counter)
        await _conversation(counted, verifier, project.token, first_trips, later_trips)
        lines += _stage_table(first, first_trips, "First turn of a new conversation (created on first use)")
        lines.append("")
        lines += _stage_table(later, later_trips, "Second turn of a conversation")
        lines.append("")
        lines += await _history_growth(counted, verifier, project.token, postgres, history_turns, counter)
    finally:
        await direct.store.close()
        await counted.store.close()
        await counter.close()
    return lines


async def _turns(app_url: str) -> system.ChatTurns:
    store = await PostgresStore.open(app_url, min_size=1, max_size=1)
    return system.ChatTurns(
        store=store, persistence=store.persistence(), agent=system.bench_agent(), model=scripted_model()
    )


async def _conversation(
    turns: system.ChatTurns, verifier: TokenVerifier, token: str, first: Clock, later: Clock
) -> None:
    """Two turns of a new conversation, the second sending the whole history back."""
    chat_id, history = str(uuid.uuid4()), [user_message(WORDS)]
    history.append(await profiled_turn(turns, verifier, token, chat_id, history, first))
    history.append(user_message(WORDS))
    await profiled_turn(turns, verifier, token, chat_id, history, later)


async def _history_growth(
    turns: system.ChatTurns,
    verifier: TokenVerifier,
    token: str,
    postgres: BenchPostgres,
    history_turns: int,
    counter: RoundTripCounter,
) -> list[str]:
    lines = [
        f"One conversation of {history_turns} turns, the whole history sent back every turn",
        f"{'turn':>4} {'request KB':>10} {'new msgs KB':>11} {'WAL bytes':>10} {'rows':>5} "
        f"{'round trips':>12}",
    ]
    chat_id, history = str(uuid.uuid4()), []
    for index in range(1, history_turns + 1):
        history.append(user_message(WORDS))
        before = postgres.counters("bench_profile")
        trips = counter.round_trips
        message = await profiled_turn(turns, verifier, token, chat_id, history, Clock(counter))
        trips = counter.round_trips - trips
        after = postgres.counters("bench_profile")
        new_bytes = len(json.dumps(history[-1])) + len(json.dumps(message))
        request_bytes = len(json.dumps({"id": chat_id, "messages": history}))
        history.append(message)
        written = after - before
        lines.append(
            f"{index:>4} {request_bytes / 1024:10.1f} {new_bytes / 1024:11.1f} "
            f"{written.wal_bytes:>10} {written.rows_written:>5} {trips:>12}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=40, help="conversations profiled (two turns each)")
    parser.add_argument("--history", type=int, default=20, help="turns of the history-growth conversation")
    arguments = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bastion-profile-"))
    postgres = BenchPostgres(workdir)
    try:
        lines = asyncio.run(profile(postgres, turns_count=arguments.turns, history_turns=arguments.history))
    finally:
        postgres.close()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
