"""Batches: a hook's events of many conversations go out in one delivery workflow, a conversation whose
event keeps failing is set aside without holding up the hook's other conversations, and a hook that
takes whole batches falls back to single events when a batch fails."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from bastion.hooks import HookEvent, PostgresHookOutbox, define_hook, delivery_workflow_prefix
from bastion.stores import PostgresStore, StoreIdentity
from tests.hook_scenarios import assistant_message, turn, user_message
from tests.hooks_db import HooksDatabase, someone
from tests.test_hooks_delivery import (
    calls,
    delivering,
    dispatched,
    effects,
    hook_tables,
    outbox_ids,
    per_conversation,
    until,
)

__all__ = ["hook_tables"]  # the fixture, shared with the delivery tests


async def conversation_of(store: PostgresStore) -> tuple[StoreIdentity, str]:
    who = someone()
    return who, (await store.create_conversation(who)).id


async def turns(store: PostgresStore, who: StoreIdentity, conversation: str, *labels: str) -> None:
    for label in labels:
        await turn(store, who, conversation, [user_message(f"u{label}")], assistant_message(f"a{label}"))


def workflows(database: HooksDatabase, hook: str) -> list[tuple[str, str | None]]:
    """The hook's delivery workflows, each with the queue it was enqueued in (None: started)."""
    return database.rows(  # type: ignore[return-value]
        "select workflow_uuid, queue_name from dbos.workflow_status where starts_with(workflow_uuid, %s)",
        delivery_workflow_prefix(hook),
    )


def of(conversation: str, rows: list[tuple[int, str, str]]) -> list[int]:
    return [event_id for event_id, _, owner in rows if owner == conversation]


