"""Forgetting a retired hook: its subscription, failures and holds go and its unfinished deliveries are
cancelled, so retention prunes past where it stopped; the other hooks carry on."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from bastion.hooks import (
    ForgottenHook,
    PostgresHookOutbox,
    delivery_workflow_prefix,
    prune_outbox,
)
from bastion.stores import PostgresStore
from tests import hook_apps
from tests.hooks_db import HooksDatabase
from tests.test_hooks_delivery import (
    bastion_hooks,
    calls,
    delivering,
    dispatched,
    effects,
    hook_tables,
    outbox_ids,
    simple_turns,
    until,
    until_broken_retries_alone,
)
from tests.test_hooks_retention import unfinished, unfinished_deliveries

__all__ = ["hook_tables"]  # the fixture, shared with the delivery tests


def lanes_alone(database: HooksDatabase, hook: str) -> int:
    """How many of the conversation's lanes wait to try `hook` again, each holding it, once the hook's
    position has passed every event and its batches have finished (0 before): the turn's events may
    have gone out in one batch or in two."""
    waiting = unfinished_deliveries(database, hook)
    lanes = sum(":c" in workflow for workflow in waiting)
    settled = dispatched(database, hook) and lanes == len(waiting) == held(database, hook)
    return lanes if settled else 0


def workflows_of(database: HooksDatabase, hook: str) -> int:
    [(count,)] = database.rows(
        "select count(*) from dbos.workflow_status where starts_with(workflow_uuid, %s)",
        delivery_workflow_prefix(hook),
    )
    return int(count)


def held(database: HooksDatabase, hook: str) -> int:
    [(count,)] = database.rows("select count(*) from bastion.hook_holds where hook = %s", hook)
    return int(count)


async def test_a_forgotten_hook_no_longer_holds_retention_back(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, tmp_path: Path
) -> None:
    database = hook_tables
    outbox = PostgresHookOutbox(hooks_store.pool)
    async with delivering(database, hooks_store, "recorder", "broken"):
        await simple_turns(hooks_store, 1)
        expected = await until_broken_retries_alone(database, hooks_store)
        await until(lambda: lanes_alone(database, "broken") >= 1)
        lanes = lanes_alone(database, "broken")
    # The application stops registering `broken`: its delivery, still retrying the first event,
    # keeps every event in the outbox.
    every = workflows_of(database, "broken")  # its batches and their lanes
    assert unfinished(database) == lanes and every == 2 * lanes
    assert (await prune_outbox(hooks_store.pool, timedelta(0))).events == 0

    # An interrupted forget: the subscription went, its deliveries were not cancelled yet.
    assert await outbox.forget("broken") == ForgottenHook(failures=1, holds=lanes)
    assert database.rows("select hook from bastion.hook_subscriptions") == [("recorder",)]
    assert database.rows("select 1 from bastion.hook_failures") == []
    assert held(database, "broken") == 0
    assert await outbox.forget("broken") is None
    # Run again, the command cancels and deletes what is left.
    code, forgot, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path, "forget", "broken")
    assert code == 0
    assert forgot.strip() == (
        f"Forgot broken: it had no subscription left; deleted {every} delivery workflow(s), of which"
        f" {lanes} unfinished were cancelled."
    )
    assert unfinished(database) == 0 and workflows_of(database, "broken") == 0
    code, listed, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path)
    assert code == 0 and [line.split()[0] for line in listed.splitlines()[1:]] == ["recorder"]
    # Now every event the remaining hook has passed goes.
    assert (await prune_outbox(hooks_store.pool, timedelta(0))).events == len(expected)
    assert outbox_ids(database) == []
    code, _, refused = await asyncio.to_thread(bastion_hooks, database, tmp_path, "forget", "broken")
    assert code == 2 and "There is no hook named 'broken'." in refused


async def test_forgetting_a_hook_while_delivery_runs_stops_it_and_spares_the_others(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, tmp_path: Path
) -> None:
    database = hook_tables
    async with delivering(database, hooks_store, "recorder", "broken"):
        await simple_turns(hooks_store, 1)
        await until(lambda: lanes_alone(database, "broken") >= 1)
        lanes = lanes_alone(database, "broken")
        code, forgot, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path, "forget", "broken")
        assert code == 0
        assert forgot.startswith(
            f"Forgot broken: deleted its position, 1 failure record(s) and {lanes} hold(s);"
        )
        assert forgot.strip().endswith(f"of which {lanes} unfinished were cancelled.")
        assert unfinished(database, "broken") == 0
        # Later turns reach the remaining hook and none reaches the forgotten one.
        called = set(calls(database, "broken"))
        await simple_turns(hooks_store, 2)
        expected = outbox_ids(database)
        await until(lambda: len(effects(database, "recorder")) == len(expected))
        await until(lambda: dispatched(database, "recorder"))
        assert set(calls(database, "broken")) == called
        assert database.rows("select hook from bastion.hook_subscriptions") == [("recorder",)]


async def test_a_hook_subscribed_again_under_a_forgotten_name_delivers_its_events_afresh(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, tmp_path: Path
) -> None:
    database = hook_tables
    await simple_turns(hooks_store, 1)
    first = outbox_ids(database)[0][0]
    async with delivering(database, hooks_store, "broken"):
        await until(lambda: calls(database, "broken").get(first) == 1)
    code, _, _ = await asyncio.to_thread(bastion_hooks, database, tmp_path, "forget", "broken")
    assert code == 0
    # Subscribed again from the oldest event: the same batch as before, which must not be taken
    # for the forgotten subscription's delivery of it.
    async with delivering(database, hooks_store, "broken"):
        await until(lambda: calls(database, "broken").get(first) == 2)


def test_a_forget_without_a_hook_is_refused_before_connecting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from bastion.cli import main

    assert main(["hooks", "forget", "--data-dir", str(tmp_path)]) == 2
    assert "forget needs the hook's name" in capsys.readouterr().err


async def test_the_hooks_command_names_an_unknown_hook_and_a_database_refusal_without_a_traceback(
    hook_tables: HooksDatabase, hooks_store: PostgresStore, tmp_path: Path
) -> None:
    database = hook_tables
    await PostgresHookOutbox(hooks_store.pool).register(hook_apps.registry("recorder"))
    code, shown, refused = await asyncio.to_thread(bastion_hooks, database, tmp_path, "failures", "typo")
    assert (code, shown) == (2, "") and "There is no hook named 'typo'." in refused
    database.execute("revoke all on bastion.hook_subscriptions from bastion_runtime")
    code, shown, refused = await asyncio.to_thread(bastion_hooks, database, tmp_path)
    assert (code, shown) == (1, "")
    assert refused.strip() == (
        "bastion: hooks list could not finish; the database said InsufficientPrivilege:"
        " permission denied for table hook_subscriptions"
    )
