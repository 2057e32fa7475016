"""Conversations the hooks tests replay: turns driven through the Postgres store's persistence, with
every kind of outcome, so the outbox holds every event type."""

from __future__ import annotations

import contextlib
import copy
import uuid
from typing import Any

from bastion.hooks import PostgresHookOutbox
from bastion.persistence import RunInput, RunOutcome, ToolOperation
from bastion.stores import PostgresStore, StoreIdentity, TurnContext

SUBMIT = "submit-message"


def user_message(message_id: str, text: str = "hello") -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def assistant_message(message_id: str, text: str = "hi") -> dict[str, Any]:
    return {"id": message_id, "role": "assistant", "parts": [{"type": "text", "text": text}]}


async def turn(
    store: PostgresStore,
    who: StoreIdentity,
    conversation_id: str,
    messages: list[Any],
    response: dict[str, Any] | None,
    *,
    status: str = "completed",
    trigger: str = SUBMIT,
) -> str:
    context = TurnContext(identity=who, conversation_id=conversation_id, request_id=str(uuid.uuid4()))
    persistence = store.persistence()
    start = await persistence.start_run(context, RunInput(messages=messages, trigger=trigger))
    await persistence.finish_run(context, start.state, RunOutcome(status=status, response_message=response))  # type: ignore[arg-type]
    return start.state.run_id


def approval_request(message_id: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-delete_file",
                "toolCallId": "call-1",
                "state": "approval-requested",
                "input": {"path": "/tmp/x"},
                "approval": {"id": "approval-1"},
            },
        ],
    }


def answered(message: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(message)
    result["parts"][1]["state"] = "approval-responded"
    result["parts"][1]["approval"] = {"id": "approval-1", "approved": True}
    return result


def continued(message: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(message)
    result["parts"][1].update(state="output-available", output={"deleted": True})
    result["parts"] += [{"type": "step-start"}, {"type": "text", "text": "Deleted."}]
    return result


async def conversation_of_every_kind(store: PostgresStore, who: StoreIdentity) -> str:
    """Completed, approval asked and answered, failed, cancelled and edited turns."""
    conversation = (await store.create_conversation(who)).id
    await turn(store, who, conversation, [user_message("u1")], assistant_message("a1"))
    await turn(store, who, conversation, [user_message("u2")], approval_request("a2"))
    history = [m.message for m in await store.list_messages(who, conversation)]
    history[-1] = answered(history[-1])
    await turn(store, who, conversation, history, continued(history[-1]))
    await turn(
        store, who, conversation, [user_message("u3")], assistant_message("a3", "partial"), status="failed"
    )
    await turn(
        store, who, conversation, [user_message("u4")], assistant_message("a4", "cut"), status="cancelled"
    )
    history = [m.message for m in await store.list_messages(who, conversation)][:-2]
    await turn(store, who, conversation, [*history, user_message("u4", "again")], assistant_message("a5"))
    return conversation


async def every_event_type(store: PostgresStore, who: StoreIdentity) -> str:
    """A conversation whose events are of every type: `conversation_of_every_kind`, plus tool calls
    that complete and fail and a run replaced after its lease expired."""
    conversation = await conversation_of_every_kind(store, who)
    persistence = store.persistence()
    context = TurnContext(identity=who, conversation_id=conversation, request_id=str(uuid.uuid4()))
    start = await persistence.start_run(context, RunInput(messages=[user_message("u6")], trigger=SUBMIT))

    async def works() -> str:
        return "done"

    async def breaks() -> str:
        raise RuntimeError("the tool broke")

    await persistence.execute_tool(
        context,
        start.state,
        ToolOperation(name="lookup", tool_call_id="t1", input={}, execute=works, key="op/t1"),
    )
    with contextlib.suppress(RuntimeError):
        await persistence.execute_tool(
            context,
            start.state,
            ToolOperation(name="lookup", tool_call_id="t2", input={}, execute=breaks, key="op/t2"),
        )
    await persistence.finish_run(
        context, start.state, RunOutcome(status="completed", response_message=assistant_message("a6"))
    )
    expiring = store.persistence(lease_seconds=0)
    context = TurnContext(identity=who, conversation_id=conversation, request_id=str(uuid.uuid4()))
    await expiring.start_run(context, RunInput(messages=[user_message("u7")], trigger=SUBMIT))
    await turn(store, who, conversation, [user_message("u7")], assistant_message("a7"))
    return conversation


async def drain(outbox: PostgresHookOutbox, hook: str) -> list[Any]:
    """Everything `hook` takes, window by window, moving its position as delivery would."""
    taken: list[Any] = []
    while True:
        async with outbox.window(hook, limit=3) as opened:
            assert opened is not None
            conn, window = opened
            taken += window.events
            if window.position is None:
                return taken
            await outbox.advance(conn, hook, window.position)
