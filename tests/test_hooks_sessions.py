"""`persist_sessions`: conversations copied into the canonical chat tables, every write keyed by its
event (a redelivery stores nothing new), owned by the user under row-level security."""

from __future__ import annotations

import uuid
from typing import Any

from bastion.hooks import (
    HookEvent,
    PostgresHookOutbox,
    canonical_parts,
    chat_id_of,
    persist_sessions,
)
from bastion.stores import PostgresStore, StoreIdentity
from tests.hook_scenarios import assistant_message, conversation_of_every_kind, drain, turn, user_message
from tests.hooks_db import HooksDatabase, as_user, someone


def chat_path(database: HooksDatabase, conversation: str) -> list[tuple[Any, ...]]:
    """The chat's messages from its root to its current leaf."""
    chat = chat_id_of(conversation)
    [(leaf,)] = database.rows("select current_leaf_id from bastion.ai_chats where id = %s", chat)
    rows = {
        row[0]: row
        for row in database.rows(
            "select id, parent_id, role, parts, format, native from bastion.ai_messages where chat_id = %s",
            chat,
        )
    }
    path = []
    while leaf is not None:
        path.append(rows[leaf])
        leaf = rows[leaf][1]
    return path[::-1]


def runs_and_copies(
    database: HooksDatabase, conversation: str
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The conversation's runs (id, status) and the `ai_runs` rows copied from them, each by start."""
    runs = database.rows(
        "select id::text, status from bastion.runs where conversation_id = %s order by started_at",
        conversation,
    )
    copied = database.rows(
        "select id::text, status from bastion.ai_runs where chat_id = %s order by started_at",
        chat_id_of(conversation),
    )
    return runs, copied


def expected_path(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    rows, parent = [], None
    for message in messages:
        assistant = message["role"] == "assistant"
        native = message if assistant else None
        rows.append(
            (
                message["id"],
                parent,
                message["role"],
                canonical_parts(message),
                "ai-sdk" if assistant else "canonical",
                native,
            )
        )
        parent = message["id"]
    return rows


async def every_event(store: PostgresStore) -> list[HookEvent]:
    outbox = PostgresHookOutbox(store.pool)
    await outbox.register([persist_sessions(store.pool, name="everything")])
    return await drain(outbox, "everything")


async def test_the_chat_tables_equal_the_conversation_when_every_event_is_delivered_twice(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada = someone()
    conversation = await conversation_of_every_kind(hooks_store, ada)
    hook = persist_sessions(hooks_store.pool, agent_id="support")
    for event in await every_event(hooks_store):
        await hook.handle(event)
        await hook.handle(event)
    stored = [m.message for m in await hooks_store.list_messages(ada, conversation)]
    assert [m["id"] for m in stored] == ["u1", "a1", "u2", "a2", "u3", "a3", "u4", "a5"]
    assert chat_path(hooks_database, conversation) == expected_path(stored)
    runs, copied = runs_and_copies(hooks_database, conversation)
    assert copied == runs
    assert [status for _, status in runs] == [
        "completed",
        "waiting_for_approval",
        "completed",
        "failed",
        "cancelled",
        "completed",
    ]
    chat = hooks_database.rows(
        "select conversation_id::text, owner_id::text, tenant_id, agent_id, active_run_id"
        " from bastion.ai_chats"
    )
    assert chat == [(conversation, ada.user_id, "tenant-a", "support", None)]
    statuses = dict(
        hooks_database.rows("select id, status from bastion.ai_messages where role = 'assistant'")
    )
    assert statuses == {"a1": "complete", "a2": "complete", "a3": "error", "a4": "aborted", "a5": "complete"}
    # The edit kept `u4`'s id and dropped `a4`: the old reply stays in the tree, off the current path.
    assert hooks_database.rows("select parent_id from bastion.ai_messages where id = 'a4'") == [("u4",)]


async def test_a_batch_of_two_conversations_delivered_twice_in_one_call_copies_each_as_event_by_event(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada, bob = someone(), someone()
    conversations = [
        await conversation_of_every_kind(hooks_store, ada),
        await conversation_of_every_kind(hooks_store, bob),
    ]
    hook = persist_sessions(hooks_store.pool, agent_id="support")
    assert hook.handle_event_ids is not None
    event_ids = [event.id for event in await every_event(hooks_store)]
    await hook.handle_event_ids(event_ids)
    await hook.handle_event_ids(event_ids)
    for who, conversation in zip((ada, bob), conversations, strict=True):
        stored = [m.message for m in await hooks_store.list_messages(who, conversation)]
        assert chat_path(hooks_database, conversation) == expected_path(stored)
        runs, copied = runs_and_copies(hooks_database, conversation)
        assert copied == runs and len(runs) == 6
    assert hooks_database.rows("select count(*), count(active_run_id) from bastion.ai_chats") == [(2, 0)]


async def test_a_run_started_delivered_again_after_the_run_finished_opens_no_second_run(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada = someone()
    conversation = (await hooks_store.create_conversation(ada)).id
    await turn(hooks_store, ada, conversation, [user_message("u1")], assistant_message("a1"))
    hook = persist_sessions(hooks_store.pool)
    events = await every_event(hooks_store)
    for event in events:
        await hook.handle(event)
    [started] = [event for event in events if event.type == "run.started"]
    await hook.handle(started)
    assert hooks_database.rows("select status, assistant_message_id from bastion.ai_runs") == [
        ("completed", "a1")
    ]
    assert hooks_database.rows("select active_run_id from bastion.ai_chats") == [(None,)]
    # An older message event delivered again does not roll the message back either.
    [received] = [event for event in events if event.type == "message.received"]
    await hook.handle(received)
    assert hooks_database.rows("select current_leaf_id from bastion.ai_chats") == [("a1",)]


async def test_conversations_without_a_signed_in_user_are_skipped(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    nobody = someone(anonymous=True)
    conversation = (await hooks_store.create_conversation(nobody)).id
    await turn(hooks_store, nobody, conversation, [user_message("u1")], assistant_message("a1"))
    hook = persist_sessions(hooks_store.pool)
    events = await every_event(hooks_store)
    assert events and not any(event.signed_in for event in events)
    for event in events:
        await hook.handle(event)
    assert hooks_database.rows("select count(*) from bastion.ai_chats") == [(0,)]


async def test_another_user_cannot_read_a_users_chat_rows(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada, bob = someone(), someone()
    conversation = (await hooks_store.create_conversation(ada)).id
    await turn(hooks_store, ada, conversation, [user_message("u1")], assistant_message("a1"))
    hook = persist_sessions(hooks_store.pool)
    for event in await every_event(hooks_store):
        await hook.handle(event)
    elsewhere = StoreIdentity(user_id=ada.user_id, tenant_id="tenant-b", claims=ada.claims)
    for table in ("ai_chats", "ai_messages", "ai_runs"):
        query = f"select count(*) from bastion.{table}"
        assert await as_user(hooks_database.direct_dsn, ada, query) != [(0,)]
        assert await as_user(hooks_database.direct_dsn, bob, query) == [(0,)]
        assert await as_user(hooks_database.direct_dsn, elsewhere, query) == [(0,)]
    forged = "insert into bastion.ai_chats (id, conversation_id, owner_id) values (%s, %s, %s)"
    try:
        await as_user(
            hooks_database.direct_dsn, bob, forged, (str(uuid.uuid4()), str(uuid.uuid4()), bob.user_id)
        )
    except Exception as error:
        assert type(error).__name__ == "InsufficientPrivilege"
    else:
        raise AssertionError("a user wrote a chat row")


# A UI message with a part of each kind (the SQL conversion is tested on it too).
UI_MESSAGE: dict[str, Any] = {
    "id": "a1",
    "role": "assistant",
    "parts": [
        {"type": "step-start"},
        {"type": "reasoning", "text": "thinking", "state": "done"},
        {"type": "text", "text": "Hello", "providerMetadata": {"x": {"y": 1}}},
        {
            "type": "tool-search",
            "toolCallId": "c1",
            "state": "output-available",
            "input": {"q": "a"},
            "output": {"hits": 1},
        },
        {
            "type": "dynamic-tool",
            "toolName": "mcp_x",
            "toolCallId": "c2",
            "state": "output-error",
            "input": {},
            "errorText": "refused",
        },
        {
            "type": "tool-delete",
            "toolCallId": "c3",
            "state": "output-denied",
            "input": {"p": 1},
            "approval": {"id": "ap", "approved": False, "reason": "no"},
        },
        {"type": "source-url", "sourceId": "s1", "url": "https://example.com", "title": "Ex"},
        {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AA=="},
        {"type": "data-weather", "id": "w1", "data": {"t": 20}},
        {"type": "something-new", "value": 1},
    ],
}


def test_ui_parts_become_canonical_parts_without_losing_any() -> None:
    assert canonical_parts(UI_MESSAGE) == [
        {"type": "step", "boundary": "start"},
        {"type": "reasoning", "text": "thinking", "state": "done"},
        {"type": "text", "text": "Hello", "providerMetadata": {"x": {"y": 1}}},
        {"type": "tool-call", "toolCallId": "c1", "toolName": "search", "input": {"q": "a"}},
        {"type": "tool-result", "toolCallId": "c1", "toolName": "search", "output": {"hits": 1}},
        {"type": "tool-call", "toolCallId": "c2", "toolName": "mcp_x", "input": {}},
        {
            "type": "tool-result",
            "toolCallId": "c2",
            "toolName": "mcp_x",
            "output": "refused",
            "isError": True,
        },
        {"type": "tool-call", "toolCallId": "c3", "toolName": "delete", "input": {"p": 1}},
        {"type": "tool-approval", "toolCallId": "c3", "approvalId": "ap", "state": "denied", "reason": "no"},
        {"type": "source", "sourceType": "url", "id": "s1", "url": "https://example.com", "title": "Ex"},
        {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AA=="},
        {"type": "data", "name": "weather", "id": "w1", "data": {"t": 20}},
        {"type": "data", "name": "something-new", "data": {"type": "something-new", "value": 1}},
    ]


def test_a_chat_id_is_a_uuid_derived_from_its_conversation() -> None:
    conversation = str(uuid.uuid4())
    chat = uuid.UUID(chat_id_of(conversation))
    assert chat.version == 8 and str(chat) == chat_id_of(conversation.upper())
    assert chat_id_of(conversation) != chat_id_of(str(uuid.uuid4())) != conversation
