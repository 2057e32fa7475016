"""How the UI message stream's text deltas are encoded, and its events grouped into the response's writes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bastion import _client_json
from bastion._client_json import text_delta_json, to_client_json
from bastion.chat import stream_response
from bastion.chat.stream_response import _EventChannel, create_agent_stream_response

pytestmark = pytest.mark.asyncio


async def _writes(channel: _EventChannel) -> list[bytes]:
    return [batch async for batch in channel.batches()]


async def test_events_a_fast_producer_adds_turn_after_turn_go_out_in_few_writes() -> None:
    channel = _EventChannel()
    reader = asyncio.ensure_future(_writes(channel))

    for index in range(60):  # one event per turn of the event loop, as a scripted reply streams
        channel.send(b"data: %d\n\n" % index)
        await asyncio.sleep(0)
    channel.close()
    writes = await reader
    assert b"".join(writes) == b"".join(b"data: %d\n\n" % index for index in range(60))
    assert len(writes) <= 4


async def test_an_event_followed_by_a_wait_is_written_without_waiting_for_the_next() -> None:
    channel = _EventChannel()
    written: list[bytes] = []
    arrived = asyncio.Event()

    async def read() -> None:
        async for batch in channel.batches():
            written.append(batch)
            arrived.set()

    reader = asyncio.ensure_future(read())
    for index in range(3):  # a model that waits between tokens: each event is its own write
        arrived.clear()
        channel.send(b"data: %d\n\n" % index)
        await asyncio.wait_for(arrived.wait(), 10)
    channel.close()
    await reader
    assert written == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]


@pytest.mark.parametrize(
    "delta",
    ["plain", 'quotes " and \\ backslash', "lines\n\r\t and \u2028\u2029", "é ✓ 😀", "\x01\x1f\x7f", ""],
)
async def test_a_text_deltas_wire_json_is_what_encoding_the_chunk_gives(delta: str) -> None:
    chunk = {"type": "text-delta", "id": "0-1", "delta": delta}
    assert text_delta_json(chunk) == to_client_json(chunk)[0]
    assert json.loads(text_delta_json(chunk) or b"") == chunk


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "text-delta", "id": "0-1", "delta": "NUL \x00"},
        {"type": "text-delta", "id": "0-1", "delta": "lone \ud800"},
        {"id": "0-1", "type": "text-delta", "delta": "keys in another order"},
        {"type": "text-delta", "id": "0-1", "delta": "x", "providerMetadata": {}},
        {"type": "reasoning-delta", "id": "0-1", "delta": "x"},
        {"type": "text-delta", "id": "0-1", "delta": 1},
        ["type", "id", "delta"],
    ],
)
async def test_other_chunks_and_text_the_client_would_see_replaced_take_the_general_encoding(
    chunk: Any,
) -> None:
    assert text_delta_json(chunk) is None


class _Result:
    finish_reason = "stop"
    cancelled = False

    def __init__(self, chunks: list[dict[str, Any]]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for chunk in self.chunks:
            yield chunk


async def test_the_streams_text_deltas_are_sent_and_assembled_without_encoding_the_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoded: list[Any] = []

    def counting(value: Any) -> tuple[bytes, Any]:
        encoded.append(value)
        return _client_json.to_client_json(value)

    monkeypatch.setattr(stream_response, "to_client_json", counting)
    deltas = [{"type": "text-delta", "id": "t", "delta": word} for word in ("Hello", " there", " \x00")]
    chunks = [
        {"type": "start-step"},
        {"type": "text-start", "id": "t"},
        *deltas,
        {"type": "text-end", "id": "t"},
    ]
    saved: list[dict[str, Any]] = []

    async def on_finish(*, response_message: dict[str, Any], status: str) -> None:
        saved.append(response_message)

    response = create_agent_stream_response(
        _Result(chunks),  # type: ignore[arg-type]
        original_messages=[{"id": "u", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        message_id="m",
        on_finish=on_finish,
    )
    body = bytearray()
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            body.extend(message["body"])
            if not message["more_body"]:
                done.set()

    await response({"type": "http"}, receive, send)  # type: ignore[arg-type]
    expected = [{"type": "start", "messageId": "m"}, *chunks, {"type": "finish", "finishReason": "stop"}]
    assert (
        bytes(body)
        == b"".join(b"data: " + _client_json.to_client_json(chunk)[0] + b"\n\n" for chunk in expected)
        + b"data: [DONE]\n\n"
    )
    assert [chunk for chunk in encoded if chunk.get("type") == "text-delta"] == [deltas[2]]  # the NUL one
    assert saved[0]["parts"][1] == {"type": "text", "text": "Hello there \ufffd", "state": "done"}


async def test_a_text_delta_given_as_strings_for_a_part_never_started_is_refused_as_apply_does() -> None:
    from bastion._ui_assembly import InvalidUIMessageChunkError, UIMessageAssembler

    assembler = UIMessageAssembler({"id": "m", "role": "assistant", "parts": []})
    with pytest.raises(InvalidUIMessageChunkError) as by_apply:
        assembler.apply({"type": "text-delta", "id": "t", "delta": "x"})
    with pytest.raises(InvalidUIMessageChunkError) as by_strings:
        assembler.apply_text_delta("t", "x")
    assert str(by_strings.value) == str(by_apply.value)
