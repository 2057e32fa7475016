"""`run_agent`: one persisted turn without HTTP, on every store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import pytest
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import ToolError, define_agent, tool
from bastion.chat.headless_turn import AgentRunContext, ConversationNotFoundError, run_agent
from bastion.stores import PostgresStore, SqliteStore, StoreIdentity
from tests.scripted import Call, ScriptedModel

Store: TypeAlias = PostgresStore | SqliteStore


@pytest.fixture(params=["postgres", "sqlite"])
def store(request: pytest.FixtureRequest) -> Store:
    opened: Store = request.getfixturevalue(f"{request.param}_store")
    return opened


plain = define_agent(name="helper", instructions="Help.")


def user() -> str:
    return str(uuid.uuid4())


async def test_a_run_creates_a_conversation_for_the_agent_and_saves_the_turn(store: Store) -> None:
    alice = user()
    result = await run_agent(
        plain, message="Hello there", model=ScriptedModel(["Hi, Alice."]), store=store, user_id=alice
    )
    assert result.status == "completed"
    assert result.text == "Hi, Alice."
    identity = StoreIdentity(user_id=alice)
    conversation = await store.get_conversation(identity, result.conversation_id)
    assert conversation.agent_name == "helper"
    assert conversation.title == "Hello there"
    stored = await store.list_messages(identity, result.conversation_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[1].message == result.message


async def test_a_run_continues_a_conversation_with_its_stored_history(store: Store) -> None:
    alice = user()
    model = ScriptedModel(["First answer."], ["Second answer."])
    first = await run_agent(plain, message="one", model=model, store=store, user_id=alice, tenant_id="t1")
    second = await run_agent(
        plain,
        message="two",
        model=model,
        store=store,
        user_id=alice,
        tenant_id="t1",
        conversation_id=first.conversation_id,
    )
    assert second.conversation_id == first.conversation_id
    assert second.text == "Second answer."
    seen = str(model.requests[1].messages)
    assert "one" in seen and "First answer." in seen
    identity = StoreIdentity(user_id=alice, tenant_id="t1")
    assert len(await store.list_messages(identity, first.conversation_id)) == 4


async def test_a_foreign_and_a_missing_conversation_raise_the_same_error(store: Store) -> None:
    alice, mallory = user(), user()
    owned = await run_agent(plain, message="mine", model=ScriptedModel(["ok"]), store=store, user_id=alice)
    model = ScriptedModel()
    errors = []
    for conversation_id in (owned.conversation_id, str(uuid.uuid4())):
        with pytest.raises(ConversationNotFoundError) as refused:
            await run_agent(
                plain, message="x", model=model, store=store, user_id=mallory, conversation_id=conversation_id
            )
        errors.append((refused.value.code, str(refused.value)))
    assert errors[0] == errors[1] == ("not_found", "The conversation was not found.")
    # The same user in another tenant is someone else too.
    with pytest.raises(ConversationNotFoundError):
        await run_agent(
            plain,
            message="x",
            model=model,
            store=store,
            user_id=alice,
            tenant_id="elsewhere",
            conversation_id=owned.conversation_id,
        )
    assert model.calls == 0
    assert len(await store.list_messages(StoreIdentity(user_id=alice), owned.conversation_id)) == 2


def counting_tools(calls: list[str]) -> Any:
    def tools(context: AgentRunContext) -> list[Any]:
        @tool
        async def add_note(text: str) -> dict[str, str]:
            """Add a note."""
            calls.append(text)
            return {"saved": text}

        return [add_note]

    return tools


async def test_tool_calls_go_through_the_operation_claims(store: Store) -> None:
    calls: list[str] = []
    agent = define_agent(name="notes", instructions="Take notes.", tools=counting_tools(calls))
    model = ScriptedModel([Call("add_note", {"text": "milk"}, call_id="c1")], ["Saved."])
    alice = user()
    result = await run_agent(agent, message="note milk", model=model, store=store, user_id=alice)
    assert calls == ["milk"]
    assert result.text == "Saved."
    events = await store.list_events(StoreIdentity(user_id=alice), result.conversation_id)
    kinds = [event.type for event in events]
    assert kinds[:3] == ["run.started", "tool.started", "tool.completed"]
    assert kinds[-1] == "run.completed"


async def test_a_child_agent_started_by_a_tool_acts_as_the_same_user(store: Store) -> None:
    child = define_agent(name="researcher", instructions="Research.")

    def tools(context: AgentRunContext) -> list[Any]:
        @tool
        async def research(topic: str) -> str:
            """Ask the researcher."""
            found = await context.run_agent(child, message=f"research {topic}")
            return found.text

        return [research]

    parent = define_agent(name="lead", instructions="Delegate.", tools=tools)
    model = ScriptedModel([Call("research", {"topic": "owls"})], ["Owls hoot."], ["They hoot."])
    alice, bob = user(), user()
    result = await run_agent(parent, message="owls?", model=model, store=store, user_id=alice, tenant_id="t1")
    assert result.text == "They hoot."
    mine = await store.list_conversations(StoreIdentity(user_id=alice, tenant_id="t1"))
    assert sorted(c.agent_name or "" for c in mine) == ["lead", "researcher"]
    assert await store.list_conversations(StoreIdentity(user_id=bob, tenant_id="t1")) == []


async def test_the_conversation_state_is_never_sent_to_the_model(store: Store) -> None:
    seen: list[list[ModelMessage]] = []

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        seen.append(messages)
        yield "done"

    result = await run_agent(
        plain,
        message="hello",
        model=FunctionModel(stream_function=answer),
        store=store,
        user_id=user(),
        state={"secret_plan": "MARKER-7431"},
    )
    assert result.text == "done"
    assert seen and "MARKER-7431" not in repr(seen)


async def test_a_failed_model_is_saved_as_a_failed_turn_and_the_conversation_stays_usable(
    store: Store,
) -> None:
    async def broken(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        raise RuntimeError("provider down")
        yield ""

    alice = user()
    first = await run_agent(plain, message="one", model=ScriptedModel(["ok"]), store=store, user_id=alice)
    with pytest.raises(RuntimeError, match="provider down"):
        await run_agent(
            plain,
            message="two",
            model=FunctionModel(stream_function=broken),
            store=store,
            user_id=alice,
            conversation_id=first.conversation_id,
        )
    events = await store.list_events(StoreIdentity(user_id=alice), first.conversation_id)
    assert events[-1].type == "run.failed"
    again = await run_agent(
        plain,
        message="three",
        model=ScriptedModel(["back"]),
        store=store,
        user_id=alice,
        conversation_id=first.conversation_id,
    )
    assert again.text == "back"


async def test_tools_that_cannot_be_opened_fail_the_turn_before_the_model_is_asked(store: Store) -> None:
    """A failure before the stream (here the tools' factory) is saved as a failed turn, as the route's is."""

    def tools(context: AgentRunContext) -> Any:
        raise ToolError("The docs connection is unreachable.")

    unopenable = define_agent(name="helper", instructions="Help.", tools=tools)
    model = ScriptedModel(["never"])
    alice = user()
    first = await run_agent(plain, message="one", model=ScriptedModel(["ok"]), store=store, user_id=alice)
    with pytest.raises(ToolError, match="unreachable"):
        await run_agent(
            unopenable,
            message="two",
            model=model,
            store=store,
            user_id=alice,
            conversation_id=first.conversation_id,
        )
    assert model.calls == 0
    events = await store.list_events(StoreIdentity(user_id=alice), first.conversation_id)
    assert [event.type for event in events][-2:] == ["run.started", "run.failed"]
    again = await run_agent(
        plain,
        message="three",
        model=ScriptedModel(["back"]),
        store=store,
        user_id=alice,
        conversation_id=first.conversation_id,
    )
    assert again.text == "back"
