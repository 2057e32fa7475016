"""What only the SQLite store has: its own migrations, its file, its thread, and rules written into
every statement (there is no row-level security to fall back on). The contract it shares with
Postgres is tested in `test_store_conformance.py`."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from bastion.persistence import RunInput, RunOutcome
from bastion.stores import MigrationChangedError, SqliteStore, StoreIdentity, TurnContext
from bastion.stores import _sqlite_connection as sqlite_connection
from bastion.stores import _sqlite_statements as sqlite_statements
from bastion.stores import _sqlite_turn_persistence as sqlite_turns
from bastion.stores import sqlite as sqlite_module
from bastion.stores.sqlite import available_sqlite_migrations


def identity(tenant: str | None = None) -> StoreIdentity:
    return StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=tenant)


def user_message(message_id: str) -> dict[str, object]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": "hello"}]}


async def test_migrations_apply_once_each(tmp_path: Path) -> None:
    versions = [migration.version for migration in available_sqlite_migrations()]
    async with await SqliteStore.open(tmp_path / "db.sqlite3") as store:
        assert await store.migrate() == versions
        assert await store.migrate() == []


async def test_a_migration_changed_after_it_was_applied_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    async with await SqliteStore.open(path) as store:
        await store.migrate()
    with sqlite3.connect(path) as conn:
        conn.execute("update bastion_migrations set checksum = 'x' where version = 1")
    async with await SqliteStore.open(path) as store:
        with pytest.raises(MigrationChangedError):
            await store.migrate()


async def test_a_failing_migration_leaves_the_database_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = [*available_sqlite_migrations()]
    broken.append(type(broken[0])(99, "broken", "create table bastion_extra (x integer);\nselect nope;\n"))
    monkeypatch.setattr(sqlite_module, "available_sqlite_migrations", lambda: broken)
    path = tmp_path / "db.sqlite3"
    async with await SqliteStore.open(path) as store:
        with pytest.raises(sqlite3.OperationalError):
            await store.migrate()
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("select name from sqlite_master where type = 'table'")}
    assert not tables & {"bastion_conversations", "bastion_extra", "bastion_migrations"}


async def test_upgrade_migration_keys_existing_operations_so_only_an_approved_call_is_found_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    owner = identity()
    async with await SqliteStore.open(path) as store:
        assert await store.migrate(upto=1) == [1]
    conversation_id = str(uuid.uuid4())
    approved = {
        "id": "a1",
        "role": "assistant",
        "parts": [
            {
                "type": "tool-delete_file",
                "toolCallId": "call_0",
                "state": "output-available",
                "input": {"path": "/x"},
                "output": "deleted",
                "approval": {"id": "ap-1", "approved": True},
            },
            {
                "type": "tool-lookup",
                "toolCallId": "call_9",
                "state": "output-available",
                "input": {},
                "output": 1,
            },
        ],
    }
    with sqlite3.connect(path) as conn:
        # A database of that release holds rows written by that release's statements.
        conn.execute(
            "insert into bastion_conversations (id, owner_id, created_at, updated_at) values (?, ?, 0, 0)",
            (conversation_id, owner.user_id),
        )
        conn.execute(
            "insert into bastion_messages (conversation_id, owner_id, seq, id, role, message, created_at) "
            "values (?, ?, 1, 'a1', 'assistant', ?, 0)",
            (conversation_id, owner.user_id, json.dumps(approved)),
        )
        conn.execute(
            "insert into bastion_runs (id, conversation_id, owner_id, request_id, status, lease_expires_at, "
            "started_at) values ('run-1', ?, ?, 'r1', 'completed', 0, 0)",
            (conversation_id, owner.user_id),
        )
        for call, name, output in (("call_0", "delete_file", '"deleted"'), ("call_9", "lookup", "1")):
            conn.execute(
                "insert into bastion_tool_executions (conversation_id, tool_call_id, run_id, owner_id, "
                "tool_name, "
                "input, status, output, started_at) values (?, ?, 'run-1', ?, ?, '{}', 'completed', ?, 0)",
                (conversation_id, call, owner.user_id, name, output),
            )
    async with await SqliteStore.open(path) as store:
        assert await store.migrate(upto=2) == [2]
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "select tool_call_id, operation_key, output from bastion_tool_executions order by tool_call_id"
        ).fetchall()
    assert rows == [("call_0", "approval/ap-1", '"deleted"'), ("call_9", "legacy/call_9", "1")]


async def test_conversations_survive_closing_and_reopening_the_file(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    alice = identity("tenant-a")
    async with await SqliteStore.open(path) as store:
        await store.migrate()
        conversation = await store.create_conversation(alice, title="kept")
        persistence = store.persistence()
        ctx = TurnContext(identity=alice, conversation_id=conversation.id, request_id="r1")
        start = await persistence.start_run(
            ctx, RunInput(messages=[user_message("u1")], trigger="submit-message")
        )
        await persistence.finish_run(ctx, start.state, RunOutcome(status="completed"))
    async with await SqliteStore.open(path) as store:
        assert [c.title for c in await store.list_conversations(alice)] == ["kept"]
        assert [m.id for m in await store.list_messages(alice, conversation.id)] == ["u1"]


async def test_an_in_memory_database_works_for_one_store(tmp_path: Path) -> None:
    async with await SqliteStore.open(":memory:") as store:
        await store.migrate()
        alice = identity()
        conversation = await store.create_conversation(alice)
        assert (await store.get_conversation(alice, conversation.id)).id == conversation.id


async def test_a_closed_store_refuses_further_calls(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "db.sqlite3")
    await store.migrate()
    await store.close()
    await store.close()
    with pytest.raises(RuntimeError):
        await store.list_conversations(identity())


def test_every_statement_filters_on_the_callers_owner_and_tenant() -> None:
    # Lease renewal is this process's own: it touches only runs this worker is running, by its key.
    process_statements = {"RENEW_WORKER_LEASES"}
    store_modules = (sqlite_module, sqlite_statements, sqlite_turns, sqlite_connection)
    statements = {
        name: value
        for module in store_modules
        for name, value in vars(module).items()
        if name.isupper()
        and isinstance(value, str)
        and "bastion_" in value
        and name not in process_statements
    }
    assert len(statements) >= 25
    for name, statement in statements.items():
        assert ":owner" in statement and ":tenant" in statement, name


async def test_the_schema_refuses_a_message_whose_owner_is_not_its_conversations(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    alice = identity()
    async with await SqliteStore.open(path) as store:
        await store.migrate()
        conversation = await store.create_conversation(alice)
    with sqlite3.connect(path) as conn:
        conn.execute("pragma foreign_keys = on")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "insert into bastion_messages (conversation_id, owner_id, seq, id, role, message, "
                "created_at) values (?, ?, 1, 'm1', 'user', ?, 0)",
                (conversation.id, str(uuid.uuid4()), '{"id":"m1","role":"user"}'),
            )


@pytest.mark.parametrize(
    ("window", "lease", "problem"),
    [
        (0, 1.0, "history_window must be a positive integer."),
        (True, 1.0, "history_window must be a positive integer."),
        (1, -1.0, "lease_seconds must be between 0 and 86400."),
        (1, 86_401.0, "lease_seconds must be between 0 and 86400."),
    ],
    ids=["0", "bool", "neg", "day"],
)
async def test_persistence_options_are_checked(
    tmp_path: Path, window: int, lease: float, problem: str
) -> None:
    async with await SqliteStore.open(tmp_path / "db.sqlite3") as store:
        with pytest.raises(ValueError) as refused:
            store.persistence(history_window=window, lease_seconds=lease)
    assert str(refused.value) == problem


async def test_persistence_options_at_their_limits_are_accepted(tmp_path: Path) -> None:
    async with await SqliteStore.open(tmp_path / "db.sqlite3") as store:
        store.persistence(history_window=1, lease_seconds=86_400)
        store.persistence(history_window=1, lease_seconds=0)
