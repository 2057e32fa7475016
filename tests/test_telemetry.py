"""Traces and token usage: spans for the turn, each model request, each tool call (with its approval
outcome) and each store call, collected with OpenTelemetry's in-memory exporter; usage in the finish
chunk's metadata and in the stored message."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from bastion import (
    ToolPolicy,
    assemble_ui_messages,
    define_agent,
    reconcile_agent_messages,
    start_agent_run,
    tool,
)
from bastion.chat.stream_response import create_agent_stream_response
from bastion.stores import PostgresStore, SqliteStore, StoreIdentity, TurnContext
from tests.live_server import live_server
from tests.provider_fakes import USAGE_IN, USAGE_OUT, Fake
from tests.scripted import Call, ScriptedModel

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def tracing() -> None:
    export_to_memory()


@functools.cache
def export_to_memory() -> None:
    """One provider for the process (OpenTelemetry allows one), exporting once to `EXPORTER`, however
    many test sessions the process runs (a mutation tester reruns them in one process); bastion's
    tracer finds the provider once it is set."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


@pytest.fixture(scope="module")
def provider_url() -> Iterator[str]:
    with live_server(Fake().app()) as url:
        yield url


@tool
async def shout(word: str) -> str:
    """Repeat the word in capitals."""
    return word.upper()


def agent(needs_approval: bool = False) -> Any:
    return define_agent(
        name="shouter",
        instructions="Shout.",
        tools=lambda _: [shout],
        permissions={"shout": ToolPolicy(needs_approval=needs_approval)},
    )


