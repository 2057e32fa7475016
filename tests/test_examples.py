"""The README's code and the examples run, so the documentation cannot drift from the API."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import mypy.api
from pydantic_ai.models import Model

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


def readme_module() -> str:
    """The README's Python: the first block as a module, the others as the body of one typed turn."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert len(blocks) >= 2
    body = textwrap.indent("\n".join(blocks[1:]), "    ")
    return (
        f"{blocks[0]}\n\n"
        "async def _readme_turn(model: Model) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:\n"
        f"{body}\n    return chunks, messages\n"
    )


async def test_the_readme_code_runs() -> None:
    model = ScriptedModel([Call("get_identity", {})], ["You are user-1."])
    namespace: dict[str, Any] = {"Any": Any, "Model": Model}
    exec(readme_module(), namespace)
    chunks, messages = await namespace["_readme_turn"](model)
    [output] = [chunk["output"] for chunk in chunks if chunk["type"] == "tool-output-available"]
    assert output == {"user_id": "user-1"}
    assert [message["role"] for message in messages] == ["user", "assistant"]
    [part] = [part for part in messages[1]["parts"] if part["type"] == "tool-get_identity"]
    assert part["output"] == {"user_id": "user-1"}


def test_the_readme_code_passes_mypy_strict(tmp_path: Path) -> None:
    source = tmp_path / "readme_code.py"
    source.write_text(f"from typing import Any\n\nfrom pydantic_ai.models import Model\n\n{readme_module()}")
    # The project's settings and cache: the lint step has already checked bastion itself.
    stdout, stderr, status = mypy.api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache"), str(source)]
    )
    assert status == 0, stdout + stderr
