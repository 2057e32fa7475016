"""The outbox: every change a turn makes enters it in the same transaction, in an order no later commit
can slip behind, and each hook takes its next events from its own position."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from bastion.hooks import PostgresHookOutbox, define_hook
from bastion.stores import NotFoundError, PostgresStore
from tests.hook_scenarios import assistant_message, drain, turn, user_message
from tests.hooks_db import HooksDatabase, someone


async def noop(event: Any) -> None:
    return None


async def test_a_turn_enters_the_outbox_with_its_messages_in_order(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada = someone()
    conversation = await hooks_store.create_conversation(ada)
    run_id = await turn(hooks_store, ada, conversation.id, [user_message("u1")], assistant_message("a1"))
    outbox = PostgresHookOutbox(hooks_store.pool)
    await outbox.register(
        [
            define_hook(
                "all",
                events={"run.started", "run.completed", "message.received", "message.completed"},
                handle=noop,
                start="earliest",
            )
        ]
    )
    events = await drain(outbox, "all")
    assert [e.type for e in events] == [
        "message.received",
        "run.started",
        "message.completed",
        "run.completed",
    ]
    assert {e.conversation_id for e in events} == {conversation.id}
    assert {e.run_id for e in events} == {run_id}
    assert {(e.user_id, e.tenant_id, e.signed_in) for e in events} == {(ada.user_id, "tenant-a", True)}
    received, started, completed, finished = events
    assert received.data == {
        "messageId": "u1",
        "seq": 1,
        "role": "user",
        "parentId": None,
        "message": user_message("u1"),
    }
    assert completed.data["parentId"] == "u1" and completed.data["message"] == assistant_message("a1")
    run_events = await hooks_store.list_events(ada, conversation.id)
    assert [started.run_event_id, finished.run_event_id] == [e.id for e in run_events]
    assert started.data == run_events[0].data
    assert received.run_event_id is None
    # Nothing new: the position stays put.
    assert await drain(outbox, "all") == []


async def test_a_hook_takes_only_its_types_and_a_new_latest_hook_only_what_comes_after_it(
    hooks_store: PostgresStore,
) -> None:
    ada = someone()
    conversation = await hooks_store.create_conversation(ada)
    await turn(hooks_store, ada, conversation.id, [user_message("u1")], assistant_message("a1"))
    outbox = PostgresHookOutbox(hooks_store.pool)
    await outbox.register(
        [
            define_hook("finished", events={"run.completed"}, handle=noop, start="earliest"),
            define_hook("later", events={"run.completed"}, handle=noop),
        ]
    )
    await turn(hooks_store, ada, conversation.id, [user_message("u2")], assistant_message("a2"))
    assert [e.type for e in await drain(outbox, "finished")] == ["run.completed", "run.completed"]
    [later] = await drain(outbox, "later")
    assert later.run_id == (await hooks_store.list_events(ada, conversation.id))[-1].run_id


async def test_an_event_committed_after_a_later_one_is_not_skipped(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada, grace = someone(), someone()
    first = await hooks_store.create_conversation(ada)
    second = await hooks_store.create_conversation(grace)
    outbox = PostgresHookOutbox(hooks_store.pool)
    await outbox.register([define_hook("runs", events={"run.completed"}, handle=noop, start="earliest")])
    # A transaction writes an event and stays open; a later one writes and commits.
    slow = await psycopg.AsyncConnection.connect(hooks_database.admin_dsn)
    try:
        await slow.execute(
            "insert into bastion.run_events (conversation_id, run_id, owner_id, tenant_id, type) "
            "values (%s, gen_random_uuid(), %s, 'tenant-a', 'run.completed')",
            (first.id, ada.user_id),
        )
        await turn(hooks_store, grace, second.id, [user_message("u1")], assistant_message("a1"))
        # The later commit has a higher id but waits behind the open transaction.
        assert await drain(outbox, "runs") == []
        await slow.commit()
    finally:
        await slow.close()
    taken = await drain(outbox, "runs")
    assert [e.conversation_id for e in taken] == [first.id, second.id]


async def test_a_refused_turn_writes_nothing_to_the_outbox(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada, bob = someone(), someone()
    conversation = await hooks_store.create_conversation(ada)
    with pytest.raises(NotFoundError):
        await turn(hooks_store, bob, conversation.id, [user_message("u1")], assistant_message("a1"))
    assert hooks_database.rows("select count(*) from bastion.hook_events") == [(0,)]


async def test_edits_report_the_dropped_messages_deepest_first_and_anonymous_users_are_marked(
    hooks_store: PostgresStore,
) -> None:
    ada = someone()
    conversation = await hooks_store.create_conversation(ada)
    await turn(hooks_store, ada, conversation.id, [user_message("u1")], assistant_message("a1"))
    await turn(hooks_store, ada, conversation.id, [user_message("u2")], assistant_message("a2"))
    history = [user_message("u1"), assistant_message("a1"), user_message("u2", "edited")]
    await turn(hooks_store, ada, conversation.id, history, assistant_message("a3"))
    outbox = PostgresHookOutbox(hooks_store.pool)
    await outbox.register(
        [
            define_hook(
                "messages", events={"message.received", "message.deleted"}, handle=noop, start="earliest"
            )
        ]
    )
    events = await drain(outbox, "messages")
    assert [(e.type, e.data["messageId"], e.data["parentId"]) for e in events] == [
        ("message.received", "u1", None),
        ("message.received", "u2", "a1"),
        ("message.deleted", "a2", "u2"),
        ("message.received", "u2", "a1"),
    ]
    assert events[-1].data["message"]["parts"][0]["text"] == "edited"

    nobody = someone(anonymous=True)
    anonymous = await hooks_store.create_conversation(nobody)
    await turn(hooks_store, nobody, anonymous.id, [user_message("u1")], assistant_message("a1"))
    assert {e.signed_in for e in await drain(outbox, "messages")} == {False}


async def test_the_outbox_is_the_servers_alone(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada = someone()
    conversation = await hooks_store.create_conversation(ada)
    await turn(hooks_store, ada, conversation.id, [user_message("u1")], assistant_message("a1"))
    with psycopg.connect(hooks_database.direct_dsn) as conn:
        conn.execute("set role authenticated")
        for table in ("hook_events", "hook_subscriptions", "hook_failures"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"select * from bastion.{table}")
            conn.rollback()
            conn.execute("set role authenticated")


async def _notifications_before_a_sentinel(listener: psycopg.AsyncConnection[Any], sentinel: str) -> int:
    """How many of the outbox's notifications arrived before `sentinel` (delivered in commit order)."""
    before = 0
    async for notice in listener.notifies(timeout=30):
        if notice.payload == sentinel:
            return before
        before += 1
    raise AssertionError(f"{sentinel} never arrived")


