"""Memory extraction as a durable job: one job per chat turn (a second enqueue is a no-op), the fact
stored as the turn's owner, the job deleted with its conversation, a job that keeps failing ending in
DBOS's ERROR (logged, and listed by `failed_extractions`), a job whose worker is SIGKILLed finished
once by the restarted worker, a turn whose worker died between its save and its enqueue still
extracted once, and without a started memory the in-process extraction of before.

The tests run on a database of their own with bastion's, memory's and DBOS's migrations; the
in-process ones launch this process's engine on it, the kill tests run `tests.durable_chat_worker`
processes (with `BASTION_TEST_MEMORY=1`)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import psycopg
import pytest
from dbos import DBOS

from bastion.cli import main
from bastion.durable import DurableEngine, migrate_durable
from bastion.memory import (
    AgentMemory,
    ExtractionJob,
    HashingEmbedder,
    PostgresMemoryStore,
    apply_memory_migrations,
    define_memory,
    failed_extractions,
)
from bastion.memory.extraction_jobs import EXTRACTION_WORKFLOW, extraction_job_id
from bastion.retention import Retention, RetentionPolicy
from bastion.stores import PostgresStore, StoreIdentity, apply_migrations
from tests.conftest import MigratedDatabase
from tests.durable_cluster import cluster_of, post_turn, until, user_message
from tests.pg import PostgresCluster
from tests.scripted import ScriptedModel
from tests.test_chat_routes import Project
from tests.test_durable_runs import serve

MEMORY = {"BASTION_TEST_MEMORY": "1"}
TENANT = "tenant-a"  # the tenant in the test tokens' `app_metadata`


@pytest.fixture(scope="module")
def jobs_database(pg_cluster: PostgresCluster) -> MigratedDatabase:
    name = pg_cluster.database("memjobs")
    dsn = pg_cluster.dsn(name)
    asyncio.run(apply_migrations(dsn))
    asyncio.run(apply_memory_migrations(dsn))
    pg_cluster.create_login_roles()
    asyncio.run(migrate_durable(dsn, app_role="bastion_app"))
    return MigratedDatabase(pg_cluster, name)


@pytest.fixture
async def store(jobs_database: MigratedDatabase) -> AsyncIterator[PostgresStore]:
    async with await PostgresStore.open(jobs_database.app_dsn, max_size=6) as store:
        yield store


@pytest.fixture
async def engine(jobs_database: MigratedDatabase) -> AsyncIterator[DurableEngine]:
    async with await DurableEngine.launch(jobs_database.app_dsn, recovery_interval=0.2) as engine:
        yield engine


def memory_of(store: PostgresStore, extract: Any, **options: Any) -> AgentMemory[Any]:
    return define_memory(
        store=PostgresMemoryStore(store, embedder=HashingEmbedder(64)),
        identity=lambda context: context.identity,
        operation_id=lambda context: context.run_id,
        tools=False,
        extract=extract,
        **options,
    )


def jobs(database: MigratedDatabase, run_id: str) -> list[tuple[str, str]]:
    """The extraction workflows of a run: id and status."""
    with psycopg.connect(database.admin_dsn) as conn:
        rows = conn.execute(
            "select workflow_uuid, status from dbos.workflow_status"
            " where name = %s and workflow_uuid like %s",
            (EXTRACTION_WORKFLOW, f"%:{run_id}"),
        ).fetchall()
    return [(workflow_id, status) for workflow_id, status in rows]


def status_of(database: MigratedDatabase, run_id: str) -> str | None:
    found = jobs(database, run_id)
    return found[0][1] if found else None


def latest_run(database: MigratedDatabase, conversation: str) -> str:
    with psycopg.connect(database.admin_dsn) as conn:
        row = conn.execute(
            "select id::text from bastion.runs where conversation_id = %s order by started_at desc limit 1",
            (conversation,),
        ).fetchone()
    assert row is not None
    return str(row[0])


def facts(database: MigratedDatabase, user: str) -> list[tuple[str, str, str]]:
    """The user's current memories as stored: text, source and tenant."""
    with psycopg.connect(database.admin_dsn) as conn:
        rows = conn.execute(
            "select content, source, tenant_id from bastion.memories"
            " where owner_id = %s and superseded_at is null",
            (user,),
        ).fetchall()
    return [(content, source, tenant) for content, source, tenant in rows]


