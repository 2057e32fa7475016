"""Retention runs by itself: its schedule prunes finished turns' workflows and stream logs, never a
running turn's, and a policy refuses a negative age."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta

import httpx2
import psycopg
import pytest
from dbos import DBOS

from bastion.durable import DurableEngine, retention_workflow
from bastion.retention import SCHEDULE_NAME, Retention, RetentionNotStarted, RetentionPolicy
from bastion.stores import PostgresStore
from tests.conftest import MigratedDatabase
from tests.durable_cluster import until, user_message
from tests.scripted import ScriptedModel
from tests.test_chat_routes import Project
from tests.test_durable_runs import finished, runs, serve, workflow
from tests.test_live_turns import GatedModel

EVERY_SECOND = "* * * * * *"


def log_rows(database: MigratedDatabase, run_id: str) -> int:
    with psycopg.connect(database.admin_dsn) as conn:
        row = conn.execute("select count(*) from bastion.run_chunks where run_id = %s", (run_id,)).fetchone()
    return int(row[0]) if row else 0


def scheduled_runs(database: MigratedDatabase) -> list[tuple[str, str]]:
    with psycopg.connect(database.admin_dsn) as conn:
        return conn.execute(
            "select workflow_uuid, status from dbos.workflow_status"
            " where starts_with(workflow_uuid, 'sched-bastion.retention-') order by workflow_uuid"
        ).fetchall()


async def test_the_schedule_prunes_a_finished_turn_and_keeps_the_running_one(
    migrated_database: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    project = Project()
    headers = project.headers(str(uuid.uuid4()))
    done, running = str(uuid.uuid4()), str(uuid.uuid4())
    # Its first request calls a tool the agent lacks: the second one's start writes the log so far.
    gated = GatedModel(["Still"], [" going."], tool_call="missing_tool")
    store = await PostgresStore.open(migrated_database.app_dsn, max_size=4)
    async with (
        store,
        serve(store, ScriptedModel(["Hello", " there."]), durable_engine, project) as quick_url,
        serve(store, gated, durable_engine, project) as gated_url,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        body = {"id": done, "messages": [user_message("hi")], "trigger": "submit-message"}
        assert (await http.post(f"{quick_url}/api/chat", json=body, headers=headers)).status_code == 200
        [(done_run, _, _)] = runs(migrated_database, done)
        assert await finished(migrated_database, done, done_run) is not None
        assert log_rows(migrated_database, done_run) > 0

        body = {"id": running, "messages": [user_message("hi")], "trigger": "submit-message"}
        posted = asyncio.ensure_future(http.post(f"{gated_url}/api/chat", json=body, headers=headers))
        await gated.waiting.wait()
        try:
            [(running_run, _, _)] = runs(migrated_database, running)
            await until(lambda: log_rows(migrated_database, running_run) > 0, 10)
            policy = RetentionPolicy(finished_turns=timedelta(0), schedule=EVERY_SECOND)
            retention = Retention(store, conninfo=migrated_database.app_dsn, policy=policy, hooks=False)
            await retention.start(durable_engine)
            try:
                # Nobody calls run_once: the schedule does, once a second, cluster-wide.
                await until(lambda: workflow(migrated_database, done, done_run) is None, 20)
            finally:
                retention.stop()
                await DBOS.delete_schedule_async(SCHEDULE_NAME)  # the session's database is shared
            assert log_rows(migrated_database, done_run) == 0
            assert workflow(migrated_database, running, running_run) == (
                "PENDING",
                durable_engine.executor_id,
            )
            assert log_rows(migrated_database, running_run) > 0
        finally:
            gated.gate.set()
        assert (await posted).status_code == 200
    fired = scheduled_runs(migrated_database)
    assert fired and all(status in {"SUCCESS", "PENDING", "ENQUEUED"} for _, status in fired)


async def test_one_retention_runs_per_process(
    migrated_database: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    """A second Retention in one process is refused: DBOS finds the process's one by name."""
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=2) as store:
        first = Retention(store, conninfo=migrated_database.app_dsn, hooks=False)
        second = Retention(store, conninfo=migrated_database.app_dsn, hooks=False)
        await first.start(durable_engine)
        try:
            with pytest.raises(RuntimeError, match="Another Retention"):
                await second.start(durable_engine)
        finally:
            first.stop()
        await second.start(durable_engine)
        second.stop()
        await DBOS.delete_schedule_async(SCHEDULE_NAME)


async def test_a_run_in_a_process_that_never_starts_retention_waits_then_ends_in_error(
    migrated_database: MigratedDatabase,
    durable_engine: DurableEngine,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Visible, not skipped: the run waits for the process's Retention (here half a second), then logs
    an error and ends in DBOS's ERROR. The wait that lets a run recovered early succeed:
    tests/test_retention_crash.py."""
    monkeypatch.setattr(retention_workflow, "READY_WAIT_SECONDS", 0.5)
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=2) as store:
        retention = Retention(store, conninfo=migrated_database.app_dsn, hooks=False)
        await retention.start(durable_engine)
        retention.stop()  # the schedule stays, this process's Retention is gone
        try:
            handle = await asyncio.to_thread(DBOS.trigger_schedule, SCHEDULE_NAME)
            with (
                caplog.at_level(logging.ERROR, logger="bastion.retention"),
                pytest.raises(RetentionNotStarted),
            ):
                await asyncio.wait_for(asyncio.to_thread(handle.get_result), 20)
        finally:
            await DBOS.delete_schedule_async(SCHEDULE_NAME)
    assert (await asyncio.to_thread(handle.get_status)).status == "ERROR"
    assert "no Retention was started in this process" in caplog.text


@pytest.mark.parametrize("field", ["finished_turns", "inbox_jobs", "delivered_events"])
def test_a_negative_age_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RetentionPolicy(**{field: timedelta(seconds=-1)})  # type: ignore[arg-type]
