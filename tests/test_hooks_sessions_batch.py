"""`persist_sessions` writes a batch in one statement with exactly the effect of its events delivered
one at a time, in order: redeliveries, updates and deletions included, anonymous users skipped; and
the previous version's entry point, given the batch that version built, writes the same rows."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from psycopg.types.json import Jsonb

from bastion.hooks import HookEvent, PostgresHookOutbox, persist_sessions
from bastion.stores import PostgresStore, StoreIdentity
from tests.hook_scenarios import (
    assistant_message,
    conversation_of_every_kind,
    every_event_type,
    turn,
    user_message,
)
from tests.hooks_db import HooksDatabase, as_user, someone
from tests.previous_sessions import previous_batch
from tests.test_hooks_sessions import chat_path, every_event, expected_path, runs_and_copies

# `ai_chats.created_at` is the time of the insert, not of an event: like `updated_at`, it differs.
_UNCOMPARED = {"updated_at", "ai_chats.created_at"}


def chat_rows(database: HooksDatabase, chats: list[str] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the chat tables (of `chats`, if given), whole but for the columns the time of
    writing sets."""
    rows = {}
    for table, chat, key in (
        ("ai_chats", "id", "id"),
        ("ai_messages", "chat_id", "chat_id, id"),
        ("ai_runs", "chat_id", "id"),
    ):
        columns = [
            name
            for (name,) in database.rows(
                "select column_name from information_schema.columns"
                " where table_schema = 'bastion' and table_name = %s order by ordinal_position",
                table,
            )
            if name not in _UNCOMPARED and f"{table}.{name}" not in _UNCOMPARED
        ]
        # As text: a JSON null and no value (SQL null), or `true` and `1`, differ.
        listed = ", ".join(f"{name}::text" for name in columns)
        rows[table] = database.rows(
            f"select {listed} from bastion.{table} where %s::uuid[] is null or {chat} = any(%s::uuid[])"
            f" order by {key}",
            chats,
            chats,
        )
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


async def several_users_conversations(
    store: PostgresStore,
) -> tuple[dict[StoreIdentity, str], list[HookEvent]]:
    """Two signed-in users' conversations of every kind and an anonymous one, and a batch of their
    events interleaved and redelivered (see `redelivered`)."""
    ada, bob, nobody = someone(), someone("tenant-b"), someone(anonymous=True)
    conversations = {
        ada: await conversation_of_every_kind(store, ada),
        bob: await every_event_type(store, bob),
    }
    anonymous = (await store.create_conversation(nobody)).id
    await turn(store, nobody, anonymous, [user_message("n1")], assistant_message("n2"))
    events = await every_event(store)
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
    return conversations, batch


