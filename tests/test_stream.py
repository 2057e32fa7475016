"""The AI SDK UI message stream: wire format, assembly, settlement, disconnects, and the real AI SDK clients.

Turns are scripted fakes of the agent loop's result, served by uvicorn on 127.0.0.1 and read with
httpx2 or with the `ai` package's own chat client (versions 7 and 6) through `tests/js/read-chat.mjs`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import httpx2
import pytest
import pytest_asyncio
import uvicorn
from starlette.applications import Starlette
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from bastion.chat.stream_response import DEFAULT_ERROR_TEXT, StreamStatus, create_agent_stream_response
from bastion.stores import check_storable_message
from tests.ai_sdk import SDKS, run_chat, send

Chunk = dict[str, Any]


class ProviderError(Exception):
    """Stands for a model provider failing mid-turn; its text must never reach a client."""


class ScriptedResult:
    """A fake agent turn: yields `chunks`, waits at `gate` if given, yields `after_gate`, then may raise."""

    def __init__(
        self,
        chunks: Sequence[Chunk],
        *,
        finish_reason: str | None = "stop",
        cancelled: bool = False,
        error: Exception | None = None,
        gate: anyio.Event | None = None,
        after_gate: Sequence[Chunk] = (),
    ) -> None:
        self.chunks = list(chunks)
        self.finish_reason = finish_reason
        self.cancelled = cancelled
        self.error = error
        self.gate = gate
        self.after_gate = list(after_gate)

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        for chunk in self.chunks:
            yield chunk
        if self.gate is not None:
            await self.gate.wait()
        for chunk in self.after_gate:
            yield chunk
        if self.error is not None:
            raise self.error


def text(part_id: str, *deltas: str) -> list[Chunk]:
    return [
        {"type": "text-start", "id": part_id},
        *({"type": "text-delta", "id": part_id, "delta": delta} for delta in deltas),
        {"type": "text-end", "id": part_id},
    ]


def step(*chunks: Chunk | list[Chunk]) -> list[Chunk]:
    flat: list[Chunk] = []
    for chunk in chunks:
        flat.extend(chunk if isinstance(chunk, list) else [chunk])
    return [{"type": "start-step"}, *flat, {"type": "finish-step"}]


class StreamServer:
    """A Starlette app on uvicorn serving the next scripted turn per POST, recording what happened."""

    def __init__(self) -> None:
        self.url = ""
        self.turns: list[tuple[ScriptedResult, dict[str, Any]]] = []
        self.requests: list[dict[str, Any]] = []
        self.finished: list[tuple[dict[str, Any], StreamStatus]] = []
        self.settled: list[StreamStatus] = []
        self.settled_event = anyio.Event()
        self.disconnected = anyio.Event()
        self.sent = bytearray()
        self.app = Starlette(routes=[Route("/chat", self.chat, methods=["POST"])])

    def serve(self, result: ScriptedResult, **options: Any) -> None:
        self.turns.append((result, options))

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        result, options = self.turns.pop(0)
        options = {"on_finish": self.record_finish, "on_settled": self.record_settled, **options}
        return create_agent_stream_response(result, original_messages=body["messages"], **options)

    async def record_finish(self, *, response_message: dict[str, Any], status: StreamStatus) -> None:
        self.finished.append((response_message, status))

    async def record_settled(self, *, status: StreamStatus) -> None:
        self.settled.append(status)
        self.settled_event.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def recording_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnected.set()
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.body":
                self.sent += message.get("body", b"")
            await send(message)

        await self.app(scope, recording_receive, recording_send)


pytestmark = pytest.mark.asyncio(loop_scope="module")


class Dispatcher:
    """The ASGI app uvicorn serves for the whole module; each test points it at its own StreamServer."""

    def __init__(self) -> None:
        self.target: StreamServer | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.target is not None
        await self.target(scope, receive, send)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served() -> AsyncIterator[tuple[str, Dispatcher]]:
    """One uvicorn server on 127.0.0.1 for the module: starting and stopping one per test is slow."""
    dispatcher = Dispatcher()
    config = uvicorn.Config(
        dispatcher, host="127.0.0.1", port=0, log_level="warning", lifespan="off", timeout_graceful_shutdown=5
    )
    uvicorn_server = uvicorn.Server(config)
    task = asyncio.create_task(uvicorn_server.serve())
    while not uvicorn_server.started:
        await asyncio.sleep(0.01)
    port = uvicorn_server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/chat", dispatcher
    uvicorn_server.should_exit = True
    await task


@pytest_asyncio.fixture(loop_scope="module")
async def server(served: tuple[str, Dispatcher]) -> StreamServer:
    url, dispatcher = served
    dispatcher.target = StreamServer()
    dispatcher.target.url = url
    return dispatcher.target


def user(text_: str, message_id: str = "u1") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text_}]}


async def post(server: StreamServer, messages: Sequence[dict[str, Any]] = ()) -> httpx2.Response:
    async with httpx2.AsyncClient() as client:
        return await client.post(server.url, json={"id": "chat", "messages": list(messages or [user("Hi")])})


def events(response: httpx2.Response) -> list[Any]:
    """The `data:` payloads of a stream: chunk dicts, and the final "[DONE]" as a string."""
    frames = response.text.split("\n\n")
    assert frames[-1] == "", "every event ends with a blank line"
    parsed: list[Any] = []
    for frame in frames[:-1]:
        assert frame.startswith("data: ")
        payload = frame[len("data: ") :]
        parsed.append(payload if payload == "[DONE]" else json.loads(payload))
    return parsed


def types(response: httpx2.Response) -> list[str]:
    return [event if isinstance(event, str) else event["type"] for event in events(response)]


# --- wire format ---


async def test_response_carries_the_ui_message_stream_headers_and_application_headers(
    server: StreamServer,
) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hi"))), headers={"X-Request-Id": "r-1"})
    response = await post(server)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["content-encoding"] == "none"
    assert response.headers["x-request-id"] == "r-1"


async def test_compressing_middleware_passes_the_stream_through_unbuffered(server: StreamServer) -> None:
    """A compressor that does not know event streams (unlike Starlette's default) still leaves it alone."""
    gate = anyio.Event()
    server.app = GZipMiddleware(server.app, minimum_size=1, exclude_content_types=())
    server.serve(ScriptedResult(step(text("t1", "Hi")), gate=gate, after_gate=step(text("t2", "there"))))
    async with (
        httpx2.AsyncClient() as client,
        client.stream(
            "POST", server.url, json={"messages": [user("Hi")]}, headers={"Accept-Encoding": "gzip"}
        ) as response,
    ):
        assert response.headers["content-encoding"] == "none"
        raw = response.aiter_raw()
        received = b""
        while b'"delta":"Hi"' not in received:
            received += await asyncio.wait_for(anext(raw), timeout=30)
        gate.set()
        async for data in raw:
            received += data
    assert received.endswith(b"data: [DONE]\n\n")
    assert b'"delta":"there"' in received


async def test_application_headers_cannot_redefine_a_protocol_header() -> None:
    with pytest.raises(ValueError, match="content-type"):
        create_agent_stream_response(
            ScriptedResult([]), original_messages=[user("Hi")], headers={"Content-Type": "text/plain"}
        )


async def test_each_chunk_is_a_compact_data_event_and_the_stream_ends_with_done(server: StreamServer) -> None:
    server.serve(ScriptedResult(step(text("t1", "Grüße"))), message_id="m1")
    response = await post(server)
    assert response.text == (
        'data: {"type":"start","messageId":"m1"}\n\n'
        'data: {"type":"start-step"}\n\n'
        'data: {"type":"text-start","id":"t1"}\n\n'
        'data: {"type":"text-delta","id":"t1","delta":"Grüße"}\n\n'
        'data: {"type":"text-end","id":"t1"}\n\n'
        'data: {"type":"finish-step"}\n\n'
        'data: {"type":"finish","finishReason":"stop"}\n\n'
        "data: [DONE]\n\n"
    )


async def test_start_chunk_carries_a_generated_message_id_by_default(server: StreamServer) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hi"))))
    start = events(await post(server))[0]
    assert start["type"] == "start"
    assert isinstance(start["messageId"], str) and start["messageId"]
    assert server.finished[0][0]["id"] == start["messageId"]


async def test_message_id_may_come_from_a_generator(server: StreamServer) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hi"))), message_id=lambda: "generated-1")
    assert events(await post(server))[0] == {"type": "start", "messageId": "generated-1"}


async def test_finish_chunk_carries_the_results_finish_reason(server: StreamServer) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hi")), finish_reason="length"))
    assert events(await post(server))[-2] == {"type": "finish", "finishReason": "length"}


async def test_a_finish_reason_ai_6_refuses_is_sent_as_other(server: StreamServer) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hi")), finish_reason="interrupted"))
    assert events(await post(server))[-2] == {"type": "finish", "finishReason": "other"}


async def test_message_metadata_goes_to_the_start_chunk_and_the_message(server: StreamServer) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hi"))), message_id="m1", message_metadata={"model": "m"})
    assert events(await post(server))[0] == {
        "type": "start",
        "messageId": "m1",
        "messageMetadata": {"model": "m"},
    }
    assert server.finished[0][0]["metadata"] == {"model": "m"}


# --- assembly and settlement ---


async def test_on_finish_receives_the_assembled_message_with_completed_status(server: StreamServer) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hel", "lo"))), message_id="m1")
    await post(server)
    assert server.finished == [
        (
            {
                "id": "m1",
                "role": "assistant",
                "parts": [{"type": "step-start"}, {"type": "text", "text": "Hello", "state": "done"}],
            },
            "completed",
        )
    ]
    assert server.settled == ["completed"]


async def test_a_continuation_reuses_the_last_assistant_message_and_updates_it(server: StreamServer) -> None:
    pending = {
        "id": "a1",
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-deleteFile",
                "toolCallId": "c1",
                "state": "approval-responded",
                "input": {"path": "x"},
                "approval": {"id": "p1", "approved": True},
            },
        ],
    }
    server.serve(
        ScriptedResult([{"type": "tool-output-available", "toolCallId": "c1", "output": {"ok": True}}])
    )
    response = await post(server, [user("Delete x"), pending])
    assert events(response)[0] == {"type": "start", "messageId": "a1"}
    message, status = server.finished[0]
    assert status == "completed"
    assert message["id"] == "a1"
    assert message["parts"][1] == {
        "type": "tool-deleteFile",
        "toolCallId": "c1",
        "state": "output-available",
        "input": {"path": "x"},
        "output": {"ok": True},
        "approval": {"id": "p1", "approved": True},
    }


