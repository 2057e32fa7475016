"""Scheduled retention survives SIGKILL: a worker killed while a retention run is in flight is restarted,
the run (recovered from the dead worker and handed to the restarted one before it started its
retention, which the run waits for) completes once, and it deleted the old turn's workflow and stream
log while the recent turn's and the running turn's stay.

Real worker processes (`tests.durable_chat_worker` with `BASTION_TEST_RETENTION=1`) on a database of
their own. Retention's schedule never fires by itself here: the test triggers one run through DBOS's
client, and holds it in flight with a lock on the old turn's log rows.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from dbos import DBOSClient

from bastion.chat.durable_turns import turn_workflow_id
from bastion.durable import DURABLE_SCHEMA, migrate_durable, system_database_url
from bastion.retention import SCHEDULE_NAME
from bastion.stores import apply_migrations
from tests.conftest import MigratedDatabase
from tests.durable_cluster import Cluster, cluster_of, post_turn, until, user_message
from tests.pg import PostgresCluster

RETENTION = {"BASTION_TEST_RETENTION": "1"}
DELAY = 0.2  # seconds per streamed delta: a long turn takes about 5 s


@pytest.fixture(scope="module")
def retention_database(pg_cluster: PostgresCluster) -> MigratedDatabase:
    name = pg_cluster.database("retkill")
    dsn = pg_cluster.dsn(name)
    asyncio.run(apply_migrations(dsn))
    pg_cluster.create_login_roles()
    asyncio.run(migrate_durable(dsn, app_role="bastion_app"))
    return MigratedDatabase(pg_cluster, name)


@pytest.fixture
def client(retention_database: MigratedDatabase) -> Iterator[DBOSClient]:
    client = DBOSClient(
        system_database_url=system_database_url(retention_database.app_dsn), dbos_system_schema=DURABLE_SCHEMA
    )
    try:
        yield client
    finally:
        client.destroy()


def one(cluster: Cluster, sql: str, *args: Any) -> Any:
    with cluster.admin() as conn:
        row = conn.execute(sql, args).fetchone()
    return row[0] if row else None


def latest_run(cluster: Cluster, conversation: str) -> str:
    run = cluster.run(conversation)
    assert run is not None
    return run[0]


def log_rows(cluster: Cluster, run_id: str) -> int:
    return int(one(cluster, "select count(*) from bastion.run_chunks where run_id = %s", run_id))


def turn_status(cluster: Cluster, conversation: str, run_id: str) -> str | None:
    found = cluster.workflow(conversation, run_id)
    return found[0] if found else None


async def short_turn(cluster: Cluster, worker: Any, user: str) -> tuple[str, str]:
    conversation = str(uuid.uuid4())
    status, chunks = await (await post_turn(cluster, worker, user, conversation, [user_message("hi")]))
    assert status == 200 and chunks[-1]["type"] == "finish"
    run_id = latest_run(cluster, conversation)
    await until(lambda: turn_status(cluster, conversation, run_id) == "SUCCESS", timeout=10)
    assert log_rows(cluster, run_id) > 0
    return conversation, run_id


def retention_runs(cluster: Cluster) -> list[tuple[str, str, str]]:
    with cluster.admin() as conn:
        rows = conn.execute(
            "select workflow_uuid, status, executor_id from dbos.workflow_status"
            " where starts_with(workflow_uuid, %s) order by workflow_uuid",
            (f"sched-{SCHEDULE_NAME}-",),
        ).fetchall()
    return [(workflow_id, status, executor) for workflow_id, status, executor in rows]


def blocked_on_the_log(cluster: Cluster) -> bool:
    """Whether retention's prune of the stream logs waits for the lock the test holds."""
    return bool(
        one(
            cluster,
            "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and query like %s",
            "%prune_run_chunks%",
        )
    )


async def test_a_retention_run_whose_worker_is_killed_completes_once_after_a_restart(
    retention_database: MigratedDatabase, client: DBOSClient
) -> None:
    async with cluster_of(retention_database, delay=DELAY) as cluster:
        worker = await cluster.start("keeper", extra_env=RETENTION)
        user = str(uuid.uuid4())
        old, old_run = await short_turn(cluster, worker, user)
        recent, recent_run = await short_turn(cluster, worker, user)
        # The old turn ended two hours ago, past the worker's one hour.
        with cluster.admin() as conn:
            conn.execute(
                "update bastion.runs set finished_at = finished_at - interval '2 hours' where id = %s",
                (old_run,),
            )
            conn.execute(
                "update dbos.workflow_status set completed_at = completed_at - 7200000"
                " where workflow_uuid = %s",
                (turn_workflow_id(old, old_run),),
            )
        running = str(uuid.uuid4())
        posted = await post_turn(cluster, worker, user, running, [user_message(f"turn {running}")])
        await until(lambda: cluster.count(running, "model:turn:0") > 0)
        running_run = latest_run(cluster, running)

        # A run in flight: it waits for the old turn's log rows, which the test holds.
        holder = psycopg.connect(retention_database.admin_dsn)
        try:
            holder.execute("select 1 from bastion.run_chunks where run_id = %s for update", (old_run,))
            await asyncio.to_thread(client.trigger_schedule, SCHEDULE_NAME)
            await until(lambda: blocked_on_the_log(cluster), timeout=15)
            [(fired, status, executor)] = retention_runs(cluster)
            assert (status, executor) == ("PENDING", worker.executor)
            await cluster.kill(worker)
            # The dead worker's statement would still run once the lock is gone (a backend notices its
            # client closed only when it answers): end it, as `client_connection_check_interval` would.
            one(
                cluster,
                "select count(pg_terminate_backend(pid)) from pg_stat_activity"
                " where wait_event_type = 'Lock' and query like %s",
                "%prune_run_chunks%",
            )
            await until(lambda: not blocked_on_the_log(cluster), timeout=10)
        finally:
            holder.rollback()
            holder.close()
        await posted  # the client's stream broke with the worker
        old_rows = log_rows(cluster, old_run)
        assert old_rows > 0

        # Restarted, it starts its retention three seconds after its engine launched: the recovered run,
        # which DBOS may hand it at once, waits for it.
        restarted = await cluster.start("keeper", extra_env=RETENTION, start_delay=3.0)
        await until(lambda: retention_runs(cluster)[0][1] != "PENDING", timeout=40)
        assert retention_runs(cluster) == [(fired, "SUCCESS", restarted.executor)]
        # Its one step (the prune) recorded once: the cut attempt recorded nothing.
        steps = one(
            cluster,
            "select count(*) from dbos.operation_outputs where workflow_uuid = %s and function_name = %s",
            fired,
            "bastion.retention.run",
        )
        assert steps == 1
        print(f"the recovered run deleted the old turn's {old_rows} log rows and its workflow")

        assert log_rows(cluster, old_run) == 0 and cluster.workflow(old, old_run) is None
        assert log_rows(cluster, recent_run) > 0 and turn_status(cluster, recent, recent_run) == "SUCCESS"
        # The running turn, taken over by the restarted worker, kept its log and finishes.
        assert log_rows(cluster, running_run) > 0
        await until(lambda: turn_status(cluster, running, running_run) == "SUCCESS", timeout=30)
        assert cluster.count(running, "tool:done") == 1
