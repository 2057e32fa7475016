"""The stages a streamed text delta passes in a bastion turn, in CPU µs per delta, in one process.

1. model event → UI chunk: bastion's loop over the scripted pydantic-ai `FunctionModel` (the model's
   own generator included), from (CPU of a 200-word turn − CPU of a 20-word turn) / 180, watching a
   cancel event as both routes do (the request's, or the stop signal's), and without one;
2. wire JSON: the bytes the client gets, as the route makes them: `text_delta_json(chunk)` from the
   delta's two strings (where bastion has it), else `to_client_json(chunk)` (encode, then parse);
3. assembly: the saved message's text, as the route applies a delta: `apply_text_delta(id, delta)`
   (where bastion has it), else `UIMessageAssembler.apply(parsed)` (validation, then the text);
4. log: `ChunkLog.add(parsed)`, then the log's write serializing its batches as psycopg's `Jsonb`
   does (`json.dumps` of the batch), at the batch sizes `--batches` gives (no database round trip);
5. SSE bytes: the event's framing, `_EventChannel.send` and the join of a write's batch.

Stages 2–5 run over the 200 text-delta chunks of a real turn, each stage alone, many times; medians.
The hand-wired route pays 1, 2, 3 and 5; `chat_routes` adds 4.

6. the whole stream route in process: `create_agent_stream_response` served as ASGI to a `send` that
   keeps the bytes (no HTTP server, no database), without a log (the hand-wired turn) and with a
   `ChunkLog` as `chat_routes` uses it (carried: written by the turn's close), from
   (CPU₂₀₀ − CPU₂₀) / 180, with the body writes per turn. Ratios are to stage 1a measured in the run.

    bench/.venv/bin/python -m bench.delta_stages [--turns 30] [--batches 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from bastion import _client_json
from bastion._ui_assembly import UIMessageAssembler, to_client_json
from bastion.auth import Principal
from bastion.chat.stream_response import _EventChannel
from bastion.stores.live import ChunkBatch, ChunkLog
from bench.protocol import user_message
from bench.systems._pydantic_ai_model import scripted_model
from bench.systems.bastion import bench_agent

WORDS = 200
SHORT = 20


def _principal() -> Principal:
    return Principal(
        id="7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01",
        role="authenticated",
        email=None,
        is_anonymous=False,
        aal=None,
        session_id=None,
        tenant_id=None,
        roles=(),
        claims={},
    )


async def _turn_chunks(
    agent: Any, model: Any, words: int, *, cancel: asyncio.Event | None = None
) -> tuple[list[dict[str, Any]], int]:
    """The loop's chunks of one turn and the CPU ns it took to produce them; with `cancel`, the loop
    watches that event as both routes make it (the request's or the stop signal's)."""
    session = await agent.prepare(context=_principal(), cancel=cancel)
    started = time.thread_time_ns()
    result = await session.stream(model=model, messages=[user_message(words)])
    chunks = [chunk async for chunk in result]
    spent = time.thread_time_ns() - started
    await session.close()
    return chunks, spent


async def _model_stream_ns(model: Any, words: int) -> int:
    """CPU ns of pydantic-ai's stream of the script's text reply alone (`direct.model_request_stream`)."""
    from pydantic_ai.direct import model_request_stream
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    prompt = user_message(words)["parts"][0]["text"]
    messages = [
        ModelRequest(parts=[UserPromptPart(prompt)]),
        ModelResponse(parts=[ToolCallPart("lookup", {"key": "alpha"}, tool_call_id="call-1")]),
        ModelRequest(parts=[ToolReturnPart("lookup", {"found": True}, tool_call_id="call-1")]),
    ]
    started = time.thread_time_ns()
    async with model_request_stream(model, messages) as response:
        async for _ in response:
            pass
    return time.thread_time_ns() - started


async def _route_turn(agent: Any, model: Any, words: int, *, logged: bool) -> tuple[int, int]:
    """CPU ns of one turn served as the UI message stream to an in-memory ASGI `send`, and its writes."""
    from bastion.chat.stream_response import create_agent_stream_response

    started = time.thread_time_ns()
    cancel = asyncio.Event()
    session = await agent.prepare(context=_principal(), cancel=cancel)
    messages = [user_message(words)]
    result = await session.stream(model=model, messages=messages)
    log: ChunkLog | None = None
    if logged:

        async def sink(batch: ChunkBatch) -> bool:
            json.dumps(list(batch.chunks))
            return False

        log = ChunkLog(sink, interval=3600)
        log.carried = True
    response = create_agent_stream_response(result, original_messages=messages, log=log)
    writes = 0
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal writes
        if message["type"] == "http.response.body":
            writes += 1
            if not message.get("more_body"):
                done.set()

    await response({"type": "http"}, receive, send)
    await session.close()
    return time.thread_time_ns() - started, writes


def _per_delta(run: Callable[[], None], deltas: int, repeat: int) -> float:
    """Median CPU µs per delta of `run()` (which handles `deltas` deltas)."""
    samples = []
    for _ in range(repeat):
        started = time.thread_time_ns()
        run()
        samples.append((time.thread_time_ns() - started) / 1000 / deltas)
    return statistics.median(samples)


async def measure(turns: int, batches: int) -> list[str]:
    agent, model = bench_agent(), scripted_model()
    for _ in range(5):  # warm-up
        await _turn_chunks(agent, model, WORDS)
    full = [await _turn_chunks(agent, model, WORDS) for _ in range(turns)]
    short = [await _turn_chunks(agent, model, SHORT) for _ in range(turns)]
    watched_full = [await _turn_chunks(agent, model, WORDS, cancel=asyncio.Event()) for _ in range(turns)]
    watched_short = [await _turn_chunks(agent, model, SHORT, cancel=asyncio.Event()) for _ in range(turns)]
    watched_us = (
        (statistics.median(ns for _, ns in watched_full) - statistics.median(ns for _, ns in watched_short))
        / 1000
        / (WORDS - SHORT)
    )
    model_full = [await _model_stream_ns(model, WORDS) for _ in range(turns)]
    model_short = [await _model_stream_ns(model, SHORT) for _ in range(turns)]
    model_us = (statistics.median(model_full) - statistics.median(model_short)) / 1000 / (WORDS - SHORT)
    loop_us = (
        (statistics.median(ns for _, ns in full) - statistics.median(ns for _, ns in short))
        / 1000
        / (WORDS - SHORT)
    )
    chunks = full[0][0]
    deltas = [chunk for chunk in chunks if chunk["type"] == "text-delta"]
    parsed = [to_client_json(chunk)[1] for chunk in deltas]
    wires = [to_client_json(chunk)[0] for chunk in deltas]
    prefix = [chunk for chunk in chunks if chunk["type"] != "text-delta"][:8]

    direct = getattr(_client_json, "text_delta_json", None)  # absent before text deltas had it

    def wire_json() -> None:
        for chunk in deltas:
            if direct is None or direct(chunk) is None:
                to_client_json(chunk)

    def assembly() -> None:
        assembler = UIMessageAssembler({"id": "m", "role": "assistant", "parts": []})
        for chunk in prefix:  # the tool call and the text part's start, as in a turn
            assembler.apply(to_client_json(chunk)[1])
        text_delta = getattr(assembler, "apply_text_delta", None)
        started = time.thread_time_ns()
        for chunk in parsed:
            if text_delta is None:
                assembler.apply(chunk)
            else:
                text_delta(chunk["id"], chunk["delta"])
        assembly.spent += time.thread_time_ns() - started  # type: ignore[attr-defined]

    assembly.spent = 0  # type: ignore[attr-defined]

    written: list[ChunkBatch] = []

    async def sink(batch: ChunkBatch) -> bool:
        written.append(batch)
        return False

    loop = asyncio.get_running_loop()

    def log_add() -> None:
        log = ChunkLog(sink, interval=3600)
        for chunk in parsed:
            log.add(chunk)
        loop.call_soon(log._task.cancel) if log._task is not None else None  # never writes here

    size = max(1, len(parsed) // batches)
    groups = [parsed[index : index + size] for index in range(0, len(parsed), size)]

    def log_serialize() -> None:
        for group in groups:
            json.dumps(list(group))

    def sse() -> None:
        channel = _EventChannel()
        for index, wire in enumerate(wires):
            channel.send(b"data: " + wire + b"\n\n")
            if index % 4 == 3:  # a write carries what arrived while the previous one was in flight
                b"".join(channel._pending)
                channel._pending.clear()

    routes: dict[str, tuple[float, float]] = {}
    for label, logged in (("hand-wired (no log)", False), ("`chat_routes` (carried ChunkLog)", True)):
        for _ in range(3):
            await _route_turn(agent, model, WORDS, logged=logged)
        long_runs = [await _route_turn(agent, model, WORDS, logged=logged) for _ in range(turns)]
        short_runs = [await _route_turn(agent, model, SHORT, logged=logged) for _ in range(turns)]
        per_delta = (
            (statistics.median(ns for ns, _ in long_runs) - statistics.median(ns for ns, _ in short_runs))
            / 1000
            / (WORDS - SHORT)
        )
        routes[label] = (per_delta, statistics.median(writes for _, writes in long_runs))

    repeat = 200
    figures = {
        "1. model event → UI chunk (loop + scripted model), with a cancel event watched": watched_us,
        "1b. of which without a cancel event (`cancel=None`)": loop_us,
        "1a. of which pydantic-ai's model stream alone (scripted model → events)": model_us,
        "2. wire JSON (text_delta_json, else to_client_json)": _per_delta(wire_json, len(deltas), repeat),
    }
    assembly_samples = []
    for _ in range(repeat):
        assembly.spent = 0  # type: ignore[attr-defined]
        assembly()
        assembly_samples.append(assembly.spent / 1000 / len(parsed))  # type: ignore[attr-defined]
    figures["3. assembly (apply_text_delta, else UIMessageAssembler.apply)"] = statistics.median(
        assembly_samples
    )
    figures["4a. log: ChunkLog.add"] = _per_delta(log_add, len(parsed), repeat)
    figures[f"4b. log: batch serialized for Jsonb ({len(groups)} batches)"] = _per_delta(
        log_serialize, len(parsed), repeat
    )
    figures["5. SSE bytes (framing, channel send, write's join)"] = _per_delta(sse, len(wires), repeat)
    await asyncio.sleep(0)
    lines = [
        f"CPU per text delta by stage, µs (medians; {turns} turns for stage 1, {repeat} passes over "
        f"{len(deltas)} deltas for the others)",
        "",
        "| stage | µs per delta |",
        "|---|---|",
    ]
    lines += [f"| {label} | {value:.1f} |" for label, value in figures.items()]
    hand = sum(v for k, v in figures.items() if not k.startswith(("4", "1a", "1b")))
    lines += [
        f"| hand-wired route (1+2+3+5) | {hand:.1f} |",
        f"| `chat_routes` (1+2+3+4+5) | {hand + sum(v for k, v in figures.items() if k[0] == '4'):.1f} |",
    ]
    lines += [
        "",
        f"The whole stream route in process, per text delta (ratio to 1a, pydantic-ai's model stream alone, "
        f"{model_us:.1f} µs in this run)",
        "",
        "| route | µs per delta | ÷ 1a | body writes per 200-word turn |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {label} | {us:.1f} | {us / model_us:.2f} | {writes:.0f} |"
        for label, (us, writes) in routes.items()
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--batches", type=int, default=12, help="log writes per turn")
    arguments = parser.parse_args()
    print("\n".join(asyncio.run(measure(arguments.turns, arguments.batches))))


if __name__ == "__main__":
    main()