async def test_invalid_original_messages_raise_before_anything_runs() -> None:
    broken = {"id": "a1", "role": "assistant", "parts": "not a list"}
    with pytest.raises(ValueError, match="parts"):
        create_agent_stream_response(ScriptedResult([]), original_messages=[user("Hi"), broken])


async def test_settlement_completes_before_the_finish_chunk_is_sent(server: StreamServer) -> None:
    release = anyio.Event()
    entered = anyio.Event()
    finish_sent_before_release: list[bool] = []

    async def on_settled(*, status: StreamStatus) -> None:
        entered.set()
        await release.wait()

    server.serve(ScriptedResult(step(text("t1", "Hi"))), on_settled=on_settled)
    async with anyio.create_task_group() as group:
        responses: list[httpx2.Response] = []

        async def read() -> None:
            responses.append(await post(server))

        group.start_soon(read)
        with anyio.fail_after(10):
            await entered.wait()
            while b'"text-end"' not in server.sent:
                await anyio.sleep(0.01)
        finish_sent_before_release.append(b'"finish"' in server.sent)
        release.set()
    assert finish_sent_before_release == [False]
    assert types(responses[0])[-2:] == ["finish", "[DONE]"]


async def test_settlement_runs_once_as_failed_when_persistence_fails(server: StreamServer) -> None:
    calls: list[StreamStatus] = []

    async def on_finish(*, response_message: dict[str, Any], status: StreamStatus) -> None:
        calls.append(status)
        raise RuntimeError("database unavailable")

    server.serve(ScriptedResult(step(text("t1", "Hi"))), on_finish=on_finish)
    response = await post(server)
    assert calls == ["completed"]
    assert server.settled == ["failed"]
    assert events(response)[-3:] == [
        {"type": "error", "errorText": DEFAULT_ERROR_TEXT},
        {"type": "finish", "finishReason": "error"},
        "[DONE]",
    ]
    assert "database" not in response.text


