"""The hooks' delivery workflows as DBOS records them, for operators: those still enqueued or running,
and those that ended in an error.

A delivery ends in an error only when delivery's own code fails (not the hook: its failures are
retried and recorded as `HookFailure`s), or when DBOS gave up recovering it. Its events after the
first it carried may not have reached the hook, and nothing retries them: the operator replays the
hook from that event (`bastion hooks replay HOOK --from EVENT_ID`), which settles it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from bastion.hooks.outbox import Pool

__all__ = ["FailedDelivery", "failed_deliveries", "failed_delivery_counts", "queued_deliveries"]

_UNFINISHED: Final = ("ENQUEUED", "PENDING")
_ENDED_IN_ERROR: Final = ("ERROR", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")

# A delivery's workflow id names its hook, the first event it carried and its generation (lanes share
# their batch's). It is settled by a replay of a later generation from a position before that event;
# one whose first event was pruned is not (it was never delivered). A hook no longer subscribed has none.
_UNSETTLED: Final = """
with ended as (
  select split_part(w.workflow_uuid, ':', 2) as hook, w.workflow_uuid,
         substring(w.workflow_uuid from '^bastion[.]hook:[^:]+:([0-9]{19})-')::bigint as first_id,
         coalesce(substring(w.workflow_uuid from ':r([0-9]+)(:|$)')::integer, 0) as generation,
         w.status, w.updated_at
    from dbos.workflow_status w
   where starts_with(w.workflow_uuid, 'bastion.hook:') and w.status = any(%(statuses)s)
),
unsettled as (
  select d.* from ended d
    join bastion.hook_subscriptions s on s.hook = d.hook
    left join bastion.hook_events e on e.id = d.first_id
   where (%(hook)s::text is null or d.hook = %(hook)s)
     and not exists (
       select 1 from bastion.hook_replays r
        where r.hook = d.hook and r.generation > d.generation
          and (r.position_tx, r.position_id) < (e.tx, e.id)
     )
)
"""
_FAILED: Final = (
    _UNSETTLED
    + "select hook, workflow_uuid, first_id, status, to_timestamp(updated_at / 1000.0) from unsettled"
    " order by updated_at desc limit %(limit)s"
)
_FAILED_PER_HOOK: Final = _UNSETTLED + "select hook, count(*) from unsettled group by hook"


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedDelivery:
    """A delivery workflow that ended without delivering: replay `hook` from `first_event_id`, which
    settles it."""

    hook: str
    workflow_id: str
    first_event_id: int
    status: str
    ended_at: datetime


async def queued_deliveries(pool: Pool) -> dict[str, int]:
    """Deliveries enqueued or running (handed to DBOS, not finished), per hook."""
    return await _per_hook(pool, _UNFINISHED)


async def failed_delivery_counts(pool: Pool) -> dict[str, int]:
    """Deliveries that ended in an error and no replay has settled, per hook."""
    async with pool.connection() as conn:
        params = {"hook": None, "statuses": list(_ENDED_IN_ERROR)}
        cursor = await conn.execute(_FAILED_PER_HOOK, params)
        rows = await cursor.fetchall()
    return {name: count for name, count in rows}


async def failed_deliveries(pool: Pool, hook: str | None = None, *, limit: int = 100) -> list[FailedDelivery]:
    """The deliveries (of `hook`, or of every subscribed hook) that ended in an error and that no replay
    has settled since, latest first."""
    async with pool.connection() as conn:
        params = {"hook": hook, "limit": limit, "statuses": list(_ENDED_IN_ERROR)}
        cursor = await conn.execute(_FAILED, params)
        rows = await cursor.fetchall()
    return [
        FailedDelivery(hook=r[0], workflow_id=r[1], first_event_id=r[2], status=r[3], ended_at=r[4])
        for r in rows
    ]


async def _per_hook(pool: Pool, statuses: tuple[str, ...]) -> dict[str, int]:
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "select split_part(workflow_uuid, ':', 2), count(*) from dbos.workflow_status"
            " where starts_with(workflow_uuid, 'bastion.hook:') and status = any(%s) group by 1",
            (list(statuses),),
        )
        rows = await cursor.fetchall()
    return {name: count for name, count in rows}
