"""How the UI message stream's events are grouped into the response's writes."""

from __future__ import annotations

import asyncio

import pytest

from bastion.chat.stream_response import _EventChannel

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
