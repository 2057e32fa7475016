"""The durable engine: DBOS in the application's Postgres as a role without BYPASSRLS, a liveness lock per
process, and a janitor that gives a dead worker's workflows to a live one (DBOS's recovery call, which is
internal to DBOS, is exercised here end to end: this is its contract test)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from dbos import DBOS

from bastion.durable import DurableEngine, DurableEngineError, system_database_url
from tests import durable_workflows
from tests.conftest import MigratedDatabase

ROOT = Path(__file__).resolve().parent.parent


def _admin(database: MigratedDatabase) -> psycopg.Connection:
    return psycopg.connect(database.admin_dsn, autocommit=True)


async def _start_worker(database: MigratedDatabase, key: str, executor: str) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "BASTION_TEST_DSN": database.admin_dsn,
        "BASTION_TEST_APP_DSN": database.app_dsn,
        "BASTION_EXECUTOR_ID": executor,
    }
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.durable_worker",
        key,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 60)
    assert line.startswith(b"started"), (line, await child.stderr.read() if child.stderr else b"")
    return child


def _effects(database: MigratedDatabase, key: str) -> list[tuple[str, str]]:
    with _admin(database) as conn:
        return [
            (step, executor)
            for step, executor in conn.execute(
                "select step, executor from public.durable_effects where workflow = %s order by at", (key,)
            )
        ]


async def _until(check, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.fixture
def effects_tables(migrated_database: MigratedDatabase) -> MigratedDatabase:
    with _admin(migrated_database) as conn:
        conn.execute(durable_workflows.EFFECTS_TABLE)
    os.environ["BASTION_TEST_DSN"] = migrated_database.admin_dsn
    return migrated_database


async def test_a_dead_workers_workflow_is_finished_by_a_live_one_from_its_last_completed_step(
    effects_tables: MigratedDatabase,
) -> None:
    database = effects_tables
    key = f"wf-{uuid.uuid4()}"
    dead = f"dead-{uuid.uuid4().hex[:8]}"
    worker = await _start_worker(database, key, dead)
    try:
        await _until(lambda: ("wait", dead) in _effects(database, key))
        engine = await DurableEngine.launch(database.app_dsn, recovery_interval=60)
        async with engine:
            # While the worker lives, its workflow is its own: a janitor pass takes nothing.
            assert await engine.recover_dead_executors() == []
            worker.send_signal(signal.SIGKILL)
            await worker.wait()
            with _admin(database) as conn:
                conn.execute("insert into public.durable_release values (%s)", (key,))
            recovered: list[str] = []

            async def janitor_took_it() -> None:
                while not recovered:
                    recovered.extend(await engine.recover_dead_executors())
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(janitor_took_it(), 30)
            assert recovered == [dead]
            handle = await DBOS.retrieve_workflow_async(key)
            assert await asyncio.wait_for(handle.get_result(), 30) == [f"first:{key}", f"released:{key}"]
            status = await DBOS.get_workflow_status_async(key)
            assert status is not None and status.status == "SUCCESS"
            assert status.executor_id == engine.executor_id
            # A second pass finds nothing left of the dead executor.
            assert await engine.recover_dead_executors() == []
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
    # The completed step ran once, on the dead worker; only the interrupted one ran again, here.
    assert _effects(database, key) == [("first", dead), ("wait", dead), ("wait", "test")]


async def test_an_engine_that_stopped_recovering_leaves_a_dead_workers_workflow_to_the_others(
    effects_tables: MigratedDatabase,
) -> None:
    """What a draining worker does: its janitor takes no dead worker's workflow any more."""
    database = effects_tables
    key = f"wf-{uuid.uuid4()}"
    dead = f"dead-{uuid.uuid4().hex[:8]}"
    worker = await _start_worker(database, key, dead)
    try:
        await _until(lambda: ("wait", dead) in _effects(database, key))
        async with await DurableEngine.launch(database.app_dsn, recovery_interval=0.05) as engine:
            engine.stop_recovering()
            worker.send_signal(signal.SIGKILL)
            await worker.wait()
            with _admin(database) as conn:
                conn.execute("insert into public.durable_release values (%s)", (key,))
            await asyncio.sleep(1.0)  # twenty janitor passes, had it kept looking
            assert engine.recovered == []
            status = await DBOS.get_workflow_status_async(key)
            assert status is not None and (status.status, status.executor_id) == ("PENDING", dead)
            # Another process's janitor (here, an explicit pass) still finds it.
            assert await engine.recover_dead_executors() == [dead]
            handle = await DBOS.retrieve_workflow_async(key)
            assert await asyncio.wait_for(handle.get_result(), 30) == [f"first:{key}", f"released:{key}"]
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()


