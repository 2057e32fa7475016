"""`persist_sessions` writes a batch in one statement with exactly the effect of its events delivered
one at a time, in order: redeliveries, updates and deletions included, anonymous users skipped."""

from __future__ import annotations

import itertools
from typing import Any

from bastion.hooks import HookEvent, persist_sessions
from bastion.stores import PostgresStore
from tests.hook_scenarios import (
    assistant_message,
    conversation_of_every_kind,
    every_event_type,
    turn,
    user_message,
)
from tests.hooks_db import HooksDatabase, as_user, someone
from tests.test_hooks_sessions import chat_path, every_event, expected_path, runs_and_copies

# `ai_chats.created_at` is the time of the insert, not of an event: like `updated_at`, it differs.
_UNCOMPARED = {"updated_at", "ai_chats.created_at"}


def chat_rows(database: HooksDatabase) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the chat tables, whole but for the columns the time of writing sets."""
    rows = {}
    for table, key in (("ai_chats", "id"), ("ai_messages", "chat_id, id"), ("ai_runs", "id")):
        columns = [
            name
            for (name,) in database.rows(
                "select column_name from information_schema.columns"
                " where table_schema = 'bastion' and table_name = %s order by ordinal_position",
                table,
            )
            if name not in _UNCOMPARED and f"{table}.{name}" not in _UNCOMPARED
        ]
        rows[table] = database.rows(f"select {', '.join(columns)} from bastion.{table} order by {key}")
    return rows


def interleaved(*conversations: list[HookEvent]) -> list[HookEvent]:
    """The conversations' events taken in turn, each conversation's in its own order."""
    mixed = itertools.chain.from_iterable(itertools.zip_longest(*conversations))
    return [event for event in mixed if event is not None]


def redelivered(events: list[HookEvent]) -> list[HookEvent]:
    """`events` with older ones delivered again later: every run's `run.started` after the run's end,
    a user's message after the reply, an assistant message's earlier version after its update, and
    every deletion twice."""
    result = []
    for event in events:
        result.append(event)
        if event.type in ("run.completed", "run.failed", "run.cancelled"):
            result += [e for e in events if e.type == "run.started" and e.run_id == event.run_id]
        if event.type == "message.completed":
            received = [e for e in events if e.type == "message.received" and e.id < event.id]
            result += received[-1:]
            result += [
                e
                for e in events
                if e.type == "message.completed"
                and e.id < event.id
                and e.data["messageId"] == event.data["messageId"]
            ]
        if event.type == "message.deleted":
            result.append(event)
    return result


async def test_a_batch_of_several_users_conversations_writes_what_its_events_one_by_one_write(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada, bob, nobody = someone(), someone("tenant-b"), someone(anonymous=True)
    conversations = {
        ada.user_id: await conversation_of_every_kind(hooks_store, ada),
        bob.user_id: await every_event_type(hooks_store, bob),
    }
    anonymous = (await hooks_store.create_conversation(nobody)).id
    await turn(hooks_store, nobody, anonymous, [user_message("n1")], assistant_message("n2"))
    events = await every_event(hooks_store)
    by_conversation = [
        [event for event in events if event.conversation_id == conversation]
        for conversation in (*conversations.values(), anonymous)
    ]
    batch = redelivered(interleaved(*by_conversation))
    kinds = [event.type for event in batch]
    assert {"message.deleted", "run.interrupted", "run.waiting_for_approval"} <= set(kinds)
    completed = [event.data["messageId"] for event in batch if event.type == "message.completed"]
    assert len(completed) > len(set(completed))  # an assistant message updated after its approval
    assert len(batch) > len({event.id for event in batch})
    assert any(not event.signed_in for event in batch) and len(batch) > 60

    hook = persist_sessions(hooks_store.pool, agent_id="support", title="Support")
    for event in batch:
        await hook.handle(event)
    one_by_one = chat_rows(hooks_database)
    hooks_database.execute("truncate bastion.ai_chats, bastion.ai_messages, bastion.ai_runs")
    assert hook.handle_batch is not None
    await hook.handle_batch(batch)
    assert chat_rows(hooks_database) == one_by_one

    # And what one by one writes is the conversations themselves; the anonymous one is not copied.
    chats = hooks_database.rows(
        "select conversation_id::text, owner_id::text, tenant_id, agent_id, title, active_run_id"
        " from bastion.ai_chats order by tenant_id"
    )
    assert chats == [
        (conversations[ada.user_id], ada.user_id, "tenant-a", "support", "Support", None),
        (conversations[bob.user_id], bob.user_id, "tenant-b", "support", "Support", None),
    ]
    for who in (ada, bob):
        conversation = conversations[who.user_id]
        stored = [m.message for m in await hooks_store.list_messages(who, conversation)]
        assert chat_path(hooks_database, conversation) == expected_path(stored)
        runs, copied = runs_and_copies(hooks_database, conversation)
        assert copied == runs
    statuses = hooks_database.rows(
        "select m.status, count(*) from bastion.ai_messages m join bastion.ai_chats c on c.id = m.chat_id"
        " where c.owner_id = %s and m.role = 'assistant' group by m.status order by m.status",
        ada.user_id,
    )
    assert statuses == [("aborted", 1), ("complete", 3), ("error", 1)]


async def test_only_the_application_server_may_call_the_batch_function(hooks_database: HooksDatabase) -> None:
    ada = someone()
    call = "select bastion.persist_session_events('[]')"
    for dsn in (hooks_database.app_dsn, hooks_database.direct_dsn):
        try:
            await as_user(dsn, ada, call)
        except Exception as error:
            assert type(error).__name__ == "InsufficientPrivilege"
        else:
            raise AssertionError("a user called the chat tables' writer")
