"""A worker told to stop (SIGTERM) takes no queued job while it drains: a job enqueued after the signal
waits for another worker, and the one the draining worker's own turn enqueues as it ends is run there
too, while that turn still finishes where it runs. The assistant's drain stops its engine's queues and
its hook dispatcher even with durable turns off.

Real worker processes (`tests.durable_chat_worker` with memory's extraction as a durable job, the
queued job these tests enqueue) on a database with bastion's, memory's and DBOS's migrations.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path

import psycopg
import pytest
from dbos import DBOS

from bastion.durable import DURABLE_APPLICATION_VERSION, migrate_durable
from bastion.memory import ExtractionJob, apply_memory_migrations
from bastion.memory.extraction_jobs import EXTRACTION_QUEUE, EXTRACTION_WORKFLOW, extraction_job_input
from bastion.stores import StoreIdentity, apply_migrations
from tests import durable_workflows
from tests.conftest import MigratedDatabase
from tests.durable_cluster import Cluster, cluster_of, post_turn, until, user_message
from tests.pg import PostgresCluster
from tests.test_assistant import serve_assistant
from tests.test_drain import until_drained
from tests.test_hooks_delivery import simple_turns

DELAY = 0.3  # seconds per streamed delta: a turn takes about 7 s, an extraction 6 s
MEMORY = {"BASTION_TEST_MEMORY": "1"}
TENANT = "tenant-a"  # the tenant in the test tokens' `app_metadata`
_ENQUEUE = """
select dbos.enqueue_workflow(
  %s, %s, array[%s::json], '{}'::json,
  workflow_id => %s, app_version => %s, application_name => 'bastion'
)
"""


@pytest.fixture(scope="module")
def drain_database(pg_cluster: PostgresCluster) -> MigratedDatabase:
    name = pg_cluster.database("drainjobs")
    dsn = pg_cluster.dsn(name)
    asyncio.run(apply_migrations(dsn))
    asyncio.run(apply_memory_migrations(dsn))
    pg_cluster.create_login_roles()
    asyncio.run(migrate_durable(dsn, app_role="bastion_app"))
    return MigratedDatabase(pg_cluster, name)


def enqueue_extraction(cluster: Cluster, user: str, conversation: str) -> str:
    """Enqueue a `fact <conversation>` extraction job, as a worker's turn would; its workflow id."""
    run_id = str(uuid.uuid4())
    job = extraction_job_input(
        "default",
        ExtractionJob(
            identity=StoreIdentity(user_id=user, tenant_id=TENANT),
            conversation_id=conversation,
            run_id=run_id,
        ),
        [user_message(f"fact {conversation}")],
        attempts=3,
        first_delay=0.05,
    )
    workflow_id = f"bastion.memory.extract:default:{run_id}"
    with psycopg.connect(cluster.database.app_dsn, autocommit=True) as conn:
        conn.execute(
            _ENQUEUE,
            (
                EXTRACTION_WORKFLOW,
                EXTRACTION_QUEUE,
                json.dumps(job),
                workflow_id,
                DURABLE_APPLICATION_VERSION,
            ),
        )
    return workflow_id


def job_status(cluster: Cluster, workflow_id: str) -> tuple[str, str | None] | None:
    with cluster.admin() as conn:
        row = conn.execute(
            "select status, executor_id from dbos.workflow_status where workflow_uuid = %s", (workflow_id,)
        ).fetchone()
    return (row[0], row[1]) if row else None


async def test_a_draining_worker_leaves_queued_jobs_to_another_worker(
    drain_database: MigratedDatabase,
) -> None:
    async with cluster_of(drain_database, delay=DELAY) as cluster:
        stopping = await cluster.start("stopping", extra_env={**MEMORY, "BASTION_TEST_DRAIN_SECONDS": "45"})
        user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
        posted = await post_turn(
            cluster, stopping, user, conversation, [user_message(f"turn {conversation}")]
        )
        await until(lambda: cluster.count(conversation, "model:turn:0") > 0)
        stopping.process.send_signal(signal.SIGTERM)
        await until_drained(stopping)

        # Enqueued after the signal, while the draining worker is the only one: twenty polls of its
        # queue later, nobody took it.
        fact = str(uuid.uuid4())
        job = enqueue_extraction(cluster, user, fact)
        await asyncio.sleep(2.0)
        assert stopping.alive, "the draining worker left before the check"
        assert (job_status(cluster, job) or ("gone",))[0] == "ENQUEUED"
        assert cluster.effects(fact) == []

        # Another worker runs it, once.
        staying = await cluster.start("staying", extra_env=MEMORY)
        await until(lambda: (job_status(cluster, job) or ("",))[0] == "SUCCESS", timeout=30)
        assert cluster.effects(fact) == [
            ("extract:start", staying.executor),
            ("extract:done", staying.executor),
        ]

        # The draining worker's turn ended where it ran; the extraction its end enqueued ran on the other.
        status, chunks = await posted
        assert status == 200 and chunks[-1]["type"] == "finish"
        await asyncio.wait_for(stopping.process.wait(), 30)
        assert stopping.process.returncode == 0
        await until(lambda: cluster.count(conversation, "extract:done") == 1, timeout=30)
        turn_effects = cluster.effects(conversation)
        assert {executor for kind, executor in turn_effects if kind.startswith(("model:", "tool:"))} == {
            stopping.executor
        }
        assert [item for item in turn_effects if item[0].startswith("extract:")] == [
            ("extract:start", staying.executor),
            ("extract:done", staying.executor),
        ]


def hooks_behind(database_url: str) -> bool:
    """Whether some hook's position has not passed every event of the outbox."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "select count(*) from bastion.hook_subscriptions s join bastion.hook_events e"
            " on (e.tx, e.id) > (s.position_tx, s.position_id)"
        ).fetchone()
    return bool(row and row[0])


async def test_the_assistant_draining_without_durable_turns_takes_no_job_and_starts_no_hook_batch(
    pg_cluster: PostgresCluster, tmp_path: Path
) -> None:
    """`bastion serve`'s wiring: its engine and hook delivery stop with the drain, not only when its chat
    turns are durable (here they are not, so the chat endpoint has no engine to stop)."""
    async with serve_assistant(pg_cluster, tmp_path) as served:
        assert served.config.hooks and not served.config.durable
        queue = f"drain-{uuid.uuid4().hex[:8]}"
        await DBOS.register_queue_async(queue, polling_interval_sec=0.1)
        before = await DBOS.enqueue_workflow_async(queue, durable_workflows.which_loop)
        await asyncio.wait_for(before.get_result(), 30)
        await simple_turns(served.app.store, 1)
        await until(lambda: not hooks_behind(served.config.database_url), 20)

        served.app.drain.start()  # what SIGTERM does
        after = await DBOS.enqueue_workflow_async(queue, durable_workflows.which_loop)
        await simple_turns(served.app.store, 1)
        await asyncio.sleep(1.5)  # fifteen polls of the queue, and of the outbox
        assert (await after.get_status()).status == "ENQUEUED"
        assert hooks_behind(served.config.database_url)