def named(exported: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [span for span in exported if span.name == name]


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{uuid.uuid4()}", "role": "user", "parts": [{"type": "text", "text": text}]}


async def served_turn(
    store: SqliteStore | PostgresStore,
    who: StoreIdentity,
    conversation: str,
    model: Any,
    messages: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A persisted turn through the stream response; returns the wire chunks and the stored message."""
    run = await start_agent_run(
        persistence=store.persistence(),
        context=TurnContext(identity=who, conversation_id=conversation, request_id=str(uuid.uuid4())),
        messages=messages,
        trigger="submit-message",
    )
    session = await agent().prepare(context=None, execute_tool=run.execute_tool)
    response = create_agent_stream_response(
        await session.stream(model=model, messages=run.messages),
        original_messages=run.messages,
        on_finish=run.finish,
        usage_metadata=True,
    )
    body = bytearray()
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        body.extend(message.get("body", b""))

    await response({"type": "http", "method": "POST", "headers": []}, receive, send)
    done.set()
    await session.close()
    wire = [json.loads(event[6:]) for event in body.decode().split("\n\n") if event.startswith("data: {")]
    stored = await store.list_messages(who, conversation)
    return wire, stored[-1].message


async def test_a_turn_traces_its_model_requests_tool_calls_and_store_calls(
    spans: InMemorySpanExporter, provider_url: str, tmp_path: Path
) -> None:
    model = OpenAIChatModel("fake", provider=OpenAIProvider(base_url=f"{provider_url}/v1", api_key="k"))
    async with await SqliteStore.open(tmp_path / "db.sqlite3") as store:
        await store.migrate()
        who = StoreIdentity(user_id=str(uuid.uuid4()))
        conversation = (await store.create_conversation(who, title="t")).id
        await served_turn(store, who, conversation, model, [user("hi")])
    exported = spans.get_finished_spans()
    [turn] = named(exported, "bastion.turn")
    assert turn.attributes is not None and turn.parent is None
    assert turn.attributes["gen_ai.usage.input_tokens"] == 2 * USAGE_IN
    assert turn.attributes["gen_ai.usage.output_tokens"] == 2 * USAGE_OUT
    assert turn.attributes["bastion.model_requests"] == 2
    assert turn.attributes["bastion.finish_reason"] == "stop"
    assert turn.attributes["bastion.tools"] == 1
    assert turn.attributes["bastion.cancelled"] is False

    requests = named(exported, "bastion.model_request")
    assert [r.attributes["bastion.step"] for r in requests if r.attributes] == [0, 1]
    assert [(r.attributes or {})["bastion.finish_reason"] for r in requests] == ["tool_call", "stop"]
    assert [(r.attributes or {})["gen_ai.response.model"] for r in requests] == ["fake", "fake"]
    for request in requests:
        assert request.parent is not None and request.parent.span_id == turn.context.span_id
        assert request.attributes is not None
        assert request.attributes["gen_ai.usage.input_tokens"] == USAGE_IN
        assert request.attributes["gen_ai.usage.output_tokens"] == USAGE_OUT

    [call] = named(exported, "bastion.tool_call")
    assert call.parent is not None and call.parent.span_id == turn.context.span_id
    assert dict(call.attributes or {}) == {
        "bastion.tool.name": "shout",
        "bastion.tool.call_id": "call_0",
        "bastion.tool.approval": "not-required",
        "bastion.tool.outcome": "available",
    }
    [claim] = named(exported, "bastion.store.execute_tool")
    assert claim.parent is not None and claim.parent.span_id == call.context.span_id
    [started] = named(exported, "bastion.store.start_run")
    [finished] = named(exported, "bastion.store.finish_run")
    assert (finished.attributes or {})["bastion.run.status"] == "completed"
    assert started.end_time is not None and turn.start_time is not None
    assert started.end_time <= turn.start_time
    assert all(span.status.status_code != StatusCode.ERROR for span in exported)


async def test_the_finish_chunk_and_the_stored_message_carry_the_token_usage(
    spans: InMemorySpanExporter, provider_url: str, tmp_path: Path
) -> None:
    model = OpenAIChatModel("fake", provider=OpenAIProvider(base_url=f"{provider_url}/v1", api_key="k"))
    async with await SqliteStore.open(tmp_path / "db.sqlite3") as store:
        await store.migrate()
        who = StoreIdentity(user_id=str(uuid.uuid4()))
        conversation = (await store.create_conversation(who, title="t")).id
        history = [user("hi")]
        wire, stored = await served_turn(store, who, conversation, model, history)
    per_request = {"inputTokens": USAGE_IN, "outputTokens": USAGE_OUT, "totalTokens": USAGE_IN + USAGE_OUT}
    expected = {
        "usage": {"inputTokens": 2 * USAGE_IN, "outputTokens": 2 * USAGE_OUT, "totalTokens": 36},
        "requestUsage": [per_request, per_request],
    }
    assert wire[-1] == {"type": "finish", "finishReason": "stop", "messageMetadata": expected}
    assert stored["metadata"] == expected
    assert assemble_ui_messages(wire, history)[-1] == stored


async def test_the_finished_runs_event_carries_the_usage_in_sqlite(
    provider_url: str, sqlite_store: SqliteStore
) -> None:
    await check_usage_event(provider_url, sqlite_store)


async def test_the_finished_runs_event_carries_the_usage_in_postgres(
    provider_url: str, postgres_store: PostgresStore
) -> None:
    await check_usage_event(provider_url, postgres_store)


async def check_usage_event(provider_url: str, store: SqliteStore | PostgresStore) -> None:
    """The `run.completed` event holds the usage per request and per turn, as the finish chunk did."""
    model = OpenAIChatModel("fake", provider=OpenAIProvider(base_url=f"{provider_url}/v1", api_key="k"))
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    conversation = (await store.create_conversation(who, title="t")).id
    wire, _ = await served_turn(store, who, conversation, model, [user("hi")])
    events = await store.list_events(who, conversation)
    [finished] = [event for event in events if event.type == "run.completed"]
    usage = wire[-1]["messageMetadata"]
    assert (
        finished.data["usage"] == usage["usage"] == {"inputTokens": 22, "outputTokens": 14, "totalTokens": 36}
    )
    assert finished.data["requestUsage"] == usage["requestUsage"]
    assert len(finished.data["requestUsage"]) == 2
    [started] = [event for event in events if event.type == "run.started"]
    assert "usage" not in started.data


async def test_usage_stays_out_of_the_stream_unless_asked() -> None:
    session = await agent().prepare(context=None)
    history = [user("hi")]
    result = await session.stream(model=ScriptedModel(["hello"]), messages=history)
    stored: list[dict[str, Any]] = []

    async def on_finish(*, response_message: dict[str, Any], status: str) -> None:
        stored.append(response_message)

    response = create_agent_stream_response(result, original_messages=history, on_finish=on_finish)
    body = bytearray()

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def send(message: dict[str, Any]) -> None:
        body.extend(message.get("body", b""))

    await response({"type": "http", "method": "POST", "headers": []}, receive, send)
    await session.close()
    assert b'"type":"finish","finishReason":"stop"}' in body
    assert "metadata" not in stored[0]
    assert result.usage.input_tokens > 0  # counted all the same, for the application to use


async def approval_turn(messages: list[dict[str, Any]], model: ScriptedModel) -> list[dict[str, Any]]:
    session = await agent(needs_approval=True).prepare(context=None)
    try:
        result = await session.stream(model=model, messages=messages)
        return assemble_ui_messages([chunk async for chunk in result], messages)
    finally:
        await session.close()


@pytest.mark.parametrize(("approved", "outcome"), [(True, "available"), (False, "denied")])
async def test_tool_call_spans_say_how_the_approval_went(
    spans: InMemorySpanExporter, approved: bool, outcome: str
) -> None:
    model = ScriptedModel([Call("shout", {"word": "hi"}, call_id="c1")], ["ok"])
    paused = await approval_turn([user("hi")], model)
    [requested] = named(spans.get_finished_spans(), "bastion.tool_call")
    [paused_turn] = named(spans.get_finished_spans(), "bastion.turn")
    assert requested.parent is not None and requested.parent.span_id == paused_turn.context.span_id
    assert (requested.attributes or {})["bastion.tool.approval"] == "requested"
    assert (requested.attributes or {})["bastion.tool.outcome"] == "paused"
    spans.clear()

    answered = copy.deepcopy(paused)
    [part] = [p for p in answered[-1]["parts"] if p["type"] == "tool-shout"]
    part["state"] = "approval-responded"
    part["approval"] = {**part["approval"], "approved": approved}
    await approval_turn(await reconcile_agent_messages(paused, answered, trigger="submit-message"), model)
    [answer] = named(spans.get_finished_spans(), "bastion.tool_call")
    assert (answer.attributes or {})["bastion.tool.approval"] == ("approved" if approved else "denied")
    assert (answer.attributes or {})["bastion.tool.outcome"] == outcome
    assert (answer.attributes or {})["bastion.tool.call_id"] == "c1"
    assert (answer.attributes or {})["bastion.tool.name"] == "shout"


async def test_a_failing_model_request_marks_its_spans_as_errors(spans: InMemorySpanExporter) -> None:
    class ProviderDown(Exception):
        pass

    async def broken(messages: Any, info: Any) -> Any:
        raise ProviderDown("secret detail")
        yield  # pragma: no cover

    from pydantic_ai.models.function import FunctionModel

    session = await agent().prepare(context=None)
    result = await session.stream(model=FunctionModel(stream_function=broken), messages=[user("hi")])
    with pytest.raises(ProviderDown):
        _ = [chunk async for chunk in result]
    await session.close()
    exported = spans.get_finished_spans()
    for name in ("bastion.turn", "bastion.model_request"):
        [failed] = named(exported, name)
        assert failed.status.status_code == StatusCode.ERROR
        assert failed.status.description == "ProviderDown"  # the type only, never the message
    [turn] = named(exported, "bastion.turn")
    assert (turn.attributes or {})["bastion.finish_reason"] == "none"


async def test_a_cancelled_turn_says_so_on_its_span(spans: InMemorySpanExporter) -> None:
    cancel = asyncio.Event()

    async def cancel_mid_answer(messages: Any, info: Any) -> Any:
        yield "Partial"
        cancel.set()
        yield " answer"

    from pydantic_ai.models.function import FunctionModel

    session = await agent().prepare(context=None, cancel=cancel)
    result = await session.stream(
        model=FunctionModel(stream_function=cancel_mid_answer), messages=[user("hi")]
    )
    _ = [chunk async for chunk in result]
    await session.close()
    assert result.cancelled and result.finish_reason == "other"
    [turn] = named(spans.get_finished_spans(), "bastion.turn")
    assert (turn.attributes or {})["bastion.cancelled"] is True
    assert (turn.attributes or {})["bastion.finish_reason"] == "other"


async def test_calls_of_one_step_that_share_a_provider_id_each_get_a_complete_span(
    spans: InMemorySpanExporter,
) -> None:
    model = ScriptedModel(
        [Call("shout", {"word": "a"}, "call_0"), Call("shout", {"word": "b"}, "call_0")], ["ok"]
    )
    session = await agent().prepare(context=None)
    result = await session.stream(model=model, messages=[user("hi")])
    _ = [chunk async for chunk in result]
    await session.close()
    calls = named(spans.get_finished_spans(), "bastion.tool_call")
    assert [dict(call.attributes or {}) for call in calls] == [
        {
            "bastion.tool.name": "shout",
            "bastion.tool.call_id": "call_0",
            "bastion.tool.approval": "not-required",
            "bastion.tool.outcome": "available",
        }
    ] * 2
