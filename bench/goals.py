"""The issue's other goals for bastion, full stack, each bounded in time:

- `tool-loop`: a turn of 10 model steps, each calling `lookup` through its operation claim (one round
  trip each), between the claim and the save, in process on a conversation created beforehand. Wall
  time per turn, median and p90 (goal: under 200 ms).
- `memory`: resident memory per open stream. One server process (`bench.systems.bastion`'s route with
  a model that, after the tool call, waits for `POST /release`) takes 1 000 concurrent chats, each on
  its own connection; once every stream has delivered its tool result and is held open, the server's
  VmRSS is read from /proc and compared with its VmRSS after a warm-up. Then the streams are released
  and each must finish verified (goal: under 100 KB per open stream).

Token verification with a warm key cache is `bench/auth_verify.py`; p99/p50 at c=1 is in the harness.

    bench/.venv/bin/python -m bench.goals [--streams 1000] [--loops 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bastion.auth import SupabaseEnv, TokenVerifier
from bastion.stores import PostgresStore, StoreIdentity
from bastion.worker import RequestContext, Route, create_agent_worker
from bench.client import HttpConnection, HttpRequest
from bench.postgres import BenchPostgres
from bench.protocol import CHAT_PATH, chat_request, verify_turn
from bench.script import TOOL_ARGS, TOOL_NAME, requested_words, word
from bench.servers import free_port
from bench.systems import bastion as system
from bench.tokens import SUPABASE_URL, signing_project
from bench.turn_profile import Clock, profiled_turn

TOOL_STEPS = 10
HELD_WORDS = 20
HOLD = "hold: "
DEADLINE_SECONDS = 240.0


def _prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        part.content
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart) and isinstance(part.content, str)
    ]


def _returns_since_prompt(messages: list[ModelMessage]) -> int:
    returns = 0
    for message in reversed(messages):
        if isinstance(message, ModelRequest):
            if any(isinstance(part, UserPromptPart) for part in message.parts):
                break
            returns += sum(isinstance(part, ToolReturnPart) for part in message.parts)
    return returns


def tool_loop_model(steps: int = TOOL_STEPS) -> FunctionModel:
    """Calls `lookup` once per step for `steps` steps, then answers with one word."""

    async def script(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        done = _returns_since_prompt(messages)
        if done >= steps:
            yield "done"
            return
        call_id = f"call-{len(_prompts(messages))}-{done}"
        yield {0: DeltaToolCall(name=TOOL_NAME, json_args=json.dumps(TOOL_ARGS), tool_call_id=call_id)}

    return FunctionModel(stream_function=script)


def held_model(release: asyncio.Event) -> FunctionModel:
    """The bench script, except that a prompt starting with `hold: ` waits for `release` after the tool."""

    async def script(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        prompts = _prompts(messages)
        if _returns_since_prompt(messages) == 0:
            call_id = f"call-{len(prompts)}"
            yield {0: DeltaToolCall(name=TOOL_NAME, json_args=json.dumps(TOOL_ARGS), tool_call_id=call_id)}
            return
        if prompts[-1].startswith(HOLD):
            await release.wait()
        for index in range(requested_words(prompts[-1])):
            yield word(index)

    return FunctionModel(stream_function=script)


async def measure_tool_loop(postgres: BenchPostgres, *, loops: int) -> list[str]:
    admin_url = postgres.create_database("bench_goal_tools")
    project = signing_project()
    verifier = TokenVerifier(SupabaseEnv(url=SUPABASE_URL, jwks=project.jwks))
    app_url = await system.prepare_database(admin_url)
    store = await PostgresStore.open(app_url, min_size=1, max_size=1)
    turns = system.ChatTurns(
        store=store,
        persistence=store.persistence(),
        agent=system.bench_agent(max_steps=TOOL_STEPS + 1),
        model=tool_loop_model(),
    )
    identity = StoreIdentity.from_principal(await verifier.verify(project.token))
    no_trips = SimpleNamespace(round_trips=0)
    walls: list[float] = []
    try:
        for index in range(loops + 3):
            chat_id = (await store.create_conversation(identity)).id
            history = [{"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": "go"}]}]
            started = time.perf_counter()
            message = await profiled_turn(
                turns,
                verifier,
                project.token,
                chat_id,
                history,
                Clock(no_trips),
                words=None,  # type: ignore[arg-type]
            )
            elapsed = time.perf_counter() - started
            tools = [part for part in message["parts"] if part.get("type") == f"tool-{TOOL_NAME}"]
            if len(tools) != TOOL_STEPS or any(part["state"] != "output-available" for part in tools):
                raise RuntimeError("The tool loop did not run every step.")
            if index >= 3:  # the first turns warm the connection's prepared statements
                walls.append(elapsed * 1000)
    finally:
        await store.close()
    walls.sort()
    p90 = walls[min(len(walls) - 1, int(len(walls) * 0.9))]
    return [
        f"{TOOL_STEPS}-step tool loop, each step's operation claimed in Postgres (claim + {TOOL_STEPS} tool "
        f"claims + save = {2 + TOOL_STEPS + 1} round trips), {len(walls)} turns: "
        f"median {statistics.median(walls):.1f} ms, p90 {p90:.1f} ms, max {walls[-1]:.1f} ms"
    ]


def create_held_app(admin_url: str, jwks: dict[str, Any]) -> Any:
    """`bench.systems.bastion`'s route with the held model, and `POST /release` to let streams finish."""
    release = asyncio.Event()
    opened: list[system.ChatTurns] = []

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        turns = await system.open_turns(admin_url)
        turns.model = held_model(release)
        opened.append(turns)
        try:
            yield
        finally:
            await turns.store.close()

    async def chat(request: Request, context: RequestContext) -> Response:
        return await opened[0].chat(request, context)

    async def release_all(request: Request, context: RequestContext) -> Response:
        release.set()
        return JSONResponse({"released": True})

    return create_agent_worker(
        env=SupabaseEnv(url=SUPABASE_URL, jwks=jwks),
        routes=[
            Route(method="POST", path=CHAT_PATH, auth="user", handler=chat),
            Route(method="POST", path="/release", auth="none", handler=release_all),
        ],
        lifespan=lifespan,
    )


