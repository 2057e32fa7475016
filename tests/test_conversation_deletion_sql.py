"""Deleting a conversation in SQL, as its owner under row-level security (Supabase's Data API), deletes
everything derived from it; a late or stale write of a deleted conversation writes nothing; and the
migrations repair a database where a deleted conversation's id was used again by someone else."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bastion.durable import migrate_durable
from bastion.hooks import PostgresHookOutbox, chat_id_of, persist_sessions
from bastion.hooks.outbox import hook_migrations
from bastion.memory import HashingEmbedder, PostgresMemoryStore, apply_memory_migrations
from bastion.stores import PostgresStore, StoreIdentity, apply_application_migrations, apply_migrations
from bastion.stores._migrations import available_migrations
from tests.hook_scenarios import assistant_message, drain, turn, user_message
from tests.hooks_db import HooksDatabase, as_user, someone
from tests.pg import PostgresCluster
from tests.test_conversation_deletion import derived_rows


async def copy_everything(store: PostgresStore) -> None:
    """Deliver every event in the outbox to `persist_sessions`, as delivery would."""
    outbox = PostgresHookOutbox(store.pool)
    hook = persist_sessions(store.pool, name=f"copy-{uuid.uuid4().hex[:8]}")
    await outbox.register([hook])
    events = await drain(outbox, hook.name)
    assert hook.handle_event_ids is not None
    await hook.handle_event_ids([event.id for event in events])


async def chat_with_two_turns(store: PostgresStore, who: StoreIdentity, conversation: str) -> list[str]:
    await store.create_conversation(who, conversation_id=conversation)
    first = await turn(store, who, conversation, [user_message("m1", "my secret")], assistant_message("a1"))
    second = await turn(store, who, conversation, [user_message("m2", "more")], assistant_message("a2"))
    return [first, second]


def workflow_rows(database: HooksDatabase, conversation: str, run: str, text: str) -> None:
    """A finished turn workflow's status and input rows, as DBOS writes them."""
    workflow = f"bastion.turn:{conversation}:{run}"
    database.execute(
        "insert into dbos.workflow_status (workflow_uuid, status, name, created_at, updated_at, priority)"
        " values (%s, 'SUCCESS', 'bastion.turn', 0, 0, 0)",
        workflow,
    )
    database.execute(
        "insert into dbos.workflow_input (workflow_uuid, inputs, retention_timestamp) values (%s, %s, 0)",
        workflow,
        json.dumps({"messages": [text]}),
    )


