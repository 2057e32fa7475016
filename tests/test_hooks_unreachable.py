"""A delivery that cannot reach the outbox for a while (a transient database error, not the hook's)
loses none of its events: the batch sets the conversations it could not deliver aside, and their
lanes pause durably and try again until the outbox answers."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from bastion.hooks import HookEvent, PostgresHookOutbox, _batches
from bastion.stores import PostgresStore
from tests.hooks_db import HooksDatabase
from tests.test_hooks_batches import conversation_of, of, turns, workflows
from tests.test_hooks_delivery import (
    calls,
    delivering,
    effects,
    hook_tables,
    outbox_ids,
    per_conversation,
    until,
)

__all__ = ["hook_tables"]  # the fixture, shared with the delivery tests


@pytest.fixture(autouse=True)
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_batches, "FIRST_PAUSE", 0.05)


async def test_a_batch_and_a_lane_that_cannot_reach_the_outbox_still_deliver_every_event_once_in_order(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = hook_tables
    failed = [0]
    load = PostgresHookOutbox.events

    async def unreachable_twice(outbox: PostgresHookOutbox, event_ids: list[int]) -> dict[int, HookEvent]:
        if failed[0] < 2:  # the batch's read, then the first lane's first try
            failed[0] += 1
            raise psycopg.OperationalError("the outbox cannot be reached")
        return await load(outbox, event_ids)

    monkeypatch.setattr(PostgresHookOutbox, "events", unreachable_twice)
    conversations = [await conversation_of(hooks_store) for _ in range(2)]
    await asyncio.gather(*(turns(hooks_store, who, c, "1", "2") for who, c in conversations))
    expected = outbox_ids(database)
    async with delivering(database, hooks_store, "recorder"):
        await until(lambda: len(effects(database, "recorder")) == len(expected))
        await until(lambda: database.rows("select 1 from bastion.hook_holds") == [])
    assert failed[0] == 2
    assert per_conversation(effects(database, "recorder")) == per_conversation(expected)
    assert set(calls(database, "recorder").values()) == {1}
    # The batch set both conversations aside; each went out in its own lane, which finished.
    lanes = [workflow for workflow, queue in workflows(database, "recorder") if queue is not None]
    assert len(lanes) == 2
    statuses = database.rows("select status from dbos.workflow_status where workflow_uuid = any(%s)", lanes)
    assert statuses == [("SUCCESS",), ("SUCCESS",)]


async def test_a_conversation_that_cannot_record_its_failure_is_set_aside_alone(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = hook_tables
    failed = [0]
    record = PostgresHookOutbox.record_failure

    async def unreachable_once(outbox: PostgresHookOutbox, *args: object, **kwargs: object) -> None:
        if failed[0] < 1:
            failed[0] += 1
            raise psycopg.OperationalError("the outbox cannot be reached")
        await record(outbox, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PostgresHookOutbox, "record_failure", unreachable_once)
    (ada, stuck), (bob, fine) = await conversation_of(hooks_store), await conversation_of(hooks_store)
    database.execute("insert into public.hook_refused values (%s)", stuck)
    await asyncio.gather(turns(hooks_store, ada, stuck, "1", "2"), turns(hooks_store, bob, fine, "1", "2"))
    expected = outbox_ids(database)
    async with delivering(database, hooks_store, "picky"):
        await until(lambda: of(fine, effects(database, "picky")) == of(fine, expected))
        first = of(stuck, expected)[0]
        await until(lambda: calls(database, "picky").get(first, 0) >= 2)
        database.execute("delete from public.hook_refused")
        await until(lambda: len(effects(database, "picky")) == len(expected))
    assert failed[0] == 1
    assert per_conversation(effects(database, "picky")) == per_conversation(expected)
    # The other conversation of the batch went on in it: each of its events was called once.
    assert {calls(database, "picky")[event_id] for event_id in of(fine, expected)} == {1}
