"""Retention: pruning deletes only outbox events every hook has passed and no delivery still carries,
with their failure records and finished deliveries, safely while delivery runs; a replay from a pruned
event says it was pruned."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from bastion.hooks import (
    HookEventPruned,
    PostgresHookOutbox,
    define_hook,
    delivery_workflow_prefix,
    prune_outbox,
)
from bastion.hooks.report import parse_age
from bastion.stores import PostgresStore
from tests.hook_scenarios import drain
from tests.hooks_db import HooksDatabase
from tests.test_hooks_delivery import (
    bastion_hooks,
    calls,
    delivering,
    dispatched,
    effects,
    hook_tables,
    outbox_ids,
    per_conversation,
    simple_turns,
    until,
)

__all__ = ["hook_tables"]  # the fixture, shared with the delivery tests

EVENTS_PER_TURN = 4  # message received, run started, message completed, run completed


async def noop(event: object) -> None:
    return None


def unfinished_deliveries(database: HooksDatabase, hook: str | None = None) -> list[str]:
    """The ids of the delivery workflows (of `hook`, or of every hook) enqueued or running."""
    prefix = "bastion.hook:" if hook is None else delivery_workflow_prefix(hook)
    rows = database.rows(
        "select workflow_uuid from dbos.workflow_status"
        " where starts_with(workflow_uuid, %s) and status in ('ENQUEUED', 'PENDING')",
        prefix,
    )
    return [workflow for (workflow,) in rows]


def unfinished(database: HooksDatabase, hook: str | None = None) -> int:
    return len(unfinished_deliveries(database, hook))


def event_ids(database: HooksDatabase) -> list[int]:
    return [event_id for event_id, _, _ in outbox_ids(database)]


async def test_pruning_keeps_every_event_a_hook_has_not_passed_and_drops_failures_with_their_events(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hooks_database
    outbox = PostgresHookOutbox(hooks_store.pool)
    assert (
        await prune_outbox(hooks_store.pool, timedelta(0))
    ).events == 0  # no hook registered: nothing goes
    await simple_turns(hooks_store, 2)
    everything = event_ids(database)
    await outbox.register(
        [
            define_hook("ahead", events={"run.completed", "message.received"}, handle=noop, start="earliest"),
            define_hook("behind", events={"run.started"}, handle=noop, start="earliest"),
        ]
    )
    assert (await prune_outbox(hooks_store.pool, timedelta(0))).events == 0  # neither has moved
    await drain(outbox, "ahead")
    async with outbox.window("behind", limit=3) as opened:  # behind has passed the first three events
        assert opened is not None
        conn, window = opened
        assert window.position is not None
        await outbox.advance(conn, "behind", window.position)
    [started] = window.events
    await outbox.record_failure(started, "behind", 0, attempt=1, error="boom", gave_up=True)
    assert (await prune_outbox(hooks_store.pool, timedelta(days=1))).events == 0  # passed, but not old enough
    pruned = await prune_outbox(hooks_store.pool, timedelta(0))
    assert (pruned.events, pruned.failures) == (3, 1)
    assert event_ids(database) == everything[3:]
    assert await outbox.failures() == []
    # A replay from a pruned event says so, with a stable code; one past the outbox is unknown.
    with pytest.raises(HookEventPruned) as refused:
        await outbox.replay("behind", everything[0])
    assert refused.value.code == "hook_event_pruned" and refused.value.pruned_through_id == everything[2]
    assert "pruned" in str(refused.value)
    with pytest.raises(LookupError) as unknown:
        await outbox.replay("behind", everything[-1] + 100)
    assert not isinstance(unknown.value, HookEventPruned)
    assert await outbox.replay("behind", everything[3]) == 1
    # Everything passed and old enough goes once both hooks are through.
    await drain(outbox, "behind")
    await drain(outbox, "ahead")
    assert (await prune_outbox(hooks_store.pool, timedelta(0))).events == len(everything) - 3
    assert event_ids(database) == []


async def test_pruning_keeps_the_events_a_delivery_still_retries(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    outbox = PostgresHookOutbox(hooks_store.pool)
    async with delivering(database, hooks_store, "recorder", "broken"):
        await simple_turns(hooks_store, 2)
        expected = outbox_ids(database)
        await until(lambda: len(effects(database, "recorder")) == len(expected))
        await until(lambda: calls(database, "broken"))
        await until(lambda: dispatched(database, "broken"))
        # broken's position has passed every event, but its delivery still retries the first.
        [status] = [s for s in await outbox.status() if s.hook == "broken"]
        assert status.undispatched == 0 and status.retrying == 1
        assert (await prune_outbox(hooks_store.pool, timedelta(0))).events == 0
    assert outbox_ids(database) == expected


async def test_pruning_while_turns_are_delivered_loses_no_event(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    pruned = 0
    async with delivering(database, hooks_store, "recorder"):
        writing = asyncio.gather(*(simple_turns(hooks_store, 4) for _ in range(3)))
        while not writing.done():
            pruned += (await prune_outbox(hooks_store.pool, timedelta(0))).events
            await asyncio.sleep(0.01)
        await writing
        await until(lambda: len(effects(database, "recorder")) == 3 * 4 * EVENTS_PER_TURN)
        await until(lambda: unfinished(database) == 0)
    delivered = effects(database, "recorder")
    assert len({event_id for event_id, _, _ in delivered}) == len(delivered)
    assert all(ids == sorted(ids) for ids in per_conversation(delivered).values())
    pruned += (await prune_outbox(hooks_store.pool, timedelta(0))).events
    assert pruned == len(delivered) and outbox_ids(database) == []


async def test_the_bastion_hooks_command_prunes_delivered_events_and_finished_deliveries(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, tmp_path: Path
) -> None:
    database = hook_tables
    async with delivering(database, hooks_store, "recorder"):
        await simple_turns(hooks_store, 1)
        expected = outbox_ids(database)
        await until(lambda: len(effects(database, "recorder")) == len(expected))
        await until(lambda: unfinished(database) == 0)
    # One as DBOS leaves a workflow it gave up recovering: it goes with those that finished.
    database.execute(
        "update dbos.workflow_status set status = 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'"
        " where workflow_uuid = (select min(workflow_uuid) from dbos.workflow_status"
        " where starts_with(workflow_uuid, 'bastion.hook:'))"
    )
    code, kept, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path, "prune", "--older-than", "1d")
    assert code == 0 and kept.startswith("Pruned 0 event(s)") and " 0 finished delivery" in kept
    code, pruned, _ = await asyncio.to_thread(
        bastion_hooks, database, tmp_path, "prune", "--older-than", "0s"
    )
    assert code == 0
    assert pruned.startswith(f"Pruned {len(expected)} event(s) every hook has passed, 0 failure record(s)")
    assert outbox_ids(database) == []
    deliveries = "select count(*) from dbos.workflow_status where starts_with(workflow_uuid, 'bastion.hook:')"
    assert database.rows(deliveries) == [(0,)]
    code, _, refused = await asyncio.to_thread(
        bastion_hooks, database, tmp_path, "replay", "recorder", "--from", str(expected[0][0])
    )
    assert code == 2 and f"hook_event_pruned: Event {expected[0][0]} was pruned" in refused


def test_a_prune_without_a_valid_age_is_refused_before_connecting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from bastion.cli import main

    assert main(["hooks", "prune", "--data-dir", str(tmp_path)]) == 2
    assert main(["hooks", "prune", "--older-than", "7 weeks", "--data-dir", str(tmp_path)]) == 2
    assert "prune needs --older-than AGE" in capsys.readouterr().err
    assert parse_age("30d") == timedelta(days=30) and parse_age("90s") == timedelta(seconds=90)
    with pytest.raises(ValueError):
        parse_age("-1h")