async def test_deleting_a_conversation_as_its_owner_in_sql_deletes_everything_derived_from_it(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    await apply_memory_migrations(hooks_database.admin_dsn)
    memory = PostgresMemoryStore(hooks_store, embedder=HashingEmbedder(64))
    ada, conversation = someone(), str(uuid.uuid4())
    runs = await chat_with_two_turns(hooks_store, ada, conversation)
    await copy_everything(hooks_store)
    for run in runs:
        await memory.recall(ada, "secret", operation_id=run, scope="chat")
        workflow_rows(hooks_database, conversation, run, "my secret")
    before = derived_rows(hooks_database, conversation, runs)
    assert before["ai_messages"] == 4 and before["dbos.workflow_input"] == 2, before

    deleting = "delete from bastion.conversations where id = %s"
    await as_user(hooks_database.app_dsn, ada, deleting, (conversation,))

    after = derived_rows(hooks_database, conversation, runs)
    assert after == dict.fromkeys(before, 0), json.dumps({"before": before, "after": after})


async def test_a_batch_delivered_while_its_conversation_is_deleted_writes_nothing(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    ada, conversation = someone(), str(uuid.uuid4())
    await chat_with_two_turns(hooks_store, ada, conversation)
    event_ids = [
        event_id
        for (event_id,) in hooks_database.rows(
            "select id from bastion.hook_events where conversation_id = %s order by id", conversation
        )
    ]
    hook = persist_sessions(hooks_store.pool)
    assert hook.handle_event_ids is not None
    async with await psycopg.AsyncConnection.connect(hooks_database.admin_dsn) as deleting:
        await deleting.execute("delete from bastion.conversations where id = %s", (conversation,))
        # The batch started before the delete commits: it has read the events, and waits.
        writing = asyncio.ensure_future(hook.handle_event_ids(event_ids))
        await asyncio.sleep(0.5)
        assert not writing.done()
        await deleting.commit()
    await asyncio.wait_for(writing, 10)
    assert hooks_database.rows(
        "select count(*) from bastion.ai_chats where conversation_id = %s", conversation
    ) == [(0,)]
    assert hooks_database.rows(
        "select count(*) from bastion.ai_messages where chat_id = %s", chat_id_of(conversation)
    ) == [(0,)]


async def test_a_write_of_another_owner_never_reaches_a_reused_conversations_rows(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    ada, bob, conversation = someone(), someone(), str(uuid.uuid4())
    await hooks_store.create_conversation(bob, conversation_id=conversation)
    await turn(hooks_store, bob, conversation, [user_message("m1", "bob's")], assistant_message("a1"))
    await copy_everything(hooks_store)
    chat = chat_id_of(conversation)
    # A stale write of Ada's (a process of the previous version, or a batch built before her delete)
    # for the same chat and message id, through every entry point.
    write = {
        "write": "message", "chat": chat, "owner": ada.user_id, "tenant": ada.tenant_id,
        "event": 10**12, "at": "2026-12-05T10:00:00Z", "conversation": conversation, "id": "m1",
        "role": "user", "parts": [{"type": "text", "text": "ada's"}], "format": "canonical",
        "metadata": {},
    }  # fmt: skip
    async with hooks_store.pool.connection() as conn:
        await conn.execute("select bastion.persist_session_events(%s)", (Jsonb([write]),))
        await conn.execute(
            "select bastion.apply_session_writes(array(select jsonb_populate_record("
            "null::bastion.session_write, %s)))",
            (Jsonb(write | {"id": "m9"}),),
        )
    assert await as_user(hooks_database.app_dsn, ada, "select id from bastion.ai_messages") == []
    rows = hooks_database.rows(
        "select id, owner_id::text, parts::text from bastion.ai_messages where chat_id = %s order by id", chat
    )
    assert [(m, owner) for m, owner, _ in rows] == [("a1", bob.user_id), ("m1", bob.user_id)]
    assert "bob's" in rows[1][2]


async def test_the_migrations_repair_a_reused_conversation_and_the_leftovers_of_deleted_ones(
    pg_cluster: PostgresCluster,
) -> None:
    name = pg_cluster.database("repair")
    database = HooksDatabase(pg_cluster, name)
    dsn = pg_cluster.dsn(name)
    await migrate_previous_release(dsn)
    pg_cluster.create_login_roles()
    await migrate_durable(dsn, app_role="bastion_app")
    ada, bob, conversation = someone(), someone(), str(uuid.uuid4())
    async with await PostgresStore.open(database.app_dsn, max_size=4) as store:
        memory = PostgresMemoryStore(store, embedder=HashingEmbedder(64))
        runs = await chat_with_two_turns(store, ada, conversation)
        await copy_everything(store)
        for run in runs:
            await memory.recall(ada, "secret", operation_id=run, scope="chat")
            workflow_rows(database, conversation, run, "my secret")
        await store.delete_conversation(ada, conversation)
        await store.create_conversation(bob, conversation_id=conversation)
        await turn(store, bob, conversation, [user_message("m1", "bob's note")], assistant_message("b1"))
        await copy_everything(store)
        # The previous release: Ada's rows stayed, and Bob's first message went into her row `m1`.
        assert await ada_reads(database, ada) != []
        assert await bobs_chat(database, bob, conversation) == []

        with psycopg.connect(dsn, autocommit=True) as conn:  # the stores' repair, as its migration runs it
            conn.execute(f"alter table bastion.runs enable trigger {STORES_REPAIR_TRIGGER}")
            conn.execute("select bastion.forget_orphan_turn_workflows()")
        await apply_application_migrations(dsn, component="hooks", migrations=hook_migrations())
        await apply_application_migrations(
            dsn, component="chat_tables", migrations=available_migrations("bastion.hooks", "chat_migrations")
        )
        await apply_memory_migrations(dsn)

    assert await ada_reads(database, ada) == []
    assert await bobs_chat(database, bob, conversation) == [
        ("m1", "user", "bob's note", "b1"),
        ("b1", "assistant", "hi", "b1"),
    ]
    left = derived_rows(database, conversation, runs)
    assert left["memory_operation_records"] == 0 and left["dbos.workflow_input"] == 0, left
    assert left["dbos.workflow_status"] == 0
    assert database.rows(
        "select count(*) from bastion.hook_events where conversation_id = %s and owner_id <> %s",
        conversation,
        bob.user_id,
    ) == [(0,)]


# The migrations that repair what the previous release left, by component.
STORES_REPAIR_TRIGGER = "runs_forget_workflows"
REPAIRS = {
    "bastion": "deleted_runs_forget_their_workflows",
    "hooks": "deleted_conversations_leave_the_outbox",
    "chat_tables": "chat_rows_belong_to_their_conversation",
    "memory": "deleted_runs_forget_their_recalls",
}


async def migrate_previous_release(dsn: str) -> None:
    """Every component's migrations up to (not including) the one that repairs it."""
    sources = {
        "bastion": available_migrations(),
        "hooks": hook_migrations(),
        "chat_tables": available_migrations("bastion.hooks", "chat_migrations"),
        "memory": available_migrations("bastion.memory", "migrations"),
    }
    for component, migrations in sources.items():
        [repair] = [m.version for m in migrations if m.name == REPAIRS[component]]
        earlier = [m for m in migrations if m.version < repair]
        if component == "bastion":
            # This release's store code needs the stores' later functions (0015 and on), so the
            # previous release is every stores migration with the repair's trigger switched off.
            await apply_migrations(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"alter table bastion.runs disable trigger {STORES_REPAIR_TRIGGER}")
        else:
            await apply_application_migrations(dsn, component=component, migrations=earlier)


async def ada_reads(database: HooksDatabase, ada: StoreIdentity) -> list[tuple[Any, ...]]:
    return await as_user(
        database.app_dsn,
        ada,
        "select 'chat', id::text from bastion.ai_chats union all "
        "select 'message', parts::text from bastion.ai_messages union all "
        "select 'run', id::text from bastion.ai_runs",
    )


async def bobs_chat(database: HooksDatabase, bob: StoreIdentity, conversation: str) -> list[tuple[Any, ...]]:
    """Bob's copy of the conversation as he reads it: each message's id, role, text and the chat's leaf."""
    return await as_user(
        database.app_dsn,
        bob,
        "select m.id, m.role, m.parts -> 0 ->> 'text', c.current_leaf_id from bastion.ai_chats c"
        " join bastion.ai_messages m on m.chat_id = c.id where c.conversation_id = %s order by m.created_at",
        (conversation,),
    )