async def test_the_outbox_notifies_only_while_a_dispatcher_waits_for_wakeups(
    hooks_store: PostgresStore, hooks_database: HooksDatabase
) -> None:
    ada = someone()
    conversation = await hooks_store.create_conversation(ada)
    async with await psycopg.AsyncConnection.connect(hooks_database.admin_dsn, autocommit=True) as listener:
        await listener.execute("listen bastion_hooks")
        try:
            hooks_database.execute("update bastion.hook_wakeups set wanted = false")
            await turn(hooks_store, ada, conversation.id, [user_message("u1")], assistant_message("a1"))
            hooks_database.execute("notify bastion_hooks, 'unwanted'")
            assert await _notifications_before_a_sentinel(listener, "unwanted") == 0
            hooks_database.execute("update bastion.hook_wakeups set wanted = true")
            await turn(hooks_store, ada, conversation.id, [user_message("u2")], assistant_message("a2"))
            hooks_database.execute("notify bastion_hooks, 'wanted'")
            assert await _notifications_before_a_sentinel(listener, "wanted") >= 1
        finally:
            hooks_database.execute("update bastion.hook_wakeups set wanted = true")


async def test_autocommit_connection_commits_each_statement_and_gives_a_pool_its_mode_back(
    hooks_database: HooksDatabase,
) -> None:
    from psycopg_pool import AsyncConnectionPool

    from bastion.hooks import autocommit_connection

    hooks_database.execute("create table public.autocommitted (n int)")
    hooks_database.execute("grant select, insert on public.autocommitted to bastion_app")
    async with AsyncConnectionPool(hooks_database.app_dsn, min_size=1, max_size=1, open=False) as pool:
        async with autocommit_connection(pool) as conn:
            assert conn.autocommit
            await conn.execute("insert into public.autocommitted values (1)")
            # Committed already: another session sees it while this connection is still held.
            assert hooks_database.rows("select n from public.autocommitted") == [(1,)]
        async with pool.connection() as conn:
            assert not conn.autocommit  # the application's pool keeps its own mode
