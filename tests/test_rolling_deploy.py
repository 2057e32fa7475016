"""A rolling deploy: workers of the previous release and of this one serve one database at once.

The database is migrated by the previous release, then by this one (expand: what a deploy does
first), and workers of both releases run beside each other as real processes (`tests.durable_cluster`;
the previous release's own `tests.durable_chat_worker`, from its tree). A turn, an approval and its
continuation, and a take-over after SIGKILL in both directions go through, none lost and no side
effect run twice. And no migration of this release drops or changes a function the previous release's
migrations made, unless it is listed as contracted.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio

from bastion import assemble_ui_messages
from bastion.assistant.database import Database, migrate
from bastion.durable import migrate_durable
from tests.conftest import MigratedDatabase
from tests.durable_cluster import Cluster, cluster_of, post_turn, resumed_stream, until, user_message
from tests.pg import PostgresCluster
from tests.previous_release import (
    PREVIOUS_RELEASE,
    PreviousReleaseUnavailable,
    migrator,
    previous_release_tree,
)
from tests.test_durable_turns import check_turn, kill_at, next_turn, settled, taken_over, tool_part

# Functions (as `regprocedure` text) and columns (`schema.table.column`) of the previous release that
# this release's contract migrations drop on purpose: each was kept by the previous release only for the
# release before it.
CONTRACTED: frozenset[str] = frozenset()

# Outside Postgres's own schemas and DBOS's: every function, its result and which of the roles the
# application and its users act as may execute it; every column of a table or view, and its type.
SCHEMA = """
select 'function ' || p.oid::regprocedure::text, pg_get_function_result(p.oid),
       array(select r from unnest(array['anon', 'authenticated', 'bastion_runtime', 'service_role']) r
              where has_function_privilege(r, p.oid, 'execute'))
  from pg_proc p join pg_namespace n on n.oid = p.pronamespace
 where n.nspname not in ('pg_catalog', 'information_schema', 'dbos') and n.nspname not like 'pg\\_%'
union all
select 'column ' || c.table_schema || '.' || c.table_name || '.' || c.column_name, c.data_type, '{}'
  from information_schema.columns c
 where c.table_schema not in ('pg_catalog', 'information_schema', 'dbos')
"""

# What a worker of a release may use: each object's type (or result) and the roles that may execute it.
Schema = dict[str, tuple[str, frozenset[str]]]


@dataclass(frozen=True)
class Deployed:
    """A database the previous release migrated and then this one, and the previous release's tree."""

    database: MigratedDatabase
    previous: Path
    schema_before: Schema
    # What the previous release's migrations applied once this release's had: a worker of the previous
    # release started during the deploy migrates as it starts (`bastion serve` does).
    applied_again: list[str]


def schema(dsn: str) -> Schema:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {name: (kind, frozenset(roles)) for name, kind, roles in conn.execute(SCHEMA)}