def failures_printed(database: MigratedDatabase, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `bastion memory failures` prints for the database."""
    env = {"DATABASE_URL": database.admin_dsn, "BASTION_APP_DATABASE_URL": database.app_dsn}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        capsys.readouterr()
        assert main(["memory", "failures", "--data-dir", str(data_dir)]) == 0
    return capsys.readouterr().out


async def chat(url: str, project: Project, user: str, conversation: str, text: str) -> None:
    body = {"id": conversation, "messages": [user_message(text)], "trigger": "submit-message"}
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await http.post(f"{url}/api/chat", json=body, headers=project.headers(user))
    assert response.status_code == 200
    assert '"type":"finish"' in response.text.replace(" ", "")


async def test_a_durable_turn_queues_one_extraction_job_whose_fact_is_stored_as_the_turns_owner(
    jobs_database: MigratedDatabase, store: PostgresStore, engine: DurableEngine
) -> None:
    calls: list[tuple[list[dict[str, Any]], Any]] = []

    async def extract(messages: list[dict[str, Any]], context: Any) -> list[str]:
        calls.append((messages, context))
        return ["Prefers green tea."]

    memory = memory_of(store, extract)
    await memory.start(engine, context=lambda job: job)
    project, user, conversation = Project(), str(uuid.uuid4()), str(uuid.uuid4())
    try:
        async with serve(
            store, ScriptedModel(["Noted."]), engine, project, after_turn=memory.after_chat_turn
        ) as url:
            await chat(url, project, user, conversation, "I like green tea")
            run_id = latest_run(jobs_database, conversation)
            job_id = extraction_job_id("default", run_id)
            await until(lambda: status_of(jobs_database, run_id) == "SUCCESS", timeout=20)
        assert facts(jobs_database, user) == [("Prefers green tea.", "extract", TENANT)]
        # Stored as the owner (user and tenant): recalled for them, not for someone else.
        owner = StoreIdentity(user_id=user, tenant_id=TENANT)
        found = await memory.store.search(owner, "green tea", scope=memory.scope)
        assert [item.text for item in found] == ["Prefers green tea."]
        someone = StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=TENANT)
        assert await memory.store.search(someone, "green tea", scope=memory.scope) == []
        # The extractor saw the turn's messages and a context rebuilt from the job.
        [(messages, context)] = calls
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert context == ExtractionJob(identity=owner, conversation_id=conversation, run_id=run_id)
        # Enqueued again for the same turn (a take-over finishing it, say): the same job, not a second.
        turn = SimpleNamespace(conversation_id=conversation, run_id=run_id)
        await memory.after_chat_turn(turn, messages, SimpleNamespace(identity=owner))
        await asyncio.sleep(0.5)
        assert len(calls) == 1
        assert jobs(jobs_database, run_id) == [(job_id, "SUCCESS")]
        # The job's input holds what extraction needs: no token claims.
        [workflow] = await DBOS.list_workflows_async(workflow_ids=[job_id], load_input=True)
        assert workflow.input is not None
        [job_input] = workflow.input["args"]
        assert sorted(job_input) == [
            "attempts", "conversation_id", "first_delay", "memory",
            "messages", "run_id", "tenant_id", "user_id",
        ]  # fmt: skip
        assert "authenticated" not in json.dumps(job_input)
        # Deleting the conversation deletes its turns' jobs (their input holds its messages), not the
        # memories they stored.
        await store.delete_conversation(owner, conversation)
        assert jobs(jobs_database, run_id) == []
        assert facts(jobs_database, user) == [("Prefers green tea.", "extract", TENANT)]
    finally:
        memory.stop()


async def test_an_extraction_that_keeps_failing_ends_in_error_logged_and_listed(
    jobs_database: MigratedDatabase,
    store: PostgresStore,
    engine: DurableEngine,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    attempts: list[float] = []

    async def extract(messages: list[dict[str, Any]], context: Any) -> list[str]:
        attempts.append(asyncio.get_running_loop().time())
        raise RuntimeError("the extraction model is down")

    memory = memory_of(store, extract, extract_attempts=3, extract_retry_delay=0.1)
    await memory.start(engine, context=lambda job: job)
    project, user, conversation = Project(), str(uuid.uuid4()), str(uuid.uuid4())
    try:
        with caplog.at_level(logging.WARNING, logger="bastion.memory"):
            async with serve(
                store, ScriptedModel(["Noted."]), engine, project, after_turn=memory.after_chat_turn
            ) as url:
                await chat(url, project, user, conversation, "I like tea")
                run_id = latest_run(jobs_database, conversation)
                await until(lambda: status_of(jobs_database, run_id) == "ERROR", timeout=20)
    finally:
        memory.stop()
    # Three attempts, with growing pauses (0.1 s, then 0.2 s) between them.
    assert len(attempts) == 3
    assert attempts[1] - attempts[0] >= 0.1
    assert attempts[2] - attempts[1] >= 0.2
    assert facts(jobs_database, user) == []
    job_id = extraction_job_id("default", run_id)
    failed = {item.workflow_id: item for item in await failed_extractions(store.pool)}
    assert failed[job_id].run_id == run_id
    assert failed[job_id].memory == "default"
    assert failed[job_id].status == "ERROR"
    gave_up = [r for r in caplog.records if r.levelno == logging.ERROR and job_id in r.getMessage()]
    assert len(gave_up) == 1
    assert "failed 3 times (last: RuntimeError)" in gave_up[0].getMessage()
    # `bastion memory failures` prints it for an operator.
    printed = await asyncio.to_thread(failures_printed, jobs_database, tmp_path, capsys)
    assert f"ERROR  memory=default  run={run_id}" in printed
    # Kept until retention prunes it with the finished turns (its input holds the turn's messages).
    retention = Retention(
        store,
        conninfo=jobs_database.app_dsn,
        hooks=False,
        policy=RetentionPolicy(finished_turns=timedelta(hours=1)),
    )
    assert (await retention.run_once()).extraction_jobs == 0
    assert jobs(jobs_database, run_id) == [(job_id, "ERROR")]
    retention = Retention(
        store,
        conninfo=jobs_database.app_dsn,
        hooks=False,
        policy=RetentionPolicy(finished_turns=timedelta(0)),
    )
    assert (await retention.run_once()).extraction_jobs >= 1
    assert jobs(jobs_database, run_id) == []


async def test_without_a_started_memory_a_turns_extraction_runs_in_process(
    jobs_database: MigratedDatabase, store: PostgresStore, engine: DurableEngine
) -> None:
    memory = memory_of(store, lambda messages, context: ["Lives in Lyon."])
    project, user, conversation = Project(), str(uuid.uuid4()), str(uuid.uuid4())
    async with serve(
        store, ScriptedModel(["Noted."]), engine, project, after_turn=memory.after_chat_turn
    ) as url:
        await chat(url, project, user, conversation, "I live in Lyon")
    await memory.drain()
    assert facts(jobs_database, user) == [("Lives in Lyon.", "extract", TENANT)]
    assert jobs(jobs_database, latest_run(jobs_database, conversation)) == []


async def test_an_extraction_job_whose_worker_is_killed_completes_once_after_a_restart(
    jobs_database: MigratedDatabase,
) -> None:
    async with cluster_of(jobs_database) as cluster:
        worker = await cluster.start("extractor", extra_env=MEMORY)
        user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
        posted = await post_turn(cluster, worker, user, conversation, [user_message(f"fact {conversation}")])
        status, chunks = await posted
        assert status == 200 and chunks[-1]["type"] == "finish"
        await until(lambda: cluster.count(conversation, "extract:start") > 0, timeout=20)
        await cluster.kill(worker)
        run_id = latest_run(jobs_database, conversation)
        assert status_of(jobs_database, run_id) == "PENDING"
        assert cluster.count(conversation, "extract:done") == 0
        # Restarted, it registers its memory a second after its engine launched: the recovered job,
        # which DBOS may hand it at once, waits for it.
        await cluster.start("extractor", extra_env=MEMORY, start_delay=1.0)
        await until(lambda: status_of(jobs_database, run_id) == "SUCCESS", timeout=40)
        assert cluster.count(conversation, "extract:start") == 2
        assert cluster.count(conversation, "extract:done") == 1
        assert facts(jobs_database, user) == [(f"The code word is {conversation}.", "extract", TENANT)]
        assert jobs(jobs_database, run_id) == [(extraction_job_id("default", run_id), "SUCCESS")]


async def test_a_turn_saved_by_a_worker_that_died_before_queuing_its_extraction_is_extracted_once(
    jobs_database: MigratedDatabase,
) -> None:
    """The worker dies just after the turn's save, before `after_turn`: the worker that recovers the
    turn's workflow finds it saved and queues its extraction."""
    async with cluster_of(jobs_database) as cluster:
        dying, _ = await asyncio.gather(
            cluster.start("saver", die="after-save", extra_env=MEMORY),
            cluster.start("survivor", extra_env=MEMORY),
        )
        user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
        posted = await post_turn(cluster, dying, user, conversation, [user_message(f"turn {conversation}")])
        status, _ = await posted
        assert status in (200, -1)
        await dying.process.wait()
        run_id = latest_run(jobs_database, conversation)
        saved = cluster.run(conversation)
        assert saved is not None and saved[:2] == (run_id, "completed")
        await until(lambda: status_of(jobs_database, run_id) == "SUCCESS", timeout=40)
        assert cluster.count(conversation, "extract:done") == 1
        assert facts(jobs_database, user) == [(f"The code word is {conversation}.", "extract", TENANT)]
