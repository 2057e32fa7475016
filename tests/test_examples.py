"""The README's code and the examples run, so the documentation cannot drift from the API."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
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


async def test_the_readme_code_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert len(blocks) >= 2
    model = ScriptedModel([Call("get_identity", {})], ["You are user-1."])
    namespace: dict[str, Any] = {"model": model}
    exec(blocks[0], namespace)
    body = textwrap.indent("\n".join(blocks[1:]), "    ")
    exec(f"async def _readme_turn():\n{body}\n    return chunks\n", namespace)
    chunks = await namespace["_readme_turn"]()
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"user_id": "user-1"}
