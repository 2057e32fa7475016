"""`assemble_ui_messages`: the conversation after a response, as the client holds it, so a script can
continue an approval without the HTTP stack — and the same message the stream stores."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from bastion import (
    InvalidUIMessageChunkError,
    ToolPolicy,
    assemble_ui_messages,
    define_agent,
    reconcile_agent_messages,
    tool,
)
from bastion.chat.stream_response import create_agent_stream_response
from tests.scripted import Call, ScriptedModel

executed: list[str] = []


@tool
async def send_invoice(customer: str) -> dict[str, str]:
    """Send the invoice to a customer."""
    executed.append(customer)
    return {"sent_to": customer}


agent = define_agent(
    name="billing",
    instructions="Send invoices when asked.",
    tools=lambda _: [send_invoice],
    permissions={"send_invoice": ToolPolicy(needs_approval=True)},
)


def user(text: str) -> dict[str, Any]:
    return {"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}


async def turn(model: ScriptedModel, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    session = await agent.prepare(context=None)
    try:
        result = await session.stream(model=model, messages=messages)
        return [chunk async for chunk in result]
    finally:
        await session.close()


async def test_a_script_continues_an_approval_with_the_assembled_messages() -> None:
    executed.clear()
    model = ScriptedModel([Call("send_invoice", {"customer": "ada"}, call_id="call_0")], ["Sent."])
    history = [user("invoice ada")]
    paused = assemble_ui_messages(await turn(model, history), history, message_id="a1")
    assert [m["id"] for m in paused] == ["u1", "a1"]
    [part] = [p for p in paused[1]["parts"] if p["type"] == "tool-send_invoice"]
    assert (part["state"], part["input"]) == ("approval-requested", {"customer": "ada"})
    assert executed == []

    answered = copy.deepcopy(paused)
    [mine] = [p for p in answered[1]["parts"] if p["type"] == "tool-send_invoice"]
    mine["state"] = "approval-responded"
    mine["approval"] = {**mine["approval"], "approved": True}
    canonical = await reconcile_agent_messages(paused, answered, trigger="submit-message")
    done = assemble_ui_messages(await turn(model, canonical), canonical)
    assert [m["id"] for m in done] == ["u1", "a1"]
    [part] = [p for p in done[1]["parts"] if p["type"] == "tool-send_invoice"]
    assert (part["state"], part["output"]) == ("output-available", {"sent_to": "ada"})
    assert [p["text"] for p in done[1]["parts"] if p["type"] == "text"] == ["Sent."]
    assert executed == ["ada"]
    assert paused[1]["parts"][-1]["state"] == "approval-requested"  # the inputs are left as they were


async def test_the_assembled_message_is_the_one_the_stream_stores() -> None:
    model = ScriptedModel([Call("send_invoice", {"customer": "bo"}, call_id="call_0")])
    history = [user("invoice bo")]
    session = await agent.prepare(context=None)
    stored: list[dict[str, Any]] = []

    async def on_finish(*, response_message: dict[str, Any], status: str) -> None:
        stored.append(response_message)

    response = create_agent_stream_response(
        await session.stream(model=model, messages=history),
        original_messages=history,
        on_finish=on_finish,
        message_metadata={"model": "scripted"},
    )
    body = bytearray()
    disconnected = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        body.extend(message.get("body", b""))

    await response({"type": "http", "method": "POST", "headers": []}, receive, send)
    disconnected.set()
    await session.close()
    wire = [
        json.loads(line[len("data: ") :])
        for line in body.decode().split("\n\n")
        if line.startswith("data: {")
    ]
    assert wire[0]["type"] == "start" and wire[-1]["type"] == "finish"
    assert assemble_ui_messages(wire, history) == [*history, *stored]
    assert stored[0]["metadata"] == {"model": "scripted"}


def test_the_start_chunk_names_the_message_and_metadata_merges() -> None:
    chunks = [
        {"type": "start", "messageId": "from-server", "messageMetadata": {"a": {"x": 1}}},
        {"type": "start-step"},
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "hi"},
        {"type": "text-end", "id": "t"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "stop", "messageMetadata": {"a": {"y": 2}}},
    ]
    [message] = assemble_ui_messages(chunks, message_id="ignored")
    assert message == {
        "id": "from-server",
        "role": "assistant",
        "parts": [{"type": "step-start"}, {"type": "text", "text": "hi", "state": "done"}],
        "metadata": {"a": {"x": 1, "y": 2}},
    }


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "text-delta", "id": "never-started", "delta": "x"},
        {"type": "tool-output-available", "toolCallId": "unknown", "output": 1},
        {"type": "text-start", "id": "t", "extra": True},
        {"type": "no-such-chunk"},
    ],
)
def test_a_chunk_the_client_would_refuse_is_refused(chunk: dict[str, Any]) -> None:
    with pytest.raises(InvalidUIMessageChunkError):
        assemble_ui_messages([{"type": "start-step"}, chunk])
