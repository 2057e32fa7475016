"""Durable turns against today's turns, measured in the same run on the same machine and Postgres.

Two servers run the same application (`chat_routes` over `PostgresStore`, one tool `lookup`, a scripted
model), one with durable turns (`durable=DurableEngine`) and one without, each on its own database of one
embedded Postgres with `pg_stat_statements`. Rounds alternate between them. Figures:

- turns/s at c=1, 16 and 32 (new conversations, one tool call, 20 words), and their ratio;
- time to the first text delta at c=1, p50 and p99, and the durable turn's added time, for the turn
  above (the text follows one tool call) and for a turn that answers without calling a tool;
- statements (round trips) and WAL bytes per turn, from `pg_stat_statements` of each database;
- the 10-step persisted tool loop (10 model steps, each calling `lookup` through its claim), wall time;
- take-over: two durable workers on one database; a turn streaming on the first is cut by SIGKILL, and the
  time until the second streams the turn on (`GET /api/chat/{id}/stream`) and until it finishes;
- followers (today's server): the time to the first text delta at c=1 beside a long turn that 0, 10 or
  200 resumed streams follow (past the caps, 429), against 0 in the same round.

    python -m bench.durable_turns [--rounds 3] [--turns 48] [--takeovers 5] [--followers 200]
        [--follower-cap N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from bench.postgres import BenchPostgres
from bench.servers import free_port
from bench.stats import percentile
from bench.tokens import SUPABASE_URL, signing_project

ROOT = Path(__file__).resolve().parent.parent
MODES = ("today", "durable")
FOLLOWER_CAP = "BENCH_FOLLOWER_CAP"


# --- the application, in each server process -------------------------------------------------------


def _prompt(words: int, steps: int, pause_ms: int) -> str:
    return f"words {words} steps {steps} pause {pause_ms}"


def _parse(text: str) -> tuple[int, int, float]:
    fields = text.split()
    values = dict(zip(fields[::2], (int(value) for value in fields[1::2]), strict=True))
    return values["words"], values["steps"], values["pause"] / 1000


async def _script(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
    prompts = [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart) and isinstance(part.content, str)
    ]
    words, steps, pause = _parse(prompts[-1])
    done = sum(
        1
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    )
    if done < steps:
        yield {
            0: DeltaToolCall(name="lookup", json_args=json.dumps({"key": f"k{done}"}), tool_call_id="call_0")
        }
        return
    for index in range(words):
        if pause:
            await asyncio.sleep(pause)
        # The process that streams a word names itself, so a reader tells a taken-over attempt apart.
        yield f"w{index}.{os.getpid()} "


async def serve(mode: str, port: int, admin_url: str, jwks_path: str) -> None:
    import uvicorn

    from bastion import define_agent, tool
    from bastion.auth import SupabaseEnv
    from bastion.chat.endpoint import chat_routes
    from bastion.durable import DurableEngine, migrate_durable
    from bastion.stores import FollowerLimits, PostgresStore
    from bastion.worker import create_agent_worker
    from bench.systems.bastion import APP_ROLE, prepare_database

    @tool
    async def lookup(key: str) -> dict[str, str]:
        """Look a key up."""
        return {"key": key, "value": key.upper()}

    app_url = await prepare_database(admin_url)
    engine = None
    if mode == "durable":
        await migrate_durable(admin_url, app_role=APP_ROLE)
        engine = await DurableEngine.launch(app_url)
    # `--follower-cap N` lifts the followers' caps to N, to measure the shared reader without them.
    cap = int(os.environ.get(FOLLOWER_CAP, "0"))
    limits = FollowerLimits(per_user=cap, per_turn=cap) if cap else FollowerLimits()
    store = await PostgresStore.open(app_url, min_size=16, max_size=16, follower_limits=limits)
    agent = define_agent(name="bench", instructions="Answer.", tools=lambda _: [lookup], max_steps=12)
    options: dict[str, Any] = {"durable": engine} if engine is not None else {}
    routes = chat_routes(
        agent=agent,
        store=store,
        model=FunctionModel(stream_function=_script),
        context=lambda turn: turn.principal,
        **options,
    )
    env = SupabaseEnv(url=SUPABASE_URL, jwks=json.loads(Path(jwks_path).read_text()))
    app = create_agent_worker(env=env, routes=routes)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    try:
        await uvicorn.Server(config).serve()
    finally:
        await store.close()
        if engine is not None:
            await engine.close()


# --- the load client -----------------------------------------------------------------------------


@dataclass
class Turn:
    first_delta: float | None
    total: float
    chunks: list[dict[str, Any]] = field(default_factory=list)


async def stream(port: int, token: str, method: str, path: str, body: bytes = b"") -> AsyncIterator[Any]:
    """Yields (status, None) once, then (seconds since sent, chunk) per UI message chunk."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = [f"{method} {path} HTTP/1.1", f"host: 127.0.0.1:{port}", f"authorization: Bearer {token}"]
        head += [
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
            "",
            "",
        ]
        started = time.perf_counter()
        writer.write("\r\n".join(head).encode() + body)
        await writer.drain()
        status = int((await reader.readuntil(b"\r\n")).split()[1])
        while (await reader.readuntil(b"\r\n")) != b"\r\n":
            pass
        yield status, None
        buffer = b""
        while True:
            data = await reader.read(65536)
            if not data:
                return
            buffer += data
            # Chunked transfer framing carries the SSE lines; read the `data:` events out of it.
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    start = line.find(b"data: ")
                    if start < 0:
                        continue
                    payload = line[start + 6 :]
                    if payload == b"[DONE]":
                        return
                    yield time.perf_counter() - started, json.loads(payload)
    finally:
        writer.close()


