"""Retention: outbox events every hook has passed deleted after an age, with their delivery bookkeeping.

An event may go once every registered hook's position is past it, no unfinished delivery still carries
it, and it is older than the age asked for; its failure records go with it, and DBOS's records of the
deliveries that finished that long ago. The outbox remembers the highest event id it pruned, so a
replay from a pruned event fails with `HookEventPruned` (code `hook_event_pruned`). Pruning is safe
while delivery runs: positions only move forward except by a replay, which pruning locks out for the
one statement it takes.

A hook the application no longer registers would hold every later event back for ever, with the
deliveries of it still enqueued (no process serves its queue); `PostgresHookOutbox.forget` deletes its
subscription and `forget_deliveries` its deliveries, cancelling the unfinished (`bastion hooks forget`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from dbos import DBOSClient

from bastion.durable import DURABLE_SCHEMA, system_database_url
from bastion.hooks._batches import delivery_workflow_prefix
from bastion.hooks.outbox import Pool, autocommit_connection

__all__ = ["ForgottenDeliveries", "Pruned", "forget_deliveries", "prune_deliveries", "prune_outbox"]

# Events every hook has passed (at or before every position), that no unfinished delivery still
# carries (before the first event of each, named in its workflow id: a batch's events all follow its
# first in delivery order), and older than the cutoff; with their failures. Run after locking every
# subscription, so no replay moves a position back while the events behind it go.
_PRUNE: Final = """
with passed as (
  select position_tx as tx, position_id as id from bastion.hook_subscriptions
   order by position_tx, position_id
   limit 1
),
delivering as (
  select e.tx, e.id from dbos.workflow_status w
    join bastion.hook_events e
      on e.id = substring(w.workflow_uuid from '^bastion[.]hook:[^:]+:([0-9]{19})-')::bigint
   where starts_with(w.workflow_uuid, 'bastion.hook:') and w.status in ('ENQUEUED', 'PENDING')
   order by e.tx, e.id
   limit 1
),
pruned as (
  delete from bastion.hook_events e
   using passed p
   where (e.tx, e.id) <= (p.tx, p.id)
     and not exists (select 1 from delivering d where (e.tx, e.id) >= (d.tx, d.id))
     and e.created_at < now() - %(age)s::interval
  returning e.id
),
failures as (
  delete from bastion.hook_failures f using pruned p where f.event_id = p.id returning 1
),
marked as (
  insert into bastion.hook_retention (pruned_through_id)
  select max(id) from pruned having count(*) > 0
  on conflict (singleton) do update
     set pruned_through_id = greatest(bastion.hook_retention.pruned_through_id, excluded.pruned_through_id),
         pruned_at = now()
)
select (select count(*) from pruned), (select count(*) from failures)
"""


@dataclass(frozen=True, slots=True)
class ForgottenDeliveries:
    """What `forget_deliveries` did to a hook's delivery workflows: cancelled the unfinished ones, then
    deleted every one (those cancelled included)."""

    cancelled: int
    deleted: int


@dataclass(frozen=True, slots=True)
class Pruned:
    """What one `prune` deleted: outbox events, and failure records of them."""

    events: int
    failures: int


async def prune_outbox(pool: Pool, older_than: timedelta) -> Pruned:
    """Delete the events older than `older_than` that every registered hook has passed and no
    delivery still carries, with their failure records. With no hook registered nothing is pruned (a
    hook to come may start from the oldest event)."""
    if older_than < timedelta(0):
        raise ValueError("older_than must not be negative.")
    async with autocommit_connection(pool) as conn, conn.transaction():
        await conn.execute("select 1 from bastion.hook_subscriptions for share")
        cursor = await conn.execute(_PRUNE, {"age": older_than})
        row = await cursor.fetchone()
    return Pruned(events=int(row[0]), failures=int(row[1])) if row else Pruned(0, 0)


async def prune_deliveries(conninfo: str, hooks: list[str], older_than: timedelta) -> int:
    """Delete the hooks' delivery workflows that finished (or that DBOS gave up recovering) more than
    `older_than` ago from DBOS (its client, on `conninfo` as the application's role); returns how many."""
    if not hooks:
        return 0
    cutoff = (datetime.now(UTC) - older_than).isoformat()
    async with _client(conninfo) as client:
        finished = await client.list_workflows_async(
            workflow_id_prefix=[delivery_workflow_prefix(hook) for hook in hooks],
            status=["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"],
            completed_before=cutoff,
            load_input=False,
            load_output=False,
        )
        ids = [workflow.workflow_id for workflow in finished]
        if ids:
            await client.delete_workflows_async(ids)
    return len(ids)


async def forget_deliveries(conninfo: str, hook: str) -> ForgottenDeliveries:
    """Cancel `hook`'s delivery workflows still enqueued or running (batches and their lanes), so none
    holds retention back or runs again when recovered, then delete all of them from DBOS: a hook
    subscribed again under the name starts its generations afresh, and must reuse no workflow id."""
    prefix = delivery_workflow_prefix(hook)
    async with _client(conninfo) as client:
        unfinished = await client.list_workflows_async(
            workflow_id_prefix=prefix, status=["ENQUEUED", "PENDING"], load_input=False, load_output=False
        )
        cancelled = [workflow.workflow_id for workflow in unfinished]
        if cancelled:
            await client.cancel_workflows_async(cancelled)
        every = await client.list_workflows_async(
            workflow_id_prefix=prefix, load_input=False, load_output=False
        )
        deleted = [workflow.workflow_id for workflow in every]
        if deleted:
            await client.delete_workflows_async(deleted)
    return ForgottenDeliveries(cancelled=len(cancelled), deleted=len(deleted))


@asynccontextmanager
async def _client(conninfo: str) -> AsyncIterator[DBOSClient]:
    client = DBOSClient(system_database_url=system_database_url(conninfo), dbos_system_schema=DURABLE_SCHEMA)
    try:
        yield client
    finally:
        await asyncio.to_thread(client.destroy)
