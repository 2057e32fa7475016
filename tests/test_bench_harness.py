"""The peer benchmark's harness: its verifier refuses broken turns, its figures and report are right,
the limit system runs end to end through it, bastion's full stack serves verified turns that it
claims and saves (on the tests' embedded Postgres), and the systems of issue 25 (chat_routes, durable,
the assistant, the DBOS peers) run through it. Needs only bastion's own dependencies (the Agents SDK
on DBOS runs where bench/setup installed it)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import re
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from bench.client import HttpResponse
from bench.harness import Batch, Cell, Options, Run, run_benchmark, run_cell
from bench.protocol import TurnVerificationError, verify_turn
from bench.report import BEGIN, END, render, write_report
from bench.servers import SystemServer
from bench.stats import Spread, cell_figures, cpu_split, percentile
from bench.systems import ClientConfig, ServerConfig, load_system
from bench.systems.limit import turn_events
from bench.tokens import SUPABASE_URL, signing_project
from tests.conftest import MigratedDatabase

WORDS = 5
STREAM_HEADERS = {"content-type": "text/event-stream"}


def events() -> list[bytes]:
    return list(turn_events(WORDS, 1))


def response(stream: list[bytes]) -> HttpResponse:
    return HttpResponse(status=200, headers=STREAM_HEADERS, body=b"".join(stream))


def chunk_type(event: bytes) -> str | None:
    payload = event.decode()[len("data: ") :].strip()
    return None if payload == "[DONE]" else str(json.loads(payload)["type"])


def delta_indexes(stream: list[bytes]) -> list[int]:
    return [index for index, event in enumerate(stream) if chunk_type(event) == "text-delta"]


def test_the_verifier_accepts_a_complete_turn_and_assembles_its_message() -> None:
    verified = verify_turn(response(events()), words=WORDS)
    assert verified.deltas == WORDS
    tool_part, text_part = verified.message["parts"][1], verified.message["parts"][3]
    assert tool_part["state"] == "output-available" and tool_part["output"]["found"] is True
    assert text_part["text"] == "word0 word1 word2 word3 word4 "


def test_the_verifier_refuses_a_missing_delta() -> None:
    stream = events()
    del stream[delta_indexes(stream)[2]]
    with pytest.raises(TurnVerificationError, match="delta 2"):
        verify_turn(response(stream), words=WORDS)


def test_the_verifier_refuses_a_turn_short_of_deltas_at_the_end() -> None:
    stream = events()
    del stream[delta_indexes(stream)[-1]]
    with pytest.raises(TurnVerificationError, match="4 text deltas, expected 5"):
        verify_turn(response(stream), words=WORDS)


def test_the_verifier_refuses_out_of_order_deltas() -> None:
    stream = events()
    first, second = delta_indexes(stream)[1:3]
    stream[first], stream[second] = stream[second], stream[first]
    with pytest.raises(TurnVerificationError, match="delta 1"):
        verify_turn(response(stream), words=WORDS)


def test_the_verifier_refuses_a_missing_tool_result() -> None:
    stream = [event for event in events() if chunk_type(event) != "tool-output-available"]
    with pytest.raises(TurnVerificationError, match="text before the tool result"):
        verify_turn(response(stream), words=WORDS)


def test_the_verifier_refuses_a_stream_without_done() -> None:
    stream = events()[:-1]
    with pytest.raises(TurnVerificationError, match=r"\[DONE\]"):
        verify_turn(response(stream), words=WORDS)


def test_the_verifier_refuses_an_error_chunk() -> None:
    stream = events()
    stream.insert(-2, b'data: {"type":"error","errorText":"boom"}\n\n')
    with pytest.raises(TurnVerificationError, match="error chunk"):
        verify_turn(response(stream), words=WORDS)


def test_the_verifier_refuses_an_error_status() -> None:
    failed = HttpResponse(status=500, headers={"content-type": "application/json"}, body=b"{}")
    with pytest.raises(TurnVerificationError, match="status 500"):
        verify_turn(failed, words=WORDS)


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0


def test_a_spread_shows_the_median_and_the_range_of_the_rounds() -> None:
    spread = Spread.of([12.0, 10.0, 11.0])
    assert spread is not None and spread.format() == "11.0 (10.0–12.0)"
    assert Spread.of([]) is None


def test_the_cpu_split_separates_fixed_cost_from_the_cost_per_delta() -> None:
    full = cell_figures([batch(turns=10, cpu_seconds=0.30)])  # 30 ms per 200-word turn
    short = cell_figures([batch(turns=10, cpu_seconds=0.12, words=20)])  # 12 ms per 20-word turn
    split = cpu_split(full, short, words=200, short_words=20)
    assert split is not None
    assert split.per_delta_us == pytest.approx(100.0)
    assert split.fixed_ms == pytest.approx(10.0)


def batch(
    *, system: str = "s", turns: int = 10, cpu_seconds: float = 0.1, words: int = 200, failures: int = 0
) -> Batch:
    found = Batch(system, Cell("new", 1, words), round=1, turns=turns, deltas=turns * words)
    found.latencies = [0.01 * (index + 1) for index in range(turns)]
    found.wall_seconds = 1.0
    found.server_cpu_seconds = cpu_seconds
    found.failures = ["TurnVerificationError: the stream does not end with [DONE]"] * failures
    return found


def test_the_report_shows_a_failing_system_as_failing_not_as_fast() -> None:
    options = Options(
        systems=["fast", "broken"], rounds=1, concurrency=(1,), scenarios=("new",), calibration_words=0
    )
    batches = [batch(system="fast", turns=10), batch(system="broken", turns=30, failures=2)]
    run = Run(options, batches, {"fast": "peer", "broken": "subject"}, None)
    text = render(run, command="bench/run")
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert "FAILED (2 of 32)" in rows["| broken"]
    assert "10.0" in rows["| fast"]
    assert "- broken: TurnVerificationError" in text


def test_writing_the_report_keeps_the_text_around_the_generated_section(tmp_path: Path) -> None:
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(f"# Benchmarks\n\nIntro.\n\n{BEGIN}\nold\n{END}\n\n## Reading\n\nKept.\n")
    write_report(path, f"{BEGIN}\nnew\n{END}\n")
    text = path.read_text()
    assert "old" not in text and "new" in text
    assert text.startswith("# Benchmarks\n\nIntro.") and text.endswith("## Reading\n\nKept.\n")


def test_the_limit_runs_end_to_end_through_the_harness() -> None:
    options = Options(
        systems=["limit"],
        rounds=1,
        concurrency=(1,),
        scenarios=("new", "conversation"),
        min_turns=2,
        conversation_turns=2,
        calibration_words=0,
        warmup_turns=1,
    )
    run = run_benchmark(options)
    assert [(b.cell.scenario, b.turns, b.failures) for b in run.batches] == [
        ("new", 2, []),
        ("conversation", 2, []),
    ]
    assert all(b.deltas == 2 * 200 and b.server_cpu_seconds >= 0 for b in run.batches)
    assert "| limit | " in render(run, command="bench/run")


async def test_a_system_whose_turns_fail_verification_is_counted_as_failing(tmp_path: Path) -> None:
    limit = load_system("limit")
    config = ServerConfig(database_url=None, supabase_url="https://bench.supabase.co", jwks={})
    server = SystemServer("limit", config, tmp_path)
    try:
        server.wait_ready()
        wrong: Any = SimpleNamespace(
            build_request=limit.build_request,
            verify_stream=lambda response, words: verify_turn(response, words=words + 1),
        )
        failing = Batch("limit", Cell("new", 2, 3), round=1)
        options = Options(systems=["limit"], min_turns=4)
        await run_cell(
            wrong, server.port, failing.cell, ClientConfig(bearer_token=""), options=options, batch=failing
        )
    finally:
        server.stop()
    assert failing.turns == 0 and failing.latencies == []
    assert len(failing.failures) == 4 and "expected 4" in failing.failures[0]


def bastion_server(migrated_database: MigratedDatabase, tmp_path: Path) -> tuple[SystemServer, ClientConfig]:
    project = signing_project()
    config = ServerConfig(
        database_url=migrated_database.admin_dsn, supabase_url=SUPABASE_URL, jwks=project.jwks
    )
    server = SystemServer("bastion", config, tmp_path)
    server.wait_ready()
    return server, ClientConfig(bearer_token=project.token)


def admin_rows(migrated_database: MigratedDatabase, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(migrated_database.admin_dsn) as connection:
        return connection.execute(query).fetchall()


async def test_bastion_runs_conversations_through_its_claim_tool_claim_and_save(
    migrated_database: MigratedDatabase, tmp_path: Path
) -> None:
    bastion = load_system("bastion")
    server, client = bastion_server(migrated_database, tmp_path)
    chats: list[str] = []
    recording: Any = SimpleNamespace(
        build_request=lambda chat_id, messages, config: (
            chats.append(chat_id) or bastion.build_request(chat_id, messages, config)
        ),
        verify_stream=bastion.verify_stream,
    )
    try:
        batch = Batch("bastion", Cell("conversation", 1, WORDS), round=1)
        options = Options(systems=["bastion"], min_turns=3, conversation_turns=3)
        await run_cell(recording, server.port, batch.cell, client, options=options, batch=batch)
    finally:
        server.stop()
    assert batch.failures == [] and batch.turns == 3 and batch.deltas == 3 * WORDS
    chat_id = str(uuid.UUID(chats[0]))
    messages = admin_rows(
        migrated_database,
        f"select role from bastion.messages where conversation_id = '{chat_id}' order by seq",
    )
    assert [role for (role,) in messages] == ["user", "assistant"] * 3
    runs = admin_rows(
        migrated_database, f"select status from bastion.runs where conversation_id = '{chat_id}'"
    )
    assert sorted(status for (status,) in runs) == ["completed"] * 3
    tools = admin_rows(
        migrated_database,
        f"select tool_call_id, status from bastion.tool_executions where conversation_id = '{chat_id}'",
    )
    assert sorted(tools) == [("call-1", "completed"), ("call-2", "completed"), ("call-3", "completed")]


async def test_bastion_refuses_a_history_that_is_not_what_it_streamed(
    migrated_database: MigratedDatabase, tmp_path: Path
) -> None:
    bastion = load_system("bastion")
    server, client = bastion_server(migrated_database, tmp_path)

    def tampered(response: HttpResponse, *, words: int) -> Any:
        verified = bastion.verify_stream(response, words=words)
        verified.message["parts"][-1]["text"] = "something the server never said"
        return verified

    lying: Any = SimpleNamespace(build_request=bastion.build_request, verify_stream=tampered)
    try:
        batch = Batch("bastion", Cell("conversation", 1, WORDS), round=1)
        options = Options(systems=["bastion"], min_turns=2, conversation_turns=2)
        await run_cell(lying, server.port, batch.cell, client, options=options, batch=batch)
    finally:
        server.stop()
    assert batch.turns == 1
    assert len(batch.failures) == 1 and "status 409" in batch.failures[0]


def test_the_bastion_client_sends_the_token_and_the_whole_history() -> None:
    bastion = load_system("bastion")
    history = [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]
    request = bastion.build_request("c1", history, ClientConfig(bearer_token="token-1"))
    assert request.headers == {"authorization": "Bearer token-1"}
    assert json.loads(request.body) == {"id": "c1", "messages": history, "trigger": "submit-message"}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


# The systems issue 25 added; the Agents SDK on DBOS only where bench/setup installed its packages.
NEW_SYSTEMS = [
    "bastion-chat-routes",
    "bastion-durable",
    "assistant",
    "pydantic-ai-dbos",
    *(["agents-sdk-dbos"] if installed("dbos_openai_agents") else []),
]


def test_the_new_systems_serve_verified_turns_side_by_side_with_every_figure() -> None:
    """chat_routes, durable chat_routes, the assistant's defaults and the DBOS peers, each in its own
    server on one Postgres, run new conversations and conversations through the harness; the report
    has a figure of each kind for each (their form only: a few turns say nothing of their values)."""
    options = Options(
        systems=NEW_SYSTEMS,
        rounds=1,
        concurrency=(1,),
        scenarios=("new", "conversation"),
        min_turns=2,
        conversation_turns=2,
        words=WORDS,
        calibration_words=0,
        warmup_turns=1,
    )
    run = run_benchmark(options)
    by_system: dict[str, list[Batch]] = {}
    for found in run.batches:
        by_system.setdefault(found.system, []).append(found)
    assert sorted(by_system) == sorted(NEW_SYSTEMS)
    for name, batches in by_system.items():
        assert [(b.cell.scenario, b.failures) for b in batches] == [("new", []), ("conversation", [])], name
        for found in batches:
            assert found.turns == 2 and found.deltas == 2 * WORDS, name
            assert len(found.first_deltas) == 2 and all(
                0 < t <= max(found.latencies) for t in found.first_deltas
            )
            assert found.database is not None and found.database.statements > 0, name
            assert found.database.wal_bytes > 0, name
    text = render(run, command="bench/run")
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    for title in ("Time to the first text delta p50 / p99 (ms)", "Postgres statements per turn"):
        section = text.split(f"### {title}")[1].split("###")[0]
        for name in NEW_SYSTEMS:
            [row] = [line for line in section.splitlines() if line.startswith(f"| {name} |")]
            assert re.fullmatch(rf"\| {re.escape(name)} \| [\d.]+( / [\d.]+)? \| [\d.]+( / [\d.]+)? \|", row)
    assert all(name in rows for name in NEW_SYSTEMS)
    assert "Every turn of every system passed verification." in text


def test_the_assistant_client_checks_the_identity_tool_on_the_assistant_route() -> None:
    assistant = load_system("assistant")
    request = assistant.build_request(str(uuid.uuid4()), [], ClientConfig(bearer_token="t"))
    assert request.path == "/api/chat" and request.headers == {"authorization": "Bearer t"}
    stream = [
        event.replace(b'"lookup"', b'"get_identity"').replace(b'{"key":"alpha"}', b"{}") for event in events()
    ]
    with pytest.raises(TurnVerificationError, match="wrong tool result"):
        assistant.verify_stream(response(stream), words=WORDS)


async def test_the_turn_cost_breakdown_lists_statements_profiles_and_round_trips() -> None:
    """`bench.turn_costs` on `chat_routes`, a few turns: its per-turn line, its statement table, the
    cProfile table and the counted round trips, in form (a few turns say nothing of the values)."""
    from bench import turn_costs

    arguments = argparse.Namespace(
        systems="bastion-chat-routes",
        turns=2,
        concurrency=[1],
        rounds=1,
        statements=5,
        round_trips=2,
        py_spy=False,
        py_spy_out=None,
        cprofile=2,
    )
    lines = await turn_costs.run(arguments)
    text = "\n".join(lines)
    assert re.search(r"turns/s [\d.]+; server CPU [\d.]+ ms/turn; Postgres CPU [\d.]+ ms/turn", text)
    assert "`select bastion.close_turn(" in text  # the close, which carries the stream log, per statement
    assert re.search(r"\| log: ChunkLog.flush \| [\d.]+ \([\d.]+\) \|", text)
    assert re.search(r"^- bastion-chat-routes: [\d.]+$", text, re.MULTILINE)


def test_the_delta_stages_add_up_for_both_routes() -> None:
    from bench import delta_stages

    lines = asyncio.run(delta_stages.measure(turns=2, batches=4))
    stages = lines[4 : lines.index("", 4)]
    figures = {line.split(" | ")[0][2:]: float(line.split(" | ")[1].rstrip(" |")) for line in stages}
    # The form, never the values: a stage measured as a difference of two medians can come out below
    # zero on a busy machine, and each figure is rounded to 0.1 µs before it is summed.
    assert len(figures) == 10 and all(math.isfinite(value) for value in figures.values())
    parts = [
        value for label, value in figures.items() if label[0] in "12345" and label[:2] not in ("1a", "1b")
    ]
    assert figures["`chat_routes` (1+2+3+4+5)"] == pytest.approx(sum(parts), abs=0.05 * (len(parts) + 1))
    # The whole route in process, with and without the log: µs per delta, its ratio, writes per turn.
    routes = [line.split(" | ") for line in lines if line.startswith("| hand-wired (no log)")]
    routes += [line.split(" | ") for line in lines if line.startswith("| `chat_routes` (carried")]
    assert len(routes) == 2
    assert all(math.isfinite(float(row[1])) and float(row[3].rstrip(" |")) >= 1 for row in routes)


def test_conversations_can_be_limited_to_some_concurrencies() -> None:
    cells = Options(systems=["limit"], conversation_concurrency=(16,)).cells()
    assert [c.label for c in cells] == [
        "new c=1",
        "new c=16",
        "new c=32",
        "conversation c=16",
        "new c=16, 20 words",
    ]