async def test_a_batch_of_several_users_conversations_writes_what_its_events_one_by_one_write(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    conversations, batch = await several_users_conversations(hooks_store)
    hook = persist_sessions(hooks_store.pool, agent_id="support", title="Support")
    for event in batch:
        await hook.handle(event)
    one_by_one = chat_rows(hooks_database)
    truncate_chat_tables(hooks_database)
    assert hook.handle_batch is None and hook.handle_event_ids is not None
    await hook.handle_event_ids([event.id for event in batch])
    assert chat_rows(hooks_database) == one_by_one

    # And what one by one writes is the conversations themselves; the anonymous one is not copied.
    (ada, ada_conversation), (bob, bob_conversation) = conversations.items()
    chats = hooks_database.rows(
        "select conversation_id::text, owner_id::text, tenant_id, agent_id, title, active_run_id"
        " from bastion.ai_chats order by tenant_id"
    )
    assert chats == [
        (ada_conversation, ada.user_id, "tenant-a", "support", "Support", None),
        (bob_conversation, bob.user_id, "tenant-b", "support", "Support", None),
    ]
    for who, conversation in conversations.items():
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


async def test_the_previous_versions_batch_function_writes_what_the_events_by_id_write(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    _, batch = await several_users_conversations(hooks_store)
    hook = persist_sessions(hooks_store.pool, agent_id="support", title="Support")
    assert hook.handle_event_ids is not None
    await hook.handle_event_ids([event.id for event in batch])
    by_id = chat_rows(hooks_database)
    truncate_chat_tables(hooks_database)
    await write_previous_batch(hooks_store, previous_batch(batch, "support", "Support"))
    assert chat_rows(hooks_database) == by_id


async def test_odd_event_data_writes_what_the_previous_version_wrote(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    """Final run events whose `runId` is missing, empty, false, zero, another run's or truthy but no
    string; a `run.started` without a run; messages that are no object, with another role, without
    metadata; usage that is no object: each written (or not) as the Python conversion did."""
    ada = someone()
    conversation, run = str(uuid.uuid4()), str(uuid.uuid4())
    await hooks_store.create_conversation(ada, conversation_id=conversation)
    message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    odd: list[tuple[str, str | None, dict[str, Any]]] = [
        ("run.started", None, {}),
        ("run.started", run, {"runId": run}),
        ("message.received", run, {"messageId": "m1", "role": "user", "message": message}),
        (
            "message.completed",
            None,
            {
                "messageId": "m2",
                "parentId": "m1",
                "role": "assistant",
                "message": {"id": "m2", "parts": "none", "metadata": [1]},
            },
        ),
        ("message.completed", run, {"messageId": "m3", "role": "tool", "message": "not an object"}),
        ("message.received", run, {"messageId": "m4", "role": 7, "message": {"metadata": {"k": 1}}}),
        ("message.deleted", None, {"messageId": "m4", "parentId": "m2"}),
        ("message.deleted", None, {"messageId": "zz"}),
    ]
    # Each final event of a run of its own, so that each one's write (or none) shows.
    final_data: list[dict[str, Any]] = [
        {"usage": [1]},
        {"runId": "", "usage": {"tokens": 3}},
        {"runId": None},
        {"runId": 0},
        {"runId": 0.0},
        {"runId": False},
        {"runId": []},
        {"runId": {}, "usage": "lots"},
        {"runId": 5},
        {"runId": True, "usage": {"tokens": 9}},
        {"runId": ["x"]},
        {"runId": str(uuid.uuid4()), "usage": {"tokens": 4}},
    ]
    finals = ["run.waiting_for_approval", "run.completed", "run.failed", "run.cancelled", "run.interrupted"]
    odd += [
        (kind, str(uuid.uuid4()), data)
        for kind, data in zip(itertools.cycle(finals), final_data, strict=False)
    ]
    odd.append(("run.completed", None, {}))
    event_ids = sorted(
        event_id
        for (event_id,) in hooks_database.rows(
            "insert into bastion.hook_events"
            " (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data)"
            " select %s, (r.e ->> 'run_id')::uuid, %s, %s, true, r.e ->> 'type', r.e -> 'data'"
            " from jsonb_array_elements(%s) with ordinality as r (e, ord) order by r.ord returning id",
            conversation,
            ada.user_id,
            ada.tenant_id,
            Jsonb([{"type": kind, "run_id": run_id, "data": data} for kind, run_id, data in odd]),
        )
    )
    events = await PostgresHookOutbox(hooks_store.pool).events(event_ids)
    hook = persist_sessions(hooks_store.pool, title="Odd")
    assert hook.handle_event_ids is not None
    await hook.handle_event_ids(event_ids)
    by_id = chat_rows(hooks_database)
    assert len(by_id["ai_runs"]) == 10 and len(by_id["ai_messages"]) == 3
    truncate_chat_tables(hooks_database)
    await write_previous_batch(hooks_store, previous_batch([events[i] for i in event_ids], None, "Odd"))
    assert chat_rows(hooks_database) == by_id


async def write_previous_batch(store: PostgresStore, batch: list[dict[str, Any]]) -> None:
    async with store.pool.connection() as conn:
        await conn.execute("select bastion.persist_session_events(%s)", (Jsonb(batch),))


def truncate_chat_tables(database: HooksDatabase) -> None:
    database.execute("truncate bastion.ai_chats, bastion.ai_messages, bastion.ai_runs")


async def test_only_the_application_server_may_call_the_functions_writing_the_chat_tables(
    hooks_database: HooksDatabase,
) -> None:
    ada = someone()
    calls = [
        "select bastion.persist_session_events('[]')",
        "select bastion.persist_session_outbox('{}', null, '')",
        "select bastion.apply_session_writes('{}')",
        "select bastion.apply_session_writes_in_order('{}')",
        "select bastion.apply_session_writes_at_once('{}')",
        "select bastion.session_conversations('{}')",
    ]
    for dsn, call in itertools.product((hooks_database.app_dsn, hooks_database.direct_dsn), calls):
        try:
            await as_user(dsn, ada, call)
        except Exception as error:
            assert type(error).__name__ == "InsufficientPrivilege", call
        else:
            raise AssertionError(f"a user called the chat tables' writer: {call}")
    # Not merely stopped by what the function reads: a user may not execute it at all.
    writers = [
        "bastion.persist_session_events(jsonb)",
        "bastion.persist_session_outbox(bigint[], text, text)",
        "bastion.apply_session_writes(bastion.session_write[])",
        "bastion.apply_session_writes_in_order(bastion.session_write[])",
        "bastion.apply_session_writes_at_once(bastion.session_write[])",
        "bastion.session_conversations(uuid[])",
    ]
    granted = hooks_database.rows(
        "select f, has_function_privilege('authenticated', f, 'execute'),"
        " has_function_privilege('anon', f, 'execute'),"
        " has_function_privilege('bastion_runtime', f, 'execute')"
        " from unnest(%s::text[]) f",
        writers,
    )
    assert granted == [(writer, False, False, True) for writer in writers]