@pytest.fixture(scope="module")
def deployed(pg_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    try:
        previous = previous_release_tree(tmp_path_factory.getbasetemp() / "previous-release")
    except PreviousReleaseUnavailable as reason:
        pytest.skip(f"The rolling-deploy tests need the previous release from git: {reason}.")
    name = pg_cluster.database("rolling")
    dsn = pg_cluster.dsn(name)
    with migrator(previous, dsn) as migrate_previous:
        assert "bastion:0010" in migrate_previous()
        before = schema(dsn)
        # This release's migrations on top, as its deploy's first step does.
        assert asyncio.run(migrate(Database(app_conninfo=dsn, admin_conninfo=dsn), grant_app_role=False))
        applied_again = migrate_previous()
    pg_cluster.create_login_roles()
    asyncio.run(migrate_durable(dsn, app_role="bastion_app"))
    return Deployed(MigratedDatabase(pg_cluster, name), previous, before, applied_again)


def test_no_migration_drops_or_changes_what_the_previous_release_uses(deployed: Deployed) -> None:
    after = schema(deployed.database.admin_dsn)
    gone = sorted(
        name
        for name, (kind, roles) in deployed.schema_before.items()
        if name.split(" ", 1)[1] not in CONTRACTED
        and (name not in after or after[name][0] != kind or not roles <= after[name][1])
    )
    assert not gone, (
        f"Functions or columns of the previous release ({PREVIOUS_RELEASE[:12]}) are gone or changed "
        f"(signature, result, type or who may execute them): {gone}. Its workers still use them during a "
        "rolling deploy: keep them (a new name or an overload for the new behaviour) and drop them one "
        "release later (list them in CONTRACTED then). See docs/rolling-deploys.md."
    )
    assert deployed.applied_again == []  # and it refuses nothing newer


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(deployed: Deployed) -> AsyncIterator[Cluster]:
    async with cluster_of(deployed.database, delay=0.08) as cluster:
        cluster.releases["old"] = deployed.previous
        await asyncio.gather(cluster.worker("old"), cluster.worker("new"))
        yield cluster


@pytest.mark.asyncio(loop_scope="module")
async def test_a_turn_of_a_previous_release_worker_streams_to_a_reader_on_this_release(
    cluster: Cluster,
) -> None:
    old, new = await cluster.worker("old"), await cluster.worker("new")
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    posted = await post_turn(cluster, old, user, conversation, [user_message(f"turn {conversation}")])
    await until(lambda: cluster.count(conversation, "model:turn:0"))
    resumed = await resumed_stream(cluster, new, user, conversation)  # a reload served by the new release
    assert resumed is not None  # read while the turn ran
    status, chunks = await posted
    assert status == 200 and chunks[-1]["type"] == "finish"
    reply = await check_turn(cluster, conversation, resumed, tool_ran=True)
    assert {executor for _, executor in cluster.effects(conversation)} == {old.executor}
    assert assemble_ui_messages(chunks, cluster.messages(conversation)[:1])[-1] == reply
    await next_turn(cluster, new, user, conversation)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_turn_of_this_release_streams_to_a_reader_on_the_previous_release(cluster: Cluster) -> None:
    """Step by step rather than chunk by chunk: the previous release's reader does not ask the running
    worker to write its log live (`follow_run`), so it reads each finished model request."""
    old, new = await cluster.worker("old"), await cluster.worker("new")
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    posted = await post_turn(cluster, new, user, conversation, [user_message(f"turn {conversation}")])
    await until(lambda: cluster.count(conversation, "model:turn:0"))
    resumed = await resumed_stream(cluster, old, user, conversation)
    assert resumed is not None  # read while the turn ran
    status, chunks = await posted
    assert status == 200 and chunks[-1]["type"] == "finish"
    reply = await check_turn(cluster, conversation, resumed, tool_ran=True)
    assert assemble_ui_messages(chunks, cluster.messages(conversation)[:1])[-1] == reply


@pytest.mark.asyncio(loop_scope="module")
async def test_a_turn_of_a_previous_release_worker_killed_midstream_is_finished_by_this_release(
    cluster: Cluster,
) -> None:
    old, new = await cluster.worker("old"), await cluster.worker("new")
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    posted = await post_turn(cluster, old, user, conversation, [user_message(f"turn {conversation}")])
    # Killed in the request after the tool: the tool's call, completed by the previous release, is
    # replayed from its claim by this one, never run again.
    killed_at = await kill_at(cluster, old, conversation, "model:turn:1", 5)
    cluster.restart_soon("old")
    resuming = asyncio.ensure_future(resumed_stream(cluster, new, user, conversation))
    seconds = await taken_over(cluster, conversation, old, killed_at)
    print(f"previous release killed, this release took over after {seconds:.2f} s")
    status, chunks = await posted
    assert status == -1 and chunks  # the previous release's worker streamed the turn until it died
    await check_turn(cluster, conversation, await resuming, tool_ran=True)
    assert cluster.count(conversation, "tool:done") == 1
    # The releases store finished model requests apart (the previous one in DBOS steps, this one in
    # `run_steps`), so across releases a take-over asks the model again for the whole turn.
    asked = (cluster.count(conversation, "model:turn:0"), cluster.count(conversation, "model:turn:1"))
    assert asked == (2, 2)
    await next_turn(cluster, new, user, conversation)
    await next_turn(cluster, await cluster.worker("old"), user, conversation)


@pytest.mark.asyncio(loop_scope="module")
async def test_an_approval_asked_by_the_previous_release_is_continued_by_this_one_and_taken_back(
    cluster: Cluster,
) -> None:
    """The previous release asks for an approval; this release runs the approved continuation and is
    killed in it; the previous release takes the continuation over and finishes it."""
    old, new = await cluster.worker("old"), await cluster.worker("new")
    user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
    status, chunks = await (
        await post_turn(cluster, old, user, conversation, [user_message(f"approve {conversation}")])
    )
    assert status == 200 and "tool-approval-request" in [c["type"] for c in chunks]
    assert await settled(cluster, conversation) == "waiting_for_approval"
    answered = cluster.messages(conversation)
    pending = tool_part(answered[1])
    assert pending["state"] == "approval-requested"
    pending["state"] = "approval-responded"
    pending["approval"]["approved"] = True
    posted = await post_turn(cluster, new, user, conversation, answered)
    killed_at = await kill_at(cluster, new, conversation, "model:approve:1", 4)
    resuming = asyncio.ensure_future(resumed_stream(cluster, old, user, conversation))
    seconds = await taken_over(cluster, conversation, new, killed_at)
    print(f"this release killed, the previous release took over after {seconds:.2f} s")
    await posted
    reply = await check_turn(
        cluster, conversation, await resuming, tool_ran=True, kind="approve", history=answered
    )
    assert reply["id"] == answered[1]["id"]
    assert cluster.count(conversation, "approved:done") == 1
    executors = {executor for kind, executor in cluster.effects(conversation) if kind == "model:approve:1"}
    assert executors == {old.executor, new.executor}  # each release asked for the continuation
    await until(lambda: (run := cluster.run(conversation)) and run[1] == "completed")
    await next_turn(cluster, old, user, conversation)