async def chat_turn(port: int, token: str, words: int, steps: int = 1, pause_ms: int = 0) -> Turn:
    message = {
        "id": uuid.uuid4().hex,
        "role": "user",
        "parts": [{"type": "text", "text": _prompt(words, steps, pause_ms)}],
    }
    body = json.dumps({"id": str(uuid.uuid4()), "messages": [message], "trigger": "submit-message"}).encode()
    turn = Turn(first_delta=None, total=0.0)
    started = time.perf_counter()
    async for at, chunk in stream(port, token, "POST", "/api/chat", body):
        if chunk is None:
            if at != 200:
                raise RuntimeError(f"chat answered {at}")
            continue
        turn.chunks.append(chunk)
        if chunk["type"] == "text-delta" and turn.first_delta is None:
            turn.first_delta = at
    turn.total = time.perf_counter() - started
    kinds = [chunk["type"] for chunk in turn.chunks]
    if kinds.count("text-delta") != words or kinds[-1] != "finish" or "error" in kinds:
        raise RuntimeError(f"an incomplete turn: {kinds[-3:]}")
    return turn


async def throughput(port: int, token: str, concurrency: int, turns: int) -> float:
    remaining = [turns]

    async def user() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await chat_turn(port, token, 20)

    started = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    return turns / (time.perf_counter() - started)