def serve(port: int, config_path: str) -> None:
    import uvicorn

    config = json.loads(Path(config_path).read_text())
    app = create_held_app(config["admin_url"], config["jwks"])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")


def resident_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("No VmRSS for the server process.")


def _hold_request(port: int, token: str) -> bytes:
    text = HOLD + f"Look up alpha, then write {HELD_WORDS} words."
    message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}
    body = json.dumps({"id": str(uuid.uuid4()), "messages": [message], "trigger": "submit-message"}).encode()
    head = (
        f"POST {CHAT_PATH} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {token}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class HeldStream:
    """One chat held open: reads until its tool result arrived, later to the end of the stream."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.held = asyncio.Event()

    async def run(self, port: int, token: str) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_hold_request(port, token))
            await writer.drain()
            while chunk := await reader.read(65536):
                self.received.extend(chunk)
                if not self.held.is_set() and b"tool-output-available" in self.received:
                    self.held.set()
        finally:
            writer.close()

    def verified(self) -> bool:
        body = bytes(self.received)
        return (
            body.startswith(b"HTTP/1.1 200")
            and body.count(b'"type":"text-delta"') == HELD_WORDS
            and b'"type":"error"' not in body
            and b"data: [DONE]" in body
        )


async def measure_memory(postgres: BenchPostgres, *, streams: int, workdir: Path) -> list[str]:
    admin_url = postgres.create_database("bench_goal_memory")
    project = signing_project()
    config_path = workdir / "held.json"
    config_path.write_text(json.dumps({"admin_url": admin_url, "jwks": project.jwks}))
    port = free_port()
    repository = Path(__file__).resolve().parent.parent
    log = (workdir / "held.log").open("w+b")
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.goals", "serve", str(port), str(config_path)],
        cwd=repository,
        env={**os.environ, "PYTHONPATH": str(repository)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        await _wait_listening(port, server)
        connection = HttpConnection(port)
        for _ in range(40):  # warm-up: released turns, so the baseline holds the process's steady state
            words = 20
            messages = [
                {
                    "id": uuid.uuid4().hex,
                    "role": "user",
                    "parts": [{"type": "text", "text": f"Look up alpha, then write {words} words."}],
                }
            ]
            headers = {"authorization": f"Bearer {project.token}"}
            response = await connection.request(chat_request(str(uuid.uuid4()), messages, headers=headers))
            verify_turn(response, words=words)
        await connection.close()
        await asyncio.sleep(1.0)
        baseline = resident_kb(server.pid)
        held = [HeldStream() for _ in range(streams)]
        tasks = [asyncio.create_task(stream.run(port, project.token)) for stream in held]
        started = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(stream.held.wait() for stream in held)), DEADLINE_SECONDS)
        opened_seconds = time.perf_counter() - started
        await asyncio.sleep(1.0)
        open_kb = resident_kb(server.pid)
        connection = HttpConnection(port)
        await connection.request(HttpRequest(path="/release", body=b"{}"))
        await connection.close()
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_SECONDS)
        failed = sum(not stream.verified() for stream in held)
        after_kb = resident_kb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    per_stream = (open_kb - baseline) / streams
    return [
        f"{streams} concurrent streams held open after their tool call "
        f"(all opened in {opened_seconds:.1f} s): "
        f"server RSS {baseline / 1024:.1f} MiB after warm-up, {open_kb / 1024:.1f} MiB with the streams "
        f"open, {after_kb / 1024:.1f} MiB after they finished: {per_stream:.1f} KiB per open stream; "
        f"{streams - failed} of {streams} streams finished verified"
    ]


async def _wait_listening(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("The held server exited during startup.")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError("The held server did not listen in time.")


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        serve(int(argv[1]), argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--loops", type=int, default=30)
    parser.add_argument("--only", choices=["tool-loop", "memory"], default=None)
    arguments = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bastion-goals-"))
    postgres = BenchPostgres(workdir)
    lines: list[str] = []
    try:
        if arguments.only in (None, "tool-loop"):
            lines += asyncio.run(measure_tool_loop(postgres, loops=arguments.loops))
        if arguments.only in (None, "memory"):
            lines += asyncio.run(measure_memory(postgres, streams=arguments.streams, workdir=workdir))
    finally:
        postgres.close()
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