async def test_a_failed_settlement_is_not_retried_and_the_stream_still_finishes(
    server: StreamServer, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[StreamStatus] = []

    async def on_settled(*, status: StreamStatus) -> None:
        calls.append(status)
        raise RuntimeError("release failed")

    server.serve(ScriptedResult(step(text("t1", "Hi"))), on_settled=on_settled)
    response = await post(server)
    assert calls == ["completed"]
    assert types(response)[-2:] == ["finish", "[DONE]"]
    assert any(r.name == "bastion.stream" and r.exc_info for r in caplog.records)


async def test_a_provider_error_sends_the_default_text_and_settles_as_failed(
    server: StreamServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hi")), error=ProviderError("key sk-secret rejected")))
    response = await post(server)
    assert events(response)[-3:] == [
        {"type": "error", "errorText": "Unable to generate a response. Try again."},
        {"type": "finish", "finishReason": "error"},
        "[DONE]",
    ]
    assert "sk-secret" not in response.text
    assert server.finished[0][1] == "failed"
    assert server.finished[0][0]["parts"][1] == {"type": "text", "text": "Hi", "state": "done"}
    assert server.settled == ["failed"]
    logged = [r for r in caplog.records if r.name == "bastion.stream" and r.exc_info]
    assert logged and isinstance(logged[0].exc_info[1], ProviderError)  # type: ignore[index]


async def test_a_custom_on_error_formats_the_error_text(server: StreamServer) -> None:
    server.serve(
        ScriptedResult([], error=ProviderError("rate limited")),
        on_error=lambda exc: f"Provider said: {exc}",
    )
    assert {"type": "error", "errorText": "Provider said: rate limited"} in events(await post(server))


async def test_a_failing_on_error_falls_back_to_the_default_text(server: StreamServer) -> None:
    def on_error(exc: Exception) -> str:
        raise RuntimeError("formatter broke")

    server.serve(ScriptedResult([], error=ProviderError("boom")), on_error=on_error)
    assert {"type": "error", "errorText": DEFAULT_ERROR_TEXT} in events(await post(server))


async def test_a_cancelled_result_settles_as_cancelled(server: StreamServer) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hi")), cancelled=True, finish_reason=None))
    response = await post(server)
    assert types(response)[-3:] == ["abort", "finish", "[DONE]"]
    assert server.finished[0][1] == "cancelled"
    assert server.settled == ["cancelled"]


async def test_an_invalid_chunk_is_not_sent_and_fails_the_turn(server: StreamServer) -> None:
    invalid = {"type": "tool-input-start", "toolCallId": "c1", "toolName": "search", "dynamic": None}
    server.serve(ScriptedResult([{"type": "start-step"}, invalid]))
    response = await post(server)
    assert "tool-input-start" not in response.text
    assert {"type": "error", "errorText": DEFAULT_ERROR_TEXT} in events(response)
    assert server.settled == ["failed"]


async def test_a_delta_for_an_unstarted_text_part_fails_the_turn(server: StreamServer) -> None:
    server.serve(ScriptedResult([{"type": "text-delta", "id": "t9", "delta": "x"}]))
    response = await post(server)
    assert "text-delta" not in response.text
    assert server.settled == ["failed"]


async def test_client_disconnect_keeps_consuming_the_turn_until_it_is_persisted(server: StreamServer) -> None:
    gate = anyio.Event()
    rest = [{"type": "text-delta", "id": "t1", "delta": " world"}, {"type": "text-end", "id": "t1"}]
    result = ScriptedResult(
        [
            {"type": "start-step"},
            {"type": "text-start", "id": "t1"},
            {"type": "text-delta", "id": "t1", "delta": "Hi"},
        ],
        gate=gate,
        after_gate=[*rest, {"type": "finish-step"}],
    )
    server.serve(result, message_id="m1")
    async with (
        httpx2.AsyncClient() as client,
        client.stream("POST", server.url, json={"id": "chat", "messages": [user("Hi")]}) as response,
    ):
        async for line in response.aiter_lines():
            if '"text-delta"' in line:
                break
    with anyio.fail_after(10):
        await server.disconnected.wait()
        for _ in range(50):  # let the server act on the disconnect before the turn may go on
            await anyio.sleep(0)
        gate.set()
        await server.settled_event.wait()
    assert server.finished == [
        (
            {
                "id": "m1",
                "role": "assistant",
                "parts": [{"type": "step-start"}, {"type": "text", "text": "Hi world", "state": "done"}],
            },
            "completed",
        )
    ]
    assert server.settled == ["completed"]


async def test_a_cancelled_request_task_still_consumes_and_settles_the_turn() -> None:
    gate = anyio.Event()
    first_body = anyio.Event()
    settled: list[StreamStatus] = []
    finished: list[dict[str, Any]] = []

    async def on_finish(*, response_message: dict[str, Any], status: StreamStatus) -> None:
        finished.append(response_message)

    async def on_settled(*, status: StreamStatus) -> None:
        settled.append(status)

    result = ScriptedResult(
        [{"type": "start-step"}, {"type": "text-start", "id": "t1"}],
        gate=gate,
        after_gate=[{"type": "text-delta", "id": "t1", "delta": "Hi"}, {"type": "text-end", "id": "t1"}],
    )
    response = create_agent_stream_response(
        result, original_messages=[user("Hi")], on_finish=on_finish, on_settled=on_settled, message_id="m1"
    )

    async def receive() -> Message:
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            first_body.set()

    async with anyio.create_task_group() as group:
        group.start_soon(response, {"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
        with anyio.fail_after(10):
            await first_body.wait()
        group.cancel_scope.cancel()
        gate.set()
    assert settled == ["completed"]
    assert finished[0]["parts"][1] == {"type": "text", "text": "Hi", "state": "done"}


# --- the real AI SDK clients ---


def client_message(state: dict[str, Any], message_id: str) -> dict[str, Any]:
    return next(m for m in state["messages"] if m["id"] == message_id)


def assert_client_matches_server(states: list[dict[str, Any]], server: StreamServer) -> None:
    """Each response: the client accepted every chunk and assembled what the server persisted."""
    assert len(states) == len(server.finished)
    for state, (message, status) in zip(states, server.finished, strict=True):
        if status == "completed":
            assert state["status"] == "ready", state["error"]
        assert client_message(state, message["id"]) == message


WEATHER_TURN = [
    *step(
        {"type": "reasoning-start", "id": "r1"},
        {"type": "reasoning-delta", "id": "r1", "delta": "Needs the weather."},
        {"type": "reasoning-end", "id": "r1"},
        text("t1", "Let me check ", "the weather."),
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"city":'},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '"Paris"}'},
        {
            "type": "tool-input-available",
            "toolCallId": "c1",
            "toolName": "weather",
            "input": {"city": "Paris"},
        },
        {"type": "tool-output-available", "toolCallId": "c1", "output": {"temperature": 21.0, "unit": "°C"}},
    ),
    *step(text("t2", "It is 21 °C in Paris.")),
]

APPROVAL_TURN = step(
    {"type": "tool-input-start", "toolCallId": "c4", "toolName": "deleteFile"},
    {"type": "tool-input-delta", "toolCallId": "c4", "inputTextDelta": '{"path":"report.txt"}'},
    {
        "type": "tool-input-available",
        "toolCallId": "c4",
        "toolName": "deleteFile",
        "input": {"path": "report.txt"},
    },
    {"type": "tool-approval-request", "approvalId": "ap1", "toolCallId": "c4"},
)


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_assembles_plain_text_like_the_server(server: StreamServer, sdk: str) -> None:
    server.serve(ScriptedResult(step(text("t1", "Hello, ", "wörld 👋"))))
    states = await run_chat(sdk, server.url, [send("Hi")])
    assert_client_matches_server(states, server)
    assert states[0]["finishReason"] == "stop"


UNENCODABLE_TURN = step(
    text("t1", "NUL\x00 here, ", "lone \ud800 surrogate"),
    {"type": "tool-input-available", "toolCallId": "c1", "toolName": "read", "input": {"path": "a\x00b"}},
    {"type": "tool-output-available", "toolCallId": "c1", "output": {"bytes\x00": "\udc80\x00"}},
)


@pytest.mark.parametrize("sdk", SDKS)
async def test_nul_and_lone_surrogates_reach_the_client_and_the_store_as_replacement_characters(
    server: StreamServer, sdk: str
) -> None:
    server.serve(ScriptedResult(UNENCODABLE_TURN))
    states = await run_chat(sdk, server.url, [send("Read it")])
    assert_client_matches_server(states, server)
    [(message, status)] = server.finished
    assert status == "completed"
    assert message["parts"][1]["text"] == "NUL\ufffd here, lone \ufffd surrogate"
    assert message["parts"][2]["input"] == {"path": "a\ufffdb"}
    assert message["parts"][2]["output"] == {"bytes\ufffd": "\ufffd\ufffd"}
    check_storable_message(message)


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_assembles_a_tool_call_with_output_like_the_server(
    server: StreamServer, sdk: str
) -> None:
    server.serve(ScriptedResult(WEATHER_TURN))
    states = await run_chat(sdk, server.url, [send("Weather in Paris?")])
    assert_client_matches_server(states, server)
    assert type(server.finished[0][0]["parts"][3]["output"]["temperature"]) is int


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_assembles_tool_errors_like_the_server(server: StreamServer, sdk: str) -> None:
    turn = [
        *step(
            {"type": "tool-input-available", "toolCallId": "c2", "toolName": "lookup", "input": {"id": 7}},
            {"type": "tool-output-error", "toolCallId": "c2", "errorText": "Tool execution failed."},
            {
                "type": "tool-input-error",
                "toolCallId": "c3",
                "toolName": "docs_search",
                "input": {"q": 1},
                "errorText": "Invalid input for tool docs_search.",
                "dynamic": True,
            },
        ),
        *step(text("t1", "Both tools failed.")),
    ]
    server.serve(ScriptedResult(turn))
    states = await run_chat(sdk, server.url, [send("Look it up")])
    assert_client_matches_server(states, server)


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_assembles_an_approval_request_like_the_server(
    server: StreamServer, sdk: str
) -> None:
    server.serve(ScriptedResult(APPROVAL_TURN, finish_reason="tool-calls"))
    states = await run_chat(sdk, server.url, [send("Delete the report")])
    assert_client_matches_server(states, server)
    assert server.finished[0][0]["parts"][1]["state"] == "approval-requested"
    assert states[0]["finishReason"] == "tool-calls"


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_continues_the_same_message_after_an_approval(
    server: StreamServer, sdk: str
) -> None:
    server.serve(ScriptedResult(APPROVAL_TURN, finish_reason="tool-calls"))
    resumed = [
        {"type": "tool-output-available", "toolCallId": "c4", "output": {"deleted": True}},
        *step(text("t1", "Deleted.")),
    ]
    server.serve(ScriptedResult(resumed))
    approve = {"type": "approve", "approvalId": "ap1", "approved": True}
    states = await run_chat(sdk, server.url, [send("Delete the report"), approve])
    assert_client_matches_server(states, server)
    first, second = (message for message, _ in server.finished)
    assert second["id"] == first["id"]
    assert len(states[1]["messages"]) == 2
    assert second["parts"][1]["state"] == "output-available"
    assert second["parts"][1]["approval"] == {"id": "ap1", "approved": True}


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_records_a_denial_with_its_reason_like_the_server(
    server: StreamServer, sdk: str
) -> None:
    server.serve(ScriptedResult(APPROVAL_TURN, finish_reason="tool-calls"))
    server.serve(
        ScriptedResult([{"type": "tool-output-denied", "toolCallId": "c4"}, *step(text("t1", "Kept."))])
    )
    deny = {"type": "approve", "approvalId": "ap1", "approved": False, "reason": "Keep it"}
    states = await run_chat(sdk, server.url, [send("Delete the report"), deny])
    assert_client_matches_server(states, server)
    denied = server.finished[1][0]["parts"][1]
    assert denied["state"] == "output-denied"
    assert denied["approval"] == {"id": "ap1", "approved": False, "reason": "Keep it"}


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_sends_the_whole_history_on_a_further_user_turn(
    server: StreamServer, sdk: str
) -> None:
    server.serve(ScriptedResult(WEATHER_TURN))
    server.serve(ScriptedResult(step(text("t1", "You're welcome."))))
    states = await run_chat(sdk, server.url, [send("Weather in Paris?"), send("Thanks")])
    assert_client_matches_server(states, server)
    sent = server.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1] == server.finished[0][0]
    assert server.finished[1][0]["id"] != server.finished[0][0]["id"]


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_keeps_the_partial_message_of_a_failed_turn_like_the_server(
    server: StreamServer, sdk: str
) -> None:
    chunks = [
        {"type": "start-step"},
        *text("t1", "Checking."),
        {"type": "tool-input-start", "toolCallId": "c5", "toolName": "weather"},
        {"type": "tool-input-delta", "toolCallId": "c5", "inputTextDelta": '{"city":"Par'},
    ]
    server.serve(ScriptedResult(chunks, error=ProviderError("upstream 500")))
    states = await run_chat(sdk, server.url, [send("Weather?")])
    assert states[0]["status"] == "error"
    assert states[0]["error"] == DEFAULT_ERROR_TEXT
    assert_client_matches_server(states, server)
    streaming = server.finished[0][0]["parts"][2]
    assert streaming["state"] == "input-streaming"
    assert streaming["input"] == {"city": "Par"}


@pytest.mark.parametrize("sdk", SDKS)
async def test_ai_sdk_client_assembles_provider_fields_and_metadata_like_the_server(
    server: StreamServer, sdk: str
) -> None:
    provider = {"openai": {"itemId": "i1"}}
    turn = step(
        {"type": "text-start", "id": "t1", "providerMetadata": provider},
        {"type": "text-delta", "id": "t1", "delta": "Searching."},
        {"type": "text-end", "id": "t1", "providerMetadata": {"openai": {"itemId": "i2"}}},
        {
            "type": "tool-input-start",
            "toolCallId": "c6",
            "toolName": "web_search",
            "providerExecuted": True,
            "title": "Web search",
            "toolMetadata": {"source": "native"},
            "providerMetadata": provider,
        },
        {"type": "tool-input-available", "toolCallId": "c6", "toolName": "web_search", "input": {"q": "x"}},
        {"type": "tool-output-available", "toolCallId": "c6", "output": {"hits": 1}, "preliminary": True},
        {
            "type": "tool-output-available",
            "toolCallId": "c6",
            "output": {"hits": 2},
            "providerMetadata": provider,
        },
        {
            "type": "tool-input-start",
            "toolCallId": "c7",
            "toolName": "mcp_fetch",
            "dynamic": True,
            "title": "Fetch",
        },
        {"type": "tool-input-delta", "toolCallId": "c7", "inputTextDelta": '{"url": "a"}'},
        {"type": "tool-input-available", "toolCallId": "c7", "toolName": "mcp_fetch", "input": {"url": "a"}},
        {"type": "tool-output-error", "toolCallId": "c7", "errorText": "Fetch failed."},
        {"type": "tool-input-start", "toolCallId": "c9", "toolName": "count"},
        {"type": "tool-input-delta", "toolCallId": "c9", "inputTextDelta": '{"n": 2'},
        {"type": "tool-output-available", "toolCallId": "c9", "output": 2},
    )
    server.serve(ScriptedResult(turn), message_metadata={"model": "scripted", "usage": {"tokens": 3}})
    states = await run_chat(sdk, server.url, [send("Search")])
    assert_client_matches_server(states, server)


async def test_a_static_tool_input_error_is_stored_as_ai_7_assembles_it(server: StreamServer) -> None:
    chunk = {
        "type": "tool-input-error",
        "toolCallId": "c8",
        "toolName": "lookup",
        "input": "{bad",
        "errorText": "x",
    }
    for _ in SDKS:
        server.serve(ScriptedResult(step(chunk)))
    ai7 = await run_chat("7", server.url, [send("Go")])
    ai6 = await run_chat("6", server.url, [send("Go")])
    stored = server.finished[0][0]["parts"][1]
    assert stored["input"] == "{bad" and "rawInput" not in stored
    assert client_message(ai7[0], server.finished[0][0]["id"]) == server.finished[0][0]
    ai6_part = client_message(ai6[0], server.finished[1][0]["id"])["parts"][1]
    assert ai6_part == {**{k: v for k, v in stored.items() if k != "input"}, "rawInput": "{bad"}


async def test_partial_tool_input_is_parsed_as_the_ai_7_client_parses_it(server: StreamServer) -> None:
    plan = {"city": 'Parés "x"', "days": [1, 2.5, -3e2, [-1]], "ok": True, "n": None, "o": {"a": [{}]}}
    document = json.dumps(plan)
    chunks: list[Chunk] = [{"type": "start-step"}]
    for end in range(1, len(document) + 1):
        call_id = f"c{end}"
        chunks.append({"type": "tool-input-start", "toolCallId": call_id, "toolName": "plan"})
        chunks.append({"type": "tool-input-delta", "toolCallId": call_id, "inputTextDelta": document[:end]})
    server.serve(ScriptedResult(chunks))
    states = await run_chat("7", server.url, [send("Plan")])
    assert_client_matches_server(states, server)
    assert server.finished[0][0]["parts"][-1]["input"] == json.loads(document)


async def test_a_cancellation_raised_inside_the_turn_still_settles_as_failed(server: StreamServer) -> None:
    class CancelledInside(ScriptedResult):
        async def __aiter__(self) -> AsyncIterator[Chunk]:
            yield {"type": "start-step"}
            raise asyncio.CancelledError

    server.serve(CancelledInside([]))
    response = await post(server, [user("hi")])
    assert types(response)[-3:] == ["error", "finish", "[DONE]"]
    assert server.settled == ["failed"]