async def test_an_executor_id_held_by_a_live_process_is_refused(migrated_database: MigratedDatabase) -> None:
    executor = f"held-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(migrated_database.app_dsn, autocommit=True) as holder:
        holder.execute("select pg_advisory_lock(hashtextextended(%s, 0))", (f"bastion.executor:{executor}",))
        with pytest.raises(DurableEngineError, match="held by a live process"):
            await DurableEngine.launch(migrated_database.app_dsn, executor_id=executor)
    async with await DurableEngine.launch(migrated_database.app_dsn, executor_id=executor) as engine:
        assert engine.executor_id == executor


async def test_the_engine_runs_workflows_as_the_application_role_and_users_never_reach_its_schema(
    effects_tables: MigratedDatabase, durable_engine: DurableEngine
) -> None:
    key = f"wf-{uuid.uuid4()}"
    with _admin(effects_tables) as conn:
        conn.execute("insert into public.durable_release values (%s)", (key,))
    handle = await DBOS.start_workflow_async(durable_workflows.counted, key)
    assert await asyncio.wait_for(handle.get_result(), 30) == [f"first:{key}", f"released:{key}"]
    with psycopg.connect(effects_tables.app_dsn, autocommit=True) as conn:
        role = "select rolbypassrls, rolsuper from pg_roles where rolname = current_user"
        assert conn.execute(role).fetchone() == (False, False)
    # A user's direct connection (Supabase's Data API role) sees nothing of DBOS: its workflow inputs
    # hold every tenant's messages.
    with psycopg.connect(effects_tables.cluster.dsn(effects_tables.name, user="api_client")) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select count(*) from dbos.workflow_status")
        conn.rollback()
        conn.execute("set role authenticated")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("select count(*) from dbos.workflow_inputs")


async def test_queues_are_polled_quickly_by_default(durable_engine: DurableEngine) -> None:
    queue = await durable_engine.register_queue(f"q-{uuid.uuid4().hex[:8]}", partition_concurrency=1)
    assert queue.polling_interval_sec == 0.1
    assert queue.partition_concurrency == 1


def test_connection_strings_become_dbos_urls() -> None:
    assert system_database_url("postgresql://u:p@db:5432/app") == "postgresql+psycopg://u:p@db:5432/app"
    assert system_database_url("postgres://u@db/app") == "postgresql+psycopg://u@db/app"
    url = system_database_url("host=/run/pg port=5433 user=app password=s3 dbname=main")
    assert url.startswith("postgresql+psycopg://app:s3@/main?")
    assert "host=%2Frun%2Fpg" in url and "port=5433" in url


async def test_a_dequeued_workflow_runs_on_the_loop_that_launched_the_engine(
    durable_engine: DurableEngine,
) -> None:
    """Queued and recovered workflows use the application's pools and clients, which belong to its loop."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    await durable_engine.register_queue(name)
    handle = await DBOS.enqueue_workflow_async(name, durable_workflows.which_loop)
    assert await asyncio.wait_for(handle.get_result(), 30) == id(asyncio.get_running_loop())
