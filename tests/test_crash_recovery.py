"""A worker process killed with SIGKILL in the middle of a turn: the conversation is free again at once.

The child process claims a turn and starts a tool call, then is killed. Its run has a ten-minute
lease; the parent (another process, or the same one started again) claims the conversation without
waiting for it, the dead run is recorded as interrupted, and the call it left in flight is uncertain
(an idempotent tool's runs again under the same key). Everything the child stored is kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg

import bastion
from bastion.persistence import RunInput, RunOutcome, ToolOperation
from bastion.stores import PostgresStore, SqliteStore, StoreIdentity, ToolOperationUncertainError, TurnContext
from tests.conftest import MigratedDatabase

SOURCES = str(Path(bastion.__file__).resolve().parents[1])

CHILD = """
import asyncio, json, sys
from bastion.persistence import RunInput, ToolOperation
from bastion.stores import PostgresStore, SqliteStore, StoreIdentity, TurnContext

async def main(kind, where, user, conversation):
    store = await (PostgresStore.open(where) if kind == "postgres" else SqliteStore.open(where))
    persistence = store.persistence(lease_seconds=600)
    who = StoreIdentity(user_id=user)
    context = TurnContext(identity=who, conversation_id=conversation, request_id="child")
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "send it"}]}
    start = await persistence.start_run(context, RunInput(messages=[message], trigger="submit-message"))
    running = asyncio.Event()

    async def send():
        running.set()
        await asyncio.Event().wait()

    for key in ("op/send", "op/save"):
        operation = ToolOperation(name="send", tool_call_id="call_0", input={}, execute=send, key=key)
        asyncio.ensure_future(persistence.execute_tool(context, start.state, operation))
        await running.wait()
        running.clear()
    print(json.dumps({"run": start.state.run_id, "worker": store.worker_key}), flush=True)
    await asyncio.Event().wait()

asyncio.run(main(*sys.argv[1:]))
"""


async def run_and_kill_child(kind: str, where: str, user: str, conversation: str) -> dict[str, Any]:
    """Start the child, wait until its calls are running, then SIGKILL it; what it reported."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [SOURCES, os.environ.get("PYTHONPATH")]))}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, kind, where, user, conversation,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        line = await asyncio.wait_for(child.stdout.readline(), timeout=60)  # type: ignore[union-attr]
        assert line, (await child.stderr.read()).decode()  # type: ignore[union-attr]
        reported: dict[str, Any] = json.loads(line)
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL
    return reported


def operation(key: str, calls: list[str], *, idempotent: bool = False) -> ToolOperation:
    async def send() -> str:
        calls.append(key)
        return "sent"

    return ToolOperation(
        name="send", tool_call_id="call_0", input={}, execute=send, key=key, idempotent=idempotent
    )


async def take_over(store: PostgresStore | SqliteStore, who: StoreIdentity, conversation: str) -> list[str]:
    """Claim the conversation the dead child held and retry its calls: what ran again."""
    persistence = store.persistence()
    context = TurnContext(identity=who, conversation_id=conversation, request_id="after")
    message = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "send it"}]}
    start = await persistence.start_run(context, RunInput(messages=[message], trigger="submit-message"))
    calls: list[str] = []
    try:
        await persistence.execute_tool(context, start.state, operation("op/send", calls))
    except ToolOperationUncertainError:
        pass
    else:
        raise AssertionError("A call the dead process left in flight ran again.")
    assert (
        await persistence.execute_tool(context, start.state, operation("op/save", calls, idempotent=True))
        == "sent"
    )
    await persistence.finish_run(context, start.state, RunOutcome(status="completed"))
    return calls


async def test_a_postgres_worker_killed_mid_turn_frees_its_conversation_at_once(
    postgres_store: PostgresStore, migrated_database: MigratedDatabase
) -> None:
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    conversation = await postgres_store.create_conversation(who)
    reported = await run_and_kill_child("postgres", migrated_database.app_dsn, who.user_id, conversation.id)
    # The server ends the dead client's session (and its lock) as soon as it sees the socket close.
    async with await psycopg.AsyncConnection.connect(migrated_database.admin_dsn, autocommit=True) as conn:
        for _ in range(200):
            cursor = await conn.execute("select bastion.worker_alive(%s)", (reported["worker"],))
            row = await cursor.fetchone()
            if row is not None and not row[0]:
                break
            await asyncio.sleep(0.05)
    assert await take_over(postgres_store, who, conversation.id) == ["op/save"]
    events = await postgres_store.list_events(who, conversation.id)
    assert ("run.interrupted", reported["run"]) in [(event.type, event.run_id) for event in events]
    assert [m.id for m in await postgres_store.list_messages(who, conversation.id)] == ["u1"]


async def test_a_sqlite_process_started_again_after_sigkill_frees_its_predecessors_conversation(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "bastion.sqlite3")
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    async with await SqliteStore.open(path) as before:
        await before.migrate()
        conversation = await before.create_conversation(who)
    reported = await run_and_kill_child("sqlite", path, who.user_id, conversation.id)
    async with await SqliteStore.open(path) as restarted:
        assert await take_over(restarted, who, conversation.id) == ["op/save"]
        events = await restarted.list_events(who, conversation.id)
        assert ("run.interrupted", reported["run"]) in [(event.type, event.run_id) for event in events]