async def test_events_of_many_conversations_waiting_in_the_outbox_go_out_in_one_delivery_workflow(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    conversations = [await conversation_of(hooks_store) for _ in range(3)]
    await asyncio.gather(*(turns(hooks_store, who, c, "1", "2") for who, c in conversations))
    expected = outbox_ids(database)
    assert len(expected) == 3 * 2 * 4
    async with delivering(database, hooks_store, "recorder"):
        await until(lambda: len(effects(database, "recorder")) == len(expected))
    assert per_conversation(effects(database, "recorder")) == per_conversation(expected)
    assert set(calls(database, "recorder").values()) == {1}
    [(workflow, queue)] = workflows(database, "recorder")
    assert workflow.startswith("bastion.hook:recorder:") and queue is None  # started, not enqueued


async def test_a_conversation_whose_event_keeps_failing_holds_up_only_itself_and_then_goes_on_in_order(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    (ada, stuck), (bob, fine) = await conversation_of(hooks_store), await conversation_of(hooks_store)
    database.execute("insert into public.hook_refused values (%s)", stuck)
    async with delivering(database, hooks_store, "picky"):
        await asyncio.gather(turns(hooks_store, ada, stuck, "1"), turns(hooks_store, bob, fine, "1"))
        await until(lambda: len(effects(database, "picky")) == len(of(fine, outbox_ids(database))))
        first = of(stuck, outbox_ids(database))[0]
        await until(lambda: calls(database, "picky").get(first, 0) >= 3)
        # Later events of both: the fine conversation's are delivered, the stuck one's wait in order.
        await asyncio.gather(turns(hooks_store, ada, stuck, "2"), turns(hooks_store, bob, fine, "2"))
        expected = outbox_ids(database)
        await until(lambda: of(fine, effects(database, "picky")) == of(fine, expected))
        assert of(stuck, effects(database, "picky")) == []
        assert set(calls(database, "picky")) == {*of(fine, expected), first}
        holds = database.rows("select distinct conversation_id::text from bastion.hook_holds")
        assert holds == [(stuck,)]
        database.execute("delete from public.hook_refused")
        await until(lambda: len(effects(database, "picky")) == len(expected))
        await until(lambda: database.rows("select 1 from bastion.hook_holds") == [])
    assert per_conversation(effects(database, "picky")) == per_conversation(expected)
    assert {event_id: count for event_id, count in calls(database, "picky").items() if count > 1} == {
        first: calls(database, "picky")[first]
    }
    [failure] = database.rows(
        "select event_id, gave_up_at is null, delivered_at is not null from bastion.hook_failures"
    )
    assert failure == (first, True, True)


@pytest.mark.parametrize("hook", ["batcher", "id_batcher"])
async def test_a_hook_taking_whole_batches_gets_one_and_a_failing_batch_falls_back_to_each_event(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, monkeypatch: pytest.MonkeyPatch, hook: str
) -> None:
    database = hook_tables
    loaded: list[list[int]] = []
    load = PostgresHookOutbox.events

    async def counted(outbox: PostgresHookOutbox, event_ids: list[int]) -> dict[int, HookEvent]:
        loaded.append(event_ids)
        return await load(outbox, event_ids)

    monkeypatch.setattr(PostgresHookOutbox, "events", counted)
    (ada, stuck), (bob, fine) = await conversation_of(hooks_store), await conversation_of(hooks_store)
    await asyncio.gather(turns(hooks_store, ada, stuck, "1"), turns(hooks_store, bob, fine, "1"))
    before = outbox_ids(database)
    async with delivering(database, hooks_store, hook):
        await until(lambda: len(effects(database, hook)) == len(before))
        # Everything waiting went to the hook in one call, in order per conversation, nothing one by one.
        [(batch,)] = database.rows("select event_ids from public.hook_batches where hook = %s", hook)
        assert sorted(batch) == [event_id for event_id, _, _ in before]
        for conversation in (stuck, fine):
            assert [e for e in batch if e in of(conversation, before)] == of(conversation, before)
        assert calls(database, hook) == {}
        # A hook taking ids reads the events itself: delivery loaded none of them.
        assert (loaded == []) is (hook == "id_batcher")
        # A batch with a refused conversation fails as a whole; the others' events go one by one.
        database.execute("insert into public.hook_refused values (%s)", stuck)
        await asyncio.gather(turns(hooks_store, ada, stuck, "2"), turns(hooks_store, bob, fine, "2"))
        expected = outbox_ids(database)
        await until(lambda: of(fine, effects(database, hook)) == of(fine, expected))
        assert of(stuck, effects(database, hook)) == of(stuck, before)
        database.execute("delete from public.hook_refused")
        await until(lambda: len(effects(database, hook)) == len(expected))
    assert per_conversation(effects(database, hook)) == per_conversation(expected)


async def test_a_delivery_enqueued_by_the_previous_version_one_per_conversation_still_finishes(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    from dbos import DBOS, SetEnqueueOptions, SetWorkflowID

    from bastion.hooks import delivery_workflow_id, hook_queue_name
    from bastion.hooks._batches import _deliver

    database = hook_tables
    who, conversation = await conversation_of(hooks_store)
    await turns(hooks_store, who, conversation, "1")
    expected = outbox_ids(database)
    ids = [event_id for event_id, _, _ in expected]
    legacy = delivery_workflow_id("recorder", ids[0], ids[-1])  # the previous version's id, too
    async with delivering(database, hooks_store, "recorder"):
        with SetWorkflowID(f"{legacy}:legacy"), SetEnqueueOptions(queue_partition_key=conversation):
            handle = await DBOS.enqueue_workflow_async(
                hook_queue_name("recorder"), _deliver, "recorder", ids, 0
            )
        assert await handle.get_result() == 0
        await until(lambda: set(calls(database, "recorder").values()) == {2})  # by it and by a batch
    assert effects(database, "recorder") == expected


async def test_a_batch_enqueued_by_the_previous_version_runs_and_no_batch_starts_while_it_is_in_flight(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    from dbos import DBOS, SetEnqueueOptions, SetWorkflowID

    from bastion.hooks import delivery_workflow_id, hook_queue_name
    from bastion.hooks._batches import _deliver_batch

    database = hook_tables
    who, conversation = await conversation_of(hooks_store)
    async with delivering(database, hooks_store, "recorder") as delivery:
        await turns(hooks_store, who, conversation, "1")
        await until(lambda: effects(database, "recorder") == outbox_ids(database))
        handed_over = {event_id for event_id, _, _ in outbox_ids(database)}
        database.execute("insert into public.hook_hold values ('run.completed')")
        # As the previous version did, under the position's lock: the next turn's events enqueued as
        # a batch in the hook's queue, and the position moved past them.
        async with await psycopg.AsyncConnection.connect(database.admin_dsn) as lock, lock.transaction():
            await lock.execute("select 1 from bastion.hook_subscriptions where hook = 'recorder' for update")
            await turns(hooks_store, who, conversation, "2")
            ids = [event_id for event_id, _, _ in outbox_ids(database) if event_id not in handed_over]
            with (
                SetWorkflowID(delivery_workflow_id("recorder", ids[0], ids[-1])),
                SetEnqueueOptions(queue_partition_key="~batches"),
            ):
                await DBOS.enqueue_workflow_async(
                    hook_queue_name("recorder"), _deliver_batch, "recorder", [(conversation, ids)], 0
                )
            await lock.execute(
                "update bastion.hook_subscriptions s set position_tx = e.tx, position_id = e.id"
                " from bastion.hook_events e where s.hook = 'recorder' and e.id = %s",
                (ids[-1],),
            )
        await until(lambda: calls(database, "recorder").get(ids[-1]) == 1)  # it runs, held in the hook
        await turns(hooks_store, who, conversation, "3")
        # That batch is in flight, so the dispatcher starts none, woken by the turn or not.
        await asyncio.sleep(1.0)
        assert await delivery.dispatch() == 0
        assert not dispatched(database, "recorder")
        assert set(calls(database, "recorder")) == handed_over | set(ids)
        database.execute("delete from public.hook_hold")
        expected = outbox_ids(database)
        await until(lambda: len(effects(database, "recorder")) == len(expected))
    assert effects(database, "recorder") == expected
    assert set(calls(database, "recorder").values()) == {1}


async def test_while_a_batch_waits_to_run_new_events_wait_in_the_outbox_to_go_out_together(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    database.execute("insert into public.hook_hold values ('run.completed')")
    who, conversation = await conversation_of(hooks_store)
    async with delivering(database, hooks_store, "recorder"):
        await turns(hooks_store, who, conversation, "1")
        [first] = [event_id for event_id, kind, _ in outbox_ids(database) if kind == "run.completed"]
        await until(lambda: calls(database, "recorder").get(first) == 1)  # a batch runs, held in the hook
        for label in "23456":  # paced, so that each could have gone out in a batch of its own
            await turns(hooks_store, who, conversation, label)
            await asyncio.sleep(0.2)
        database.execute("delete from public.hook_hold")
        expected = outbox_ids(database)
        await until(lambda: len(effects(database, "recorder")) == len(expected))
    assert effects(database, "recorder") == expected
    # The held batch, at most one more (of the first turn) before it, one waiting behind it, and one
    # with everything written while that one waited.
    assert len(workflows(database, "recorder")) <= 4


async def test_a_dispatcher_wants_the_outboxs_wakeups_only_while_it_has_nothing_in_flight(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables

    def wanted() -> bool:
        return database.rows("select wanted from bastion.hook_wakeups") == [(True,)]

    database.execute("update bastion.hook_wakeups set wanted = false")  # as a busy dispatcher leaves it
    database.execute("insert into public.hook_hold values ('run.completed')")
    who, conversation = await conversation_of(hooks_store)
    async with delivering(database, hooks_store, "recorder"):
        await until(wanted)  # nothing to deliver: only a notification would wake it soon
        await turns(hooks_store, who, conversation, "1")
        await until(lambda: not wanted())  # a batch in flight, held in the hook: it looks again by itself
        database.execute("delete from public.hook_hold")
        await until(lambda: len(effects(database, "recorder")) == len(outbox_ids(database)))
        await until(wanted)
        await turns(hooks_store, who, conversation, "2")
        expected = outbox_ids(database)
        await until(lambda: len(effects(database, "recorder")) == len(expected))
    assert effects(database, "recorder") == expected


def test_a_hook_takes_its_batches_as_events_or_as_ids_but_not_both() -> None:
    async def one(event: HookEvent) -> None: ...

    async def batch(events: object) -> None: ...

    runs = {"run.completed"}
    with pytest.raises(ValueError, match=r"handle_batch.*handle_event_ids"):
        define_hook("both", events=runs, handle=one, handle_batch=batch, handle_event_ids=batch)
    assert define_hook("ids", events=runs, handle=one, handle_event_ids=batch).handle_batch is None
