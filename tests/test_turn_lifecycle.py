"""`TurnLifecycle`: what every turn does after its claim (prepare, stream, finish, settle), on a real store.

The chat route, durable take-over, `run_agent` and the inbox's bot turn all go through it; their own
tests pin what each caller adds. These pin the lifecycle itself: a turn settles once, what the caller
holds is released and the session's tools are closed however it ends, and the run's status is saved.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import AgentRun, AgentTools, ToolError, define_agent, start_agent_run
from bastion.chat.turn_lifecycle import TurnLifecycle
from bastion.stores import SqliteStore, StoreIdentity
from bastion.stores.entities import TurnContext
from tests.scripted import ScriptedModel, user

IDENTITY = StoreIdentity(user_id=str(uuid.uuid4()))


class Held:
    """What a turn holds (a drain's hold, its tools' resources): counts each release."""

    def __init__(self) -> None:
        self.released = 0
        self.tools_closed = 0

    def release(self) -> None:
        self.released += 1

    async def close_tools(self) -> None:
        self.tools_closed += 1


async def claimed(store: SqliteStore) -> tuple[str, AgentRun[Any, Any]]:
    conversation = await store.create_conversation(IDENTITY, title="t", agent_name="helper")
    context = TurnContext(identity=IDENTITY, conversation_id=conversation.id, request_id=str(uuid.uuid4()))
    run = await start_agent_run(
        persistence=store.persistence(), context=context, messages=[user("hi")], trigger="submit-message"
    )
    return conversation.id, run


async def context_of() -> str:
    return "trusted"


async def test_a_collected_turn_is_saved_and_settles_once(sqlite_store: SqliteStore) -> None:
    held = Held()
    agent = define_agent(
        name="helper", instructions="Help.", tools=lambda context: AgentTools(close=held.close_tools)
    )
    conversation_id, run = await claimed(sqlite_store)
    lifecycle = TurnLifecycle(run, release=held.release)
    result = await lifecycle.open(
        agent, context=context_of, model=ScriptedModel(["Hello."]), messages=run.messages
    )
    reply = await lifecycle.collect(result)
    assert (reply.status, reply.message["parts"][-1]["text"]) == ("completed", "Hello.")
    await lifecycle.settle(status="failed")  # a second settlement changes nothing
    assert (held.released, held.tools_closed) == (1, 1)
    stored = await sqlite_store.list_messages(IDENTITY, conversation_id)
    assert stored[-1].message == reply.message
    events = [event.type for event in await sqlite_store.list_events(IDENTITY, conversation_id)]
    assert events == ["run.started", "run.completed"]


async def test_a_failure_before_the_stream_settles_the_run_as_failed(sqlite_store: SqliteStore) -> None:
    held = Held()

    def tools(context: str) -> Any:
        raise ToolError("The docs connection is unreachable.")

    model = ScriptedModel(["never"])
    conversation_id, run = await claimed(sqlite_store)
    lifecycle = TurnLifecycle(run, release=held.release)
    agent = define_agent(name="helper", instructions="Help.", tools=tools)
    with pytest.raises(ToolError):
        await lifecycle.open(agent, context=context_of, model=model, messages=run.messages)
    assert (model.calls, held.released) == (0, 1)
    events = [event.type for event in await sqlite_store.list_events(IDENTITY, conversation_id)]
    assert events == ["run.started", "run.failed"]


async def test_a_stream_that_fails_saves_what_it_streamed_as_failed(sqlite_store: SqliteStore) -> None:
    held = Held()

    async def breaks(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "Half an answer"
        raise RuntimeError("provider down")

    agent = define_agent(
        name="helper", instructions="Help.", tools=lambda context: AgentTools(close=held.close_tools)
    )
    conversation_id, run = await claimed(sqlite_store)
    lifecycle = TurnLifecycle(run, release=held.release)
    result = await lifecycle.open(
        agent, context=context_of, model=FunctionModel(stream_function=breaks), messages=run.messages
    )
    with pytest.raises(RuntimeError, match="provider down"):
        await lifecycle.collect(result)
    assert (held.released, held.tools_closed) == (1, 1)
    stored = await sqlite_store.list_messages(IDENTITY, conversation_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert "Half an answer" in str(stored[-1].message["parts"])
    events = [event.type for event in await sqlite_store.list_events(IDENTITY, conversation_id)]
    assert events == ["run.started", "run.failed"]


async def test_a_turn_with_no_run_stores_nothing_and_still_closes(sqlite_store: SqliteStore) -> None:
    """The inbox's bot turn: the reply is collected, nothing is stored, the tools are closed."""
    held = Held()
    agent = define_agent(
        name="helper", instructions="Help.", tools=lambda context: AgentTools(close=held.close_tools)
    )
    lifecycle = TurnLifecycle(None)
    result = await lifecycle.open(
        agent, context=context_of, model=ScriptedModel(["Hi."]), messages=[user("hi")]
    )
    reply = await lifecycle.collect(result)
    assert (reply.status, held.tools_closed) == ("completed", 1)
