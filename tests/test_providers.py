"""Each provider extra runs a persisted turn with a tool call end to end against a local fake of that
provider's HTTP API, including a provider that gives every tool call the same id (`call_0`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.models import Model
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from bastion import ToolPolicy, assemble_ui_messages, define_agent, start_agent_run, tool
from bastion.stores import SqliteStore, StoreIdentity, TurnContext
from tests.live_server import live_server
from tests.provider_fakes import Fake

PROVIDERS: dict[str, Callable[[str], Model]] = {
    "openai-chat": lambda url: OpenAIChatModel(
        "fake", provider=OpenAIProvider(base_url=f"{url}/v1", api_key="k")
    ),
    "openai-responses": lambda url: OpenAIResponsesModel(
        "fake", provider=OpenAIProvider(base_url=f"{url}/v1", api_key="k")
    ),
    "anthropic": lambda url: AnthropicModel("fake", provider=AnthropicProvider(base_url=url, api_key="k")),
}
API = {"openai-chat": "chat", "openai-responses": "responses", "anthropic": "messages"}


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[Fake, str]]:
    state = Fake()
    with live_server(state.app()) as url:
        yield state, url


executed: list[str] = []


@tool
async def shout(word: str) -> str:
    """Repeat the word in capitals."""
    executed.append(word)
    return word.upper()


agent = define_agent(
    name="shouter",
    instructions="Shout what the user says.",
    tools=lambda _: [shout],
    permissions={"shout": ToolPolicy()},
)


async def persisted_turn(
    store: SqliteStore, who: StoreIdentity, conversation: str, model: Model, text: str
) -> dict[str, Any]:
    history = [m.message for m in await store.list_messages(who, conversation)]
    incoming = [
        *history,
        {"id": f"u-{uuid.uuid4()}", "role": "user", "parts": [{"type": "text", "text": text}]},
    ]
    run = await start_agent_run(
        persistence=store.persistence(),
        context=TurnContext(identity=who, conversation_id=conversation, request_id=str(uuid.uuid4())),
        messages=incoming,
        trigger="submit-message",
    )
    session = await agent.prepare(context=None, execute_tool=run.execute_tool)
    try:
        result = await session.stream(model=model, messages=run.messages)
        chunks = [chunk async for chunk in result]
    finally:
        await session.close()
    response = assemble_ui_messages(chunks, run.messages)[-1]
    await run.finish(response_message=response, status="completed")
    return response


def user(text: str) -> dict[str, Any]:
    return {"id": f"u-{uuid.uuid4()}", "role": "user", "parts": [{"type": "text", "text": text}]}


def each_answer(messages: list[dict[str, Any]]) -> list[list[tuple[str, Any]]]:
    return [outputs(message) for message in messages if message["role"] == "assistant"]


def outputs(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(p["toolCallId"], p["output"]) for p in message["parts"] if p["type"] == "tool-shout"]


def texts(message: dict[str, Any]) -> list[str]:
    return [p["text"] for p in message["parts"] if p["type"] == "text"]


async def in_memory_turn(model: Model, history: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    incoming = [
        *history,
        {"id": f"u-{uuid.uuid4()}", "role": "user", "parts": [{"type": "text", "text": text}]},
    ]
    session = await agent.prepare(context=None)
    try:
        result = await session.stream(model=model, messages=incoming)
        chunks = [chunk async for chunk in result]
    finally:
        await session.close()
    return assemble_ui_messages(chunks, incoming)


@pytest.fixture
def provider_state(fake: tuple[Fake, str]) -> tuple[Fake, str]:
    fake[0].requests.clear()
    executed.clear()
    return fake


@pytest.mark.parametrize("provider", list(PROVIDERS))
async def test_a_persisted_turn_with_a_tool_call_runs_against_the_providers_http_api(
    provider_state: tuple[Fake, str], provider: str, tmp_path: Path
) -> None:
    state, url = provider_state
    async with await SqliteStore.open(tmp_path / "db.sqlite3") as store:
        await store.migrate()
        who = StoreIdentity(user_id=str(uuid.uuid4()))
        conversation = (await store.create_conversation(who, title="t")).id
        first = await persisted_turn(store, who, conversation, PROVIDERS[provider](url), "hi")
    assert outputs(first) == [("call_0", "HI")]
    assert texts(first) == ["Done: HI"]
    assert executed == ["hi"]
    assert [api for api, _ in state.requests] == [API[provider]] * 2
    assert "shout" in str(state.requests[0][1]["tools"])
    assert "call_0" in str(state.requests[1][1])  # the tool's result went back under the provider's id


@pytest.mark.parametrize("provider", list(PROVIDERS))
async def test_a_provider_that_reuses_call_0_every_turn_gets_each_call_run(
    provider_state: tuple[Fake, str], provider: str
) -> None:
    _, url = provider_state
    model = PROVIDERS[provider](url)
    history = await in_memory_turn(model, [], "hi")
    history = await in_memory_turn(model, history, "bye")
    assert each_answer(history) == [
        [("call_0", "HI")],
        [("call_0", "BYE")],
    ]
    assert [texts(m) for m in history if m["role"] == "assistant"] == [["Done: HI"], ["Done: BYE"]]
    assert executed == ["hi", "bye"]


@pytest.mark.parametrize("provider", ["openai-chat"])
async def test_a_provider_that_reuses_call_0_every_turn_gets_each_call_run_and_persisted(
    provider_state: tuple[Fake, str], provider: str, tmp_path: Path
) -> None:
    _, url = provider_state
    model = PROVIDERS[provider](url)
    async with await SqliteStore.open(tmp_path / "db.sqlite3") as store:
        await store.migrate()
        who = StoreIdentity(user_id=str(uuid.uuid4()))
        conversation = (await store.create_conversation(who, title="t")).id
        await persisted_turn(store, who, conversation, model, "hi")
        second = await persisted_turn(store, who, conversation, model, "bye")
        stored = [m.message for m in await store.list_messages(who, conversation)]
    assert outputs(second) == [("call_0", "BYE")]
    assert executed == ["hi", "bye"]
    assert each_answer(stored) == [
        [("call_0", "HI")],
        [("call_0", "BYE")],
    ]
