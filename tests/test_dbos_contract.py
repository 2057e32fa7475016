"""The parts of DBOS bastion relies on, pinned so that an upgrade changing them fails here, by name.

bastion pins DBOS to a minor release (`dbos>=3.4.0,<3.5`): it calls one internal function
(`DBOS._recover_pending_workflows`), reads one internal flag (`_launched` on the global instance),
sets the stop event of DBOS's queue thread to stop dequeuing while the rest runs (`stop_dequeuing`),
reads DBOS's system tables in its own SQL and calls DBOS's enqueue function from SQL. Upgrade DBOS on
purpose: raise the pin, run this file, and where a test fails, change the code it names.

Each call bastion makes is checked by binding the same arguments to DBOS's signature (a renamed or
removed keyword fails with the call's name); the tables, statuses and SQL function are checked against
a schema DBOS itself migrated; one round trip shows the client finds, by the filters bastion passes, a
workflow that finished, and deletes it.

The recovery call's behaviour (a dead executor's PENDING workflow handed back and finished by a live
process) is proven end to end, with a SIGKILLed worker, by
`tests/test_durable_engine.py::test_a_dead_workers_workflow_is_finished_by_a_live_one_from_its_last_completed_step`;
the queue limits bastion registers (`partition_concurrency`, `polling_interval_sec`) are read back from
DBOS's queue by `test_queues_are_polled_quickly_by_default` there, and a dequeued workflow running on the
launching loop by `test_a_dequeued_workflow_runs_on_the_loop_that_launched_the_engine`.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from dbos import DBOS, DBOSClient, SetEnqueueOptions, SetWorkflowID
from dbos._dbos import _get_dbos_instance
from dbos._dbos_config import DBOSConfig
from dbos._sys_db import WorkflowStatusString
from dbos._utils import INTERNAL_QUEUE_NAME

from bastion.durable import DURABLE_APPLICATION_VERSION, DURABLE_SCHEMA, DurableEngine, system_database_url
from bastion.durable.engine import stop_dequeuing
from bastion.durable.turn_workflow import WORKFLOW_NAME, turn_workflow_id
from bastion.inbox import replies
from bastion.persistence import RunInput
from bastion.stores import PostgresStore, StoreIdentity, TurnContext
from bastion.stores.turn_workflows import TurnWorkflowRow
from tests import durable_workflows
from tests.conftest import MigratedDatabase

# Each call as bastion makes it (the module that makes it, then its arguments).
_CALLS: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {
    # durable/engine.py: the janitor hands a dead executor's workflows back.
    "DBOS._recover_pending_workflows([executor])": (DBOS._recover_pending_workflows, (["dead"],), {}),
    "DBOS.migrate(url, schema=, application_role=)": (
        DBOS.migrate,
        ("postgresql+psycopg://db/app",),
        {"schema": "dbos", "application_role": "bastion_app"},
    ),
    "DBOS(config=)": (DBOS, (), {"config": {}}),
    "DBOS.launch()": (DBOS.launch, (), {}),
    "DBOS.destroy()": (DBOS.destroy, (), {}),
    "DBOS.register_queue_async(name, partition_concurrency=, polling_interval_sec=)": (
        DBOS.register_queue_async,
        ("bastion.hooks:h",),
        {"partition_concurrency": 1, "polling_interval_sec": 0.1},
    ),
    # hooks/delivery.py: a delivery workflow; chat/durable_turns.py: the turn workflows' retention.
    "DBOS.start_workflow_async(workflow, input)": (DBOS.start_workflow_async, (lambda _: None, {}), {}),
    "DBOS.list_workflows_async(name=, status=, completed_before=, load_input=, load_output=)": (
        DBOS.list_workflows_async,
        (),
        {
            "name": "bastion.turn",
            "status": ["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"],
            "completed_before": "2026-01-01T00:00:00+00:00",
            "load_input": False,
            "load_output": False,
        },
    ),
    "DBOS.delete_workflows_async(ids)": (DBOS.delete_workflows_async, (["id"],), {}),
    "SetWorkflowID(id)": (SetWorkflowID, ("id",), {}),
    # hooks/_batches.py and inbox/replies.py: workflows, steps, lanes and pauses.
    "DBOS.workflow(name=)": (DBOS.workflow, (), {"name": "bastion.hooks.batch"}),
    "DBOS.step(name=, retries_allowed=, max_attempts=)": (
        DBOS.step,
        (),
        {"name": "bastion.inbox.reply.load", "retries_allowed": True, "max_attempts": 3},
    ),
    "DBOS.enqueue_workflow_async(queue, workflow, *args)": (
        DBOS.enqueue_workflow_async,
        ("bastion.hooks:h", lambda *_: None, "h", "conversation", [1], 0, 0),
        {},
    ),
    "SetEnqueueOptions(queue_partition_key=)": (
        SetEnqueueOptions,
        (),
        {"queue_partition_key": "conversation"},
    ),
    "DBOS.sleep_async(seconds)": (DBOS.sleep_async, (0.5,), {}),
    # hooks/retention.py: the client that prunes, cancels and forgets deliveries.
    "DBOSClient(system_database_url=, dbos_system_schema=)": (
        DBOSClient,
        (),
        {"system_database_url": "postgresql+psycopg://db/app", "dbos_system_schema": "dbos"},
    ),
    "DBOSClient.list_workflows_async(workflow_id_prefix=, status=, completed_before=, ...)": (
        DBOSClient.list_workflows_async,
        (None,),
        {
            "workflow_id_prefix": ["bastion.hook:a:", "bastion.hook:b:"],
            "status": ["SUCCESS", "ERROR", "CANCELLED"],
            "completed_before": "2026-01-01T00:00:00+00:00",
            "load_input": False,
            "load_output": False,
        },
    ),
    "DBOSClient.delete_workflows_async(ids)": (DBOSClient.delete_workflows_async, (None, ["id"]), {}),
    "DBOSClient.cancel_workflows_async(ids)": (DBOSClient.cancel_workflows_async, (None, ["id"]), {}),
    "DBOSClient.destroy()": (DBOSClient.destroy, (None,), {}),
    # retention.py: the cluster-wide schedule and its workflow's shape, (scheduled time, context).
    "DBOS.apply_schedules_async([schedule])": (
        DBOS.apply_schedules_async,
        ([{"schedule_name": "bastion.retention", "workflow_fn": None, "schedule": "0 */10 * * * *"}],),
        {},
    ),
    "DBOS.list_schedules_async(schedule_name_prefix=)": (
        DBOS.list_schedules_async,
        (),
        {"schedule_name_prefix": "bastion.retention"},
    ),
    "DBOS.delete_schedule_async(name)": (DBOS.delete_schedule_async, ("bastion.retention",), {}),
}

# The keys of the `DBOSConfig` the engine launches with (`_launch_dbos`).
_CONFIG_KEYS = {
    "name",
    "system_database_url",
    "dbos_system_schema",
    "run_migrations",
    "application_version",
    "executor_id",
    "sys_db_pool_size",
    "log_level",
}

# Every status DBOS gives a workflow. bastion's SQL and filters sort them into unfinished (ENQUEUED,
# PENDING) and ended (the rest but DELAYED, which only `delay_seconds`, unused by bastion, produces):
# a status added or gone needs a look at `hooks/delivery_status.py`, `hooks/retention.py`,
# `hooks/delivery.py` (`_IN_FLIGHT`) and `chat/durable_turns.py` (`prune_finished_turns`).
_STATUSES = {
    "ENQUEUED",
    "PENDING",
    "SUCCESS",
    "ERROR",
    "CANCELLED",
    "MAX_RECOVERY_ATTEMPTS_EXCEEDED",
    "DELAYED",
}

# The columns of `dbos.workflow_status` bastion's SQL reads, with their types.
_WORKFLOW_STATUS_COLUMNS = {
    # hooks: the hook and first event are parsed out of the workflow id; stores migration 0019: a dead
    # process's run stays live while its turn workflow (`bastion.turn:{conversation}:{run}`) is PENDING
    # or ENQUEUED (handed back for recovery).
    "workflow_uuid": "text",
    "status": "text",
    "name": "text",  # hooks/delivery.py: a hook's batch in flight
    "updated_at": "bigint",  # epoch milliseconds: hooks/delivery_status.py divides by 1000
    "executor_id": "text",  # durable/engine.py: the executors that left PENDING work
    "application_name": "text",
    "application_version": "text",
    # stores migration 0020: a turn's row moves from its queue onto its executor, and its end.
    "queue_name": "text",
    "recovery_attempts": "bigint",
    "owner_xid": "text",
    "completed_at": "bigint",
}

# The parameters of `dbos.enqueue_workflow` that inbox/replies.py passes, by position then by name.
_ENQUEUE_POSITIONAL = [
    ("workflow_name", "text"),
    ("queue_name", "text"),
    ("positional_args", "json[]"),
    ("named_args", "json"),
]
_ENQUEUE_NAMED = [("workflow_id", "text"), ("app_version", "text"), ("queue_partition_key", "text")]
_ENQUEUE_NAMED += [("application_name", "text")]


def test_a_schedule_entry_takes_the_keys_retention_passes() -> None:
    """(DBOS names each firing `sched-<schedule>-<time>`, so a period runs once however many processes
    serve: tests/test_retention.py finds retention's runs by that prefix.)"""
    from dbos._dbos import ScheduleInput

    assert {"schedule_name", "workflow_fn", "schedule"} <= set(ScheduleInput.__annotations__)


@pytest.mark.parametrize("call", list(_CALLS))
def test_each_dbos_call_bastion_makes_still_binds_to_its_signature(call: str) -> None:
    function, args, kwargs = _CALLS[call]
    signature = inspect.signature(function)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        pytest.fail(f"DBOS changed `{call}`: it is now {function.__qualname__}{signature} ({error}).")


def test_the_recovery_call_takes_a_list_of_executor_ids() -> None:
    """The janitor passes `[executor]` positionally; a rename or a single id would break it silently."""
    parameters = list(inspect.signature(DBOS._recover_pending_workflows).parameters.values())
    assert [p.name for p in parameters] == ["executor_ids"], (
        f"DBOS._recover_pending_workflows now takes {[p.name for p in parameters]}, not (executor_ids)."
    )
    assert "List[str]" in str(parameters[0].annotation), (
        f"DBOS._recover_pending_workflows's executor_ids is now {parameters[0].annotation}, not List[str]."
    )


def test_the_engine_sets_only_config_keys_dbos_knows() -> None:
    missing = _CONFIG_KEYS - set(DBOSConfig.__annotations__)
    assert not missing, f"DBOSConfig no longer has {sorted(missing)}, which durable/engine.py sets."


def test_dbos_gives_workflows_the_statuses_bastion_sorts() -> None:
    statuses = {status.value for status in WorkflowStatusString}
    assert statuses == _STATUSES, (
        f"DBOS's workflow statuses changed: added {sorted(statuses - _STATUSES)},"
        f" removed {sorted(_STATUSES - statuses)}; see _STATUSES here for the code that filters on them."
    )


async def test_the_engine_reads_its_launch_from_the_global_instance(durable_engine: DurableEngine) -> None:
    """durable/engine.py refuses a second launch by reading `_get_dbos_instance()._launched`."""
    instance = _get_dbos_instance()
    assert hasattr(instance, "_launched"), "DBOS's instance no longer has `_launched`."
    assert instance._launched is True, "`_get_dbos_instance()._launched` is not True while launched."


def test_the_system_tables_have_the_columns_bastion_reads(migrated_database: MigratedDatabase) -> None:
    with psycopg.connect(migrated_database.admin_dsn) as conn:
        rows = conn.execute(
            "select column_name, data_type from information_schema.columns"
            " where table_schema = %s and table_name = 'workflow_status'",
            (DURABLE_SCHEMA,),
        ).fetchall()
    columns = dict(rows)
    for column, kind in _WORKFLOW_STATUS_COLUMNS.items():
        assert columns.get(column) == kind, (
            f"{DURABLE_SCHEMA}.workflow_status.{column} is {columns.get(column) or 'gone'}, not {kind}."
        )


def test_the_enqueue_function_takes_the_arguments_the_inbox_passes(
    migrated_database: MigratedDatabase,
) -> None:
    with psycopg.connect(migrated_database.admin_dsn) as conn:
        overloads = conn.execute(
            "select array(select (n, format_type(t, null))::text"
            "   from unnest(p.proargnames, p.proargtypes::oid[]) as a(n, t))"
            "  from pg_proc p join pg_namespace s on s.oid = p.pronamespace"
            " where s.nspname = %s and p.proname = 'enqueue_workflow'",
            (DURABLE_SCHEMA,),
        ).fetchall()
    assert len(overloads) == 1, f"{DURABLE_SCHEMA}.enqueue_workflow has {len(overloads)} overloads, not one."
    parameters = [tuple(text.strip("()").split(",", 1)) for text in overloads[0][0]]
    assert parameters[: len(_ENQUEUE_POSITIONAL)] == _ENQUEUE_POSITIONAL, (
        f"{DURABLE_SCHEMA}.enqueue_workflow now starts with {parameters[: len(_ENQUEUE_POSITIONAL)]}."
    )
    for parameter in _ENQUEUE_NAMED:
        assert parameter in parameters, f"{DURABLE_SCHEMA}.enqueue_workflow no longer takes {parameter}."


def test_the_inbox_enqueue_sql_leaves_an_enqueued_workflow_in_its_partition(
    migrated_database: MigratedDatabase,
) -> None:
    """`replies._ENQUEUE`, run as the application's role and rolled back, so no process ever runs it."""
    workflow_id = f"contract:{uuid.uuid4()}"
    with psycopg.connect(migrated_database.app_dsn) as conn:
        arguments = ['"tenant"', '"contact"', '"conversation"', '"message"']
        conn.execute(
            replies._ENQUEUE,
            (
                replies.REPLY_WORKFLOW,
                "contract.unpolled",
                *arguments,
                workflow_id,
                DURABLE_APPLICATION_VERSION,
                "conversation",
                "bastion",
            ),
        )
        row = conn.execute(
            "select status, name, queue_name, queue_partition_key, application_version, application_name"
            " from dbos.workflow_status where workflow_uuid = %s",
            (workflow_id,),
        ).fetchone()
        conn.rollback()
    assert row == (
        "ENQUEUED",
        replies.REPLY_WORKFLOW,
        "contract.unpolled",
        "conversation",
        DURABLE_APPLICATION_VERSION,
        "bastion",
    ), f"dbos.enqueue_workflow stored {row}."


async def test_the_client_lists_a_finished_workflow_by_prefix_and_completion_time_then_deletes_it(
    durable_engine: DurableEngine, migrated_database: MigratedDatabase
) -> None:
    """The filters hooks/retention.py passes (a list of prefixes or one), on a workflow that finished;
    and the unit of its `updated_at`."""
    prefix = f"contract:{uuid.uuid4().hex}:"
    workflow_id = prefix + "1"
    with SetWorkflowID(workflow_id):
        handle = await DBOS.start_workflow_async(durable_workflows.which_loop)
    await handle.get_result()
    with psycopg.connect(migrated_database.admin_dsn) as conn:
        row = conn.execute(
            "select updated_at / 1000.0 - extract(epoch from now()) from dbos.workflow_status"
            " where workflow_uuid = %s",
            (workflow_id,),
        ).fetchone()
    assert row is not None and abs(float(row[0])) < 3600, (
        f"updated_at is no longer epoch milliseconds ({row})."
    )

    client = DBOSClient(
        system_database_url=system_database_url(migrated_database.app_dsn), dbos_system_schema=DURABLE_SCHEMA
    )
    try:

        async def finished(before: datetime) -> list[str]:
            found = await client.list_workflows_async(
                workflow_id_prefix=[prefix, f"contract:{uuid.uuid4().hex}:"],
                status=["SUCCESS", "ERROR", "CANCELLED"],
                completed_before=before.isoformat(),
                load_input=False,
                load_output=False,
            )
            return [workflow.workflow_id for workflow in found]

        assert await finished(datetime.now(UTC) + timedelta(hours=1)) == [workflow_id]
        assert await finished(datetime.now(UTC) - timedelta(hours=1)) == [], "completed_before is ignored."
        # `forget_deliveries` passes one prefix, not a list.
        every = await client.list_workflows_async(
            workflow_id_prefix=prefix, load_input=False, load_output=False
        )
        assert [workflow.workflow_id for workflow in every] == [workflow_id], "a single prefix finds nothing."
        await client.delete_workflows_async([workflow_id])
        assert await finished(datetime.now(UTC) + timedelta(hours=1)) == [], "delete_workflows kept it."
    finally:
        client.destroy()


async def test_stopping_the_queue_thread_stops_dequeuing_and_nothing_else(
    durable_engine: DurableEngine, migrated_database: MigratedDatabase
) -> None:
    """`stop_dequeuing` (a draining process) finds DBOS's queue thread by its target and sets the event
    it was started with: a job enqueued then stays ENQUEUED, and so does a dead executor's workflow
    the janitor hands back (DBOS recovers through its internal queue: a draining process takes over
    no dead worker's turn), while a workflow started directly still runs and the engine still closes.
    Its behaviour across processes: tests/test_drain_jobs.py."""
    name = f"contract-{uuid.uuid4().hex[:8]}"
    await durable_engine.register_queue(name)
    before = await DBOS.enqueue_workflow_async(name, durable_workflows.which_loop)
    assert await asyncio.wait_for(before.get_result(), 30) == id(asyncio.get_running_loop())

    assert stop_dequeuing(), (
        "DBOS's queue thread (target dbos._queue.queue_thread) is gone or takes no event."
    )
    after = await DBOS.enqueue_workflow_async(name, durable_workflows.which_loop)
    await asyncio.sleep(1.0)  # ten polls of the queue
    status = (await after.get_status()).status
    assert status == "ENQUEUED", f"a job enqueued after the stop is {status}."

    dead = f"dead-{uuid.uuid4().hex[:8]}"
    orphan = f"contract:{uuid.uuid4()}"
    with psycopg.connect(migrated_database.admin_dsn, autocommit=True) as conn:
        conn.execute(
            "select dbos.enqueue_workflow(%s, 'contract.unpolled', array[]::json[], '{}'::json,"
            " workflow_id => %s, app_version => %s, application_name => 'bastion')",
            ("tests.durable.which_loop", orphan, DURABLE_APPLICATION_VERSION),
        )
        conn.execute(
            # As a turn is: started directly (no queue), running on an executor that died.
            "update dbos.workflow_status set status = 'PENDING', executor_id = %s, queue_name = null"
            " where workflow_uuid = %s",
            (dead, orphan),
        )
    await asyncio.to_thread(DBOS._recover_pending_workflows, [dead])
    await asyncio.sleep(1.0)
    with psycopg.connect(migrated_database.admin_dsn) as conn:
        row = conn.execute(
            "select status, queue_name from dbos.workflow_status where workflow_uuid = %s", (orphan,)
        ).fetchone()
    assert row == ("ENQUEUED", INTERNAL_QUEUE_NAME), f"a recovered workflow after the stop is {row}."

    direct = await DBOS.start_workflow_async(durable_workflows.which_loop)
    assert await asyncio.wait_for(direct.get_result(), 30) == id(asyncio.get_running_loop())


async def test_stopping_the_queues_of_an_engine_closed_already_does_nothing(
    migrated_database: MigratedDatabase,
) -> None:
    """A drain that starts after the engine closed (or before one launched) neither raises nor
    stops anything: a failing drain callback would leave the server draining for ever."""
    async with await DurableEngine.launch(migrated_database.app_dsn, recovery_interval=0.2) as engine:
        pass
    assert stop_dequeuing() is False
    engine.stop_taking_work()


async def test_a_turn_workflow_row_the_store_writes_is_one_dbos_reads_recovers_and_lists_finished(
    durable_engine: DurableEngine, migrated_database: MigratedDatabase
) -> None:
    """Stores migration 0020 writes a turn's workflow row through `dbos.enqueue_workflow`, moves it onto
    the executor running the turn (PENDING, no queue) and ends it (SUCCESS, `completed_at`). DBOS must
    read that row as a `bastion.turn` of the executor with the input bastion wrote, find it among the
    executor's pending work and hand it back to its recovery queue when the executor is dead (where its
    end no longer touches it: the process that takes it over ends it), and list it as finished for
    retention once ended. Take-overs of these rows across killed processes: tests/test_durable_turns.py."""
    assert stop_dequeuing(), "DBOS's queue thread is gone"  # a recovered row stays on the queue
    who = StoreIdentity(user_id=str(uuid.uuid4()))
    workflow_input = {"endpoint": "contract", "messages": [{"id": "m", "parts": [{"text": "é\u0000"}]}]}
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=2) as store:
        persistence = store.persistence()

        async def begun(executor: str) -> tuple[TurnContext, Any, str]:
            conversation = (await store.create_conversation(who)).id
            context = TurnContext(identity=who, conversation_id=conversation, request_id=uuid.uuid4().hex)
            message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": "hi"}]}
            start = await persistence.start_run(
                context, RunInput(messages=[message], trigger="submit-message")
            )
            row = TurnWorkflowRow(
                executor_id=executor,
                application_version=DURABLE_APPLICATION_VERSION,
                application_name="bastion",
                input=workflow_input,
            )
            assert await persistence.turn_workflows.begin(context, start.state, row)
            return context, start.state, turn_workflow_id(conversation, start.state.run_id)

        dead = f"dead-{uuid.uuid4().hex[:8]}"
        handed_back, ending = await begun(dead), await begun(dead)
        recovered, ended = handed_back[2], ending[2]
        listed = await DBOS.list_workflows_async(workflow_ids=[recovered, ended], load_input=True)
        assert {(w.workflow_id, w.status, w.name, w.executor_id, w.app_version) for w in listed} == {
            (workflow_id, "PENDING", WORKFLOW_NAME, dead, DURABLE_APPLICATION_VERSION)
            for workflow_id in (recovered, ended)
        }, f"DBOS reads the store's turn rows as {listed}."
        assert [w.input for w in listed] == [{"args": (workflow_input,), "kwargs": {}}] * 2, (
            f"DBOS reads the turn's input as {listed[0].input}."
        )
        pending = _get_dbos_instance()._sys_db.get_pending_workflows(dead, DURABLE_APPLICATION_VERSION)
        assert {w.workflow_id for w in pending} == {recovered, ended}, "recovery does not find the rows."

        assert await persistence.turn_workflows.end(*ending[:2], dead)
        await asyncio.to_thread(DBOS._recover_pending_workflows, [dead])
        listed = await DBOS.list_workflows_async(workflow_ids=[recovered, ended])
        status = {w.workflow_id: w.status for w in listed}
        assert status == {recovered: "ENQUEUED", ended: "SUCCESS"}, f"after recovery: {status}."
        assert not await persistence.turn_workflows.end(*handed_back[:2], dead), "a recovered row was ended."

        finished = await DBOS.list_workflows_async(
            workflow_ids=[recovered, ended],
            name=WORKFLOW_NAME,
            status=["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"],
            completed_before=(datetime.now(UTC) + timedelta(minutes=1)).isoformat(),
            load_input=False,
            load_output=False,
        )
        assert [w.workflow_id for w in finished] == [ended], "retention does not find the ended row."
        # The handed-back row waits on the recovery queue: the next engine in this database must not run it.
        await DBOS.delete_workflows_async([recovered, ended])
