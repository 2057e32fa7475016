"""The guide's code and the examples run, so the documentation cannot drift from the API."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.scripted import Call, ScriptedModel

ROOT = Path(__file__).resolve().parent.parent


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def test_the_account_example_hides_the_email_from_the_model_but_not_the_ui() -> None:
    example = load_example("account_agent")
    chunks = await example.main()
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output["email"] == "ada@example.com"
    assert (
        "".join(chunk["delta"] for chunk in chunks if chunk["type"] == "text-delta")
        == "You are on the team plan."
    )


async def test_the_account_example_offers_only_its_listed_tools() -> None:
    example = load_example("account_agent")
    session = await example.agent.prepare(context=example.Caller(user_id="u", email="e", plan="free"))
    assert sorted(session.tool_names) == ["change_plan", "get_account", "load_skill"]
    await session.close()


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)


async def test_the_agents_page_code_runs() -> None:
    """The guide's first agent calls its tool for the verified caller; its one-turn example assembles."""
    defined, one_turn = python_blocks(ROOT / "docs" / "agents.md")[:2]
    namespace: dict[str, Any] = {}
    exec(defined, namespace)
    model = ScriptedModel([Call("get_identity", {})], ["You are user-1."])
    session = await namespace["agent"].prepare(context=namespace["Caller"](user_id="user-1"))
    try:
        result = await session.stream(model=model, messages=[user_text("Who am I?")])
        chunks = [chunk async for chunk in result]
    finally:
        await session.close()
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"user_id": "user-1"}

    turn: dict[str, Any] = {}
    exec(one_turn, turn)
    messages = await turn["one_turn"]()
    assert [message["role"] for message in messages] == ["user", "assistant"]
    assert [part["text"] for part in messages[1]["parts"] if part["type"] == "text"] == ["Hello!"]


def test_the_readme_application_is_the_example_the_tests_run() -> None:
    """The README's application is `examples/chat_app.py` word for word, which test_chat_routes serves."""
    section = (ROOT / "README.md").read_text().split("\n## An application\n", 1)[1].split("\n## ", 1)[0]
    [application] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert application.strip() in (ROOT / "examples" / "chat_app.py").read_text()


def user_text(text: str) -> dict[str, Any]:
    return {"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]}
