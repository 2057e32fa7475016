"""A durable worker restarted on the same database: the turn its predecessor left is finished once, even
when DBOS hands it over before the new process has built its chat routes.

The workers are `tests.durable_chat_worker` processes (see `tests.durable_cluster`); only one runs at a
time here, so the turn can only be taken over by the restarted one.
"""

from __future__ import annotations

import uuid

from tests.conftest import MigratedDatabase
from tests.durable_cluster import cluster_of, post_turn, user_message
from tests.test_durable_turns import KILL_POINTS, check_turn, kill_at, next_turn, taken_over


async def test_a_turn_recovered_before_the_restarted_worker_built_its_routes_waits_and_finishes_once(
    migrated_database: MigratedDatabase,
) -> None:
    async with cluster_of(migrated_database) as cluster:
        dying = await cluster.start("dying")
        user, conversation = str(uuid.uuid4()), str(uuid.uuid4())
        posted = await post_turn(cluster, dying, user, conversation, [user_message(f"turn {conversation}")])
        killed_at = await kill_at(cluster, dying, conversation, *KILL_POINTS["stream"])
        await posted
        # DBOS hands the dead worker's turn to the new process as soon as it launches; its routes
        # come two seconds later.
        restarted = await cluster.start("restarted", start_delay=2.0)
        await taken_over(cluster, conversation, dying, killed_at)
        await check_turn(cluster, conversation, None, tool_ran=True)
        # The request the kill cut short is asked once more; the rest once; the tool ran once.
        assert (cluster.count(conversation, "model:turn:0"), cluster.count(conversation, "model:turn:1")) == (
            2,
            1,
        )
        assert cluster.count(conversation, "tool:done") == 1
        await next_turn(cluster, restarted, user, conversation)
