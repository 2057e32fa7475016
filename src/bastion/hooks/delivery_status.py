"""The hooks' delivery workflows as DBOS records them, for operators: those still enqueued or running,
and those that ended in an error.

A delivery ends in an error only when delivery's own code fails (not the hook: its failures are
retried and recorded as `HookFailure`s), or when DBOS gave up recovering it. Its events after the
first it carried may not have reached the hook, and nothing retries them: the operator replays the
hook from that event (`bastion hooks replay HOOK --from EVENT_ID`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

from bastion.hooks.outbox import Pool

__all__ = ["FailedDelivery", "failed_deliveries", "failed_delivery_counts", "queued_deliveries"]

_UNFINISHED: Final = ("ENQUEUED", "PENDING")
_ENDED_IN_ERROR: Final = ("ERROR", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")

# A delivery's workflow id names its hook and the first event it carried (lanes share their batch's).
_FAILED: Final = """
select split_part(w.workflow_uuid, ':', 2), w.workflow_uuid,
       substring(w.workflow_uuid from '^bastion[.]hook:[^:]+:([0-9]{19})-')::bigint, w.status,
       to_timestamp(w.updated_at / 1000.0)
  from dbos.workflow_status w
 where starts_with(w.workflow_uuid, 'bastion.hook:')
   and w.status = any(%(statuses)s)
   and (%(hook)s::text is null or split_part(w.workflow_uuid, ':', 2) = %(hook)s)
 order by w.updated_at desc
 limit %(limit)s
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedDelivery:
    """A delivery workflow that ended without delivering: replay `hook` from `first_event_id`."""

    hook: str
    workflow_id: str
    first_event_id: int
    status: str
    ended_at: datetime


async def queued_deliveries(pool: Pool) -> dict[str, int]:
    """Deliveries enqueued or running (handed to DBOS, not finished), per hook."""
    return await _per_hook(pool, _UNFINISHED)


async def failed_delivery_counts(pool: Pool) -> dict[str, int]:
    """Deliveries that ended in an error, per hook."""
    return await _per_hook(pool, _ENDED_IN_ERROR)


async def failed_deliveries(pool: Pool, hook: str | None = None, *, limit: int = 100) -> list[FailedDelivery]:
    """The deliveries (of `hook`, or of every hook) that ended in an error, latest first."""
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
