"""A delivery that ends in an error (delivery's own code failing, not the hook) is shown to the operator
with the replay that delivers its events, and that replay does; a hook's error message Postgres could
not store as it is does not end its delivery."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bastion.hooks import HookDelivery, failed_deliveries
from bastion.hooks._batches import Aside, Batch
from bastion.stores import PostgresStore
from tests.hooks_db import HooksDatabase
from tests.test_hooks_delivery import (
    bastion_hooks,
    calls,
    delivering,
    effects,
    hook_tables,
    outbox_ids,
    simple_turns,
    until,
)

__all__ = ["hook_tables"]  # the fixture, shared with the delivery tests


async def test_a_delivery_that_ended_in_an_error_is_listed_with_the_replay_that_delivers_its_events(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = hook_tables
    attempt = HookDelivery.attempt_batch
    broke = [0]

    async def broken_once(delivery: HookDelivery, hook: str, batch: Batch, generation: int) -> Aside:
        if not broke[0]:
            broke[0] += 1
            raise RuntimeError("a bug in delivery")
        return await attempt(delivery, hook, batch, generation)

    monkeypatch.setattr(HookDelivery, "attempt_batch", broken_once)
    await simple_turns(hooks_store, 1)  # written before delivery starts: one batch
    expected = outbox_ids(database)
    first = expected[0][0]
    async with delivering(database, hooks_store, "recorder"):

        async def ended() -> bool:
            return bool(await failed_deliveries(hooks_store.pool, "recorder"))

        await until(ended)
        [failed] = await failed_deliveries(hooks_store.pool)
        assert (failed.hook, failed.first_event_id, failed.status) == ("recorder", first, "ERROR")
        assert effects(database, "recorder") == [] and calls(database, "recorder") == {}
        code, listed, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path)
        assert code == 0 and listed.splitlines()[0].split()[-1] == "failed"
        [row] = listed.splitlines()[1:]
        assert row.split()[0] == "recorder" and row.split()[-1] == "1"
        code, shown, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path, "failures", "recorder")
        assert code == 0
        assert shown.strip() == (
            f"recorder delivery {failed.workflow_id} ended in an error (ERROR) at"
            f" {failed.ended_at.isoformat(timespec='seconds')}: its events may not have been delivered;"
            f" bastion hooks replay recorder --from {first}"
        )
        # A replay from a later event leaves the delivery's first events undelivered: it stays.
        last = expected[-1][0]
        code, _, _ = await asyncio.to_thread(
            bastion_hooks, database, tmp_path, "replay", "recorder", "--from", str(last)
        )
        assert code == 0
        await until(lambda: calls(database, "recorder") == {last: 1})
        assert await failed_deliveries(hooks_store.pool) == [failed]
        # The replay it names delivers every event in order, and settles it.
        code, _, _ = await asyncio.to_thread(
            bastion_hooks, database, tmp_path, "replay", "recorder", "--from", str(first)
        )
        assert code == 0
        await until(lambda: len(effects(database, "recorder")) == len(expected))
        await until(lambda: calls(database, "recorder").get(last) == 2)
        assert await failed_deliveries(hooks_store.pool) == []
        code, listed, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path)
        assert code == 0 and listed.splitlines()[1].split()[-1] == "0"
    # The later replay's call, then the whole replay's, in order.
    called = database.rows("select event_id from public.hook_calls where hook = 'recorder' order by at")
    assert [event_id for (event_id,) in called] == [last] + [event_id for event_id, _, _ in expected]
    assert sorted(effects(database, "recorder")) == expected


async def test_a_hook_error_postgres_cannot_store_as_it_is_is_recorded_and_the_event_retried(
    hook_tables: HooksDatabase, hooks_store: PostgresStore
) -> None:
    database = hook_tables
    await simple_turns(hooks_store, 1)
    expected = outbox_ids(database)
    async with delivering(database, hooks_store, "garbled") as delivery:

        async def all_delivered() -> bool:
            failures = await delivery.outbox.failures("garbled")
            return len(failures) == len(expected) and all(f.delivered for f in failures)

        await until(all_delivered)  # each recorded failed once, then delivered at its second call
        failures = await delivery.outbox.failures("garbled")
    assert await failed_deliveries(hooks_store.pool) == []
    assert set(calls(database, "garbled").values()) == {2}
    assert sorted(effects(database, "garbled")) == expected
    assert all(f.attempts == 1 for f in failures)
    error = failures[0].error
    assert error.startswith("ValueError: a NUL \\0 and a lone surrogate ? xxx") and len(error) == 1000