class Server:
    def __init__(self, mode: str, admin_url: str, jwks_path: str, workdir: Path, name: str) -> None:
        self.mode = mode
        self.port = free_port()
        self.log = (workdir / f"{name}.log").open("w+b")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")])}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.durable_turns",
                "serve",
                mode,
                str(self.port),
                admin_url,
                jwks_path,
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    async def ready(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.mode} server exited: {self.output()}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.1)
        raise RuntimeError(f"the {self.mode} server did not start: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


async def takeover(
    admin_url: str, jwks_path: str, token: str, workdir: Path, runs: int
) -> list[tuple[float, float]]:
    """(kill → the live worker streams the turn on, kill → the turn finished) per run, in seconds."""
    times: list[tuple[float, float]] = []
    survivor = Server("durable", admin_url, jwks_path, workdir, "takeover-live")
    await survivor.ready()
    try:
        for index in range(runs):
            victim = Server("durable", admin_url, jwks_path, workdir, f"takeover-{index}")
            await victim.ready()
            chat_id = str(uuid.uuid4())
            message = {
                "id": uuid.uuid4().hex,
                "role": "user",
                "parts": [{"type": "text", "text": _prompt(60, 1, 40)}],
            }
            body = json.dumps({"id": chat_id, "messages": [message], "trigger": "submit-message"}).encode()
            deltas = 0
            async for _, chunk in stream(victim.port, token, "POST", "/api/chat", body):
                if chunk is not None and chunk["type"] == "text-delta":
                    deltas += 1
                    if deltas == 10:
                        break
            victim.process.send_signal(signal.SIGKILL)
            killed = time.perf_counter()
            victim.stop()
            # Any live worker of the database may take it over; the victim's words name its process.
            victim_mark = f".{victim.process.pid} "
            resumed: float | None = None
            finished = False
            path = f"/api/chat/{chat_id}/stream?resetStep=1"
            while not finished:
                async for _, chunk in stream(survivor.port, token, "GET", path):
                    if chunk is None:
                        continue
                    if chunk["type"] == "text-delta" and not chunk["delta"].endswith(victim_mark):
                        resumed = resumed or time.perf_counter() - killed
                    finished = finished or (chunk["type"] == "finish" and resumed is not None)
                if time.perf_counter() - killed > 60:
                    raise RuntimeError(f"no take-over within 60 s: {survivor.output()}")
                if not finished:
                    await asyncio.sleep(0.05)
            assert resumed is not None
            times.append((resumed, time.perf_counter() - killed))
    finally:
        survivor.stop()
    return times


async def follower(port: int, token: str, conversation: str) -> int:
    """Resume the conversation's turn and read it to its end; the answer's status (204 and 404 wait and
    ask again: the conversation or its turn is not there yet)."""
    path = f"/api/chat/{conversation}/stream"
    while True:
        answered = 0
        async with contextlib.aclosing(stream(port, token, "GET", path)) as read:
            async for at, chunk in read:
                if chunk is None:
                    answered = int(at)
        if answered not in (204, 404):
            return answered
        await asyncio.sleep(0.02)


async def beside_followers(port: int, token: str, followers: int, turns: int) -> tuple[list[float], int]:
    """First text deltas of `turns` turns at c=1 while a long turn of another conversation is followed by
    `followers` resumed streams, and how many of those were refused (429)."""
    conversation = str(uuid.uuid4())
    text = _prompt(4000, 0, 5)  # 20 s at most: stopped once the turns beside it are measured
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
    body = json.dumps({"id": conversation, "messages": [message], "trigger": "submit-message"}).encode()

    async def long_turn() -> None:
        async for _ in stream(port, token, "POST", "/api/chat", body):
            pass

    running = asyncio.ensure_future(long_turn())
    streams = [asyncio.ensure_future(follower(port, token, conversation)) for _ in range(followers)]
    await asyncio.sleep(0.5)  # the followers joined (or were refused)
    firsts = []
    for _ in range(turns):
        turn = await chat_turn(port, token, 20, steps=0)
        assert turn.first_delta is not None
        firsts.append(turn.first_delta)
    async for _ in stream(port, token, "POST", f"/api/chat/{conversation}/stop"):
        pass
    await running
    statuses = await asyncio.gather(*streams)
    if set(statuses) - {200, 429}:
        raise RuntimeError(f"a follower was answered {sorted(set(statuses) - {200, 429})}")
    return firsts, statuses.count(429)


def _ms(values: list[float], fraction: float) -> str:
    return f"{percentile(values, fraction) * 1000:.1f}"


async def measure(rounds: int, turns: int, takeovers: int, followers: int = 200) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="bench-durable-"))
    postgres = BenchPostgres(workdir)
    project = signing_project()
    jwks_path = workdir / "jwks.json"
    jwks_path.write_text(json.dumps(project.jwks))
    token = project.token
    urls = {mode: postgres.create_database(f"durable_bench_{mode}") for mode in MODES}
    servers: dict[str, Server] = {}
    rates: dict[tuple[str, int], list[float]] = {}
    firsts: dict[str, list[float]] = {mode: [] for mode in MODES}
    text_firsts: dict[str, list[float]] = {mode: [] for mode in MODES}
    loops: dict[str, list[float]] = {mode: [] for mode in MODES}
    per_turn: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    follower_counts = sorted({0, 10, followers}) if followers else []
    beside: dict[int, list[float]] = {count: [] for count in follower_counts}
    refused: dict[int, int] = dict.fromkeys(follower_counts, 0)
    try:
        for mode in MODES:
            # One after the other: the roles the migrations create are shared by the cluster's databases.
            servers[mode] = Server(mode, urls[mode], str(jwks_path), workdir, mode)
            await servers[mode].ready()
        for mode in MODES:  # warm-up
            for _ in range(5):
                await chat_turn(servers[mode].port, token, 20)
        for round_index in range(rounds):
            order = MODES if round_index % 2 == 0 else MODES[::-1]
            for mode in order:
                port = servers[mode].port
                before = postgres.counters(f"durable_bench_{mode}")
                for _ in range(turns // 2):
                    turn = await chat_turn(port, token, 20)
                    assert turn.first_delta is not None
                    firsts[mode].append(turn.first_delta)
                after = postgres.counters(f"durable_bench_{mode}")
                for _ in range(turns // 2):
                    text_turn = await chat_turn(port, token, 20, steps=0)
                    assert text_turn.first_delta is not None
                    text_firsts[mode].append(text_turn.first_delta)
                counted = after - before
                per_turn[mode].append((counted.statements / (turns // 2), counted.wal_bytes / (turns // 2)))
                for concurrency in (1, 16, 32):
                    rates.setdefault((mode, concurrency), []).append(
                        await throughput(port, token, concurrency, turns)
                    )
                for _ in range(5):
                    loops[mode].append((await chat_turn(port, token, 1, steps=10)).total)
            for count in follower_counts if round_index % 2 == 0 else follower_counts[::-1]:
                firsts_beside, refusals = await beside_followers(servers["today"].port, token, count, turns)
                beside[count] += firsts_beside
                refused[count] += refusals
        takeover_times = (
            await takeover(urls["durable"], str(jwks_path), token, workdir, takeovers) if takeovers else []
        )
    finally:
        for server in servers.values():
            server.stop()
        postgres.close()
    lines = [
        "| figure | today | durable | durable / today |",
        "|---|---|---|---|",
    ]
    for concurrency in (1, 16, 32):
        today, durable = (statistics.median(rates[(mode, concurrency)]) for mode in MODES)
        lines.append(f"| turns/s, c={concurrency} | {today:.1f} | {durable:.1f} | {durable / today:.2f}× |")
    for label, fraction in (("p50", 0.5), ("p99", 0.99)):
        today_ms, durable_ms = (_ms(firsts[mode], fraction) for mode in MODES)
        lines.append(
            f"| first text delta {label}, c=1 (ms) | {today_ms} | {durable_ms} | "
            f"+{float(durable_ms) - float(today_ms):.1f} ms |"
        )
    for label, fraction in (("p50", 0.5), ("p99", 0.99)):
        today_ms, durable_ms = (_ms(text_firsts[mode], fraction) for mode in MODES)
        lines.append(
            f"| first text delta {label}, c=1, no tool call (ms) | {today_ms} | {durable_ms} | "
            f"+{float(durable_ms) - float(today_ms):.1f} ms |"
        )
    for label, index in (("statements per turn", 0), ("WAL bytes per turn", 1)):
        today, durable = (statistics.median(value[index] for value in per_turn[mode]) for mode in MODES)
        lines.append(f"| {label} | {today:.1f} | {durable:.1f} | {durable / today:.2f}× |")
    today_ms, durable_ms = (_ms(loops[mode], 0.5) for mode in MODES)
    ratio = float(durable_ms) / float(today_ms)
    lines.append(f"| 10-step tool loop p50 (ms) | {today_ms} | {durable_ms} | {ratio:.2f}× |")
    if takeover_times:
        resumed = [first for first, _ in takeover_times]
        finished = [last for _, last in takeover_times]
        lines.append(
            f"| take-over after SIGKILL: streaming again, median / max (s) | | "
            f"{statistics.median(resumed):.2f} / {max(resumed):.2f} | |"
        )
        lines.append(
            f"| take-over after SIGKILL: turn finished, median / max (s) | | "
            f"{statistics.median(finished):.2f} / {max(finished):.2f} | |"
        )
    if follower_counts:
        lines += ["", "| streams following another turn (today) | first text delta p50, c=1 (ms) | vs none |"]
        lines.append("|---|---|---|")
        alone = percentile(beside[0], 0.5)
        for count in follower_counts:
            p50 = percentile(beside[count], 0.5)
            served = f" ({refused[count] // rounds} refused, 429)" if refused[count] else ""
            lines.append(f"| {count}{served} | {p50 * 1000:.1f} | {p50 / alone:.2f}× |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        mode, port, admin_url, jwks_path = argv[1:]
        asyncio.run(serve(mode, int(port), admin_url, jwks_path))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.durable_turns", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turns", type=int, default=48)
    parser.add_argument("--takeovers", type=int, default=5)
    parser.add_argument("--followers", type=int, default=200, help="0 leaves the followers' figure out")
    parser.add_argument("--follower-cap", type=int, default=0, help="lift the followers' caps to this")
    arguments = parser.parse_args(argv)
    if arguments.follower_cap:
        os.environ[FOLLOWER_CAP] = str(arguments.follower_cap)  # read by the servers it starts
    figures = measure(arguments.rounds, arguments.turns, arguments.takeovers, arguments.followers)
    print(asyncio.run(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
