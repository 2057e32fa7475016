"""The operator's view of the hooks, as text: each hook's position, lag and failures, and replays.

`bastion hooks` prints it; any application can call these over its own pool.
"""

from __future__ import annotations

from datetime import UTC, datetime

from bastion.hooks.delivery import Pool, queued_deliveries
from bastion.hooks.outbox import PostgresHookOutbox

__all__ = ["failures_report", "replay_hook", "status_report"]

_WIDTHS = (10, 6, 8, 7, 9, 8)


async def status_report(pool: Pool, *, now: datetime | None = None) -> list[str]:
    """One line per hook: events not yet handed to delivery (lag) and the age of the oldest, delivery
    workflows queued or running (each a conversation's batch of events), events retrying and events
    given up."""
    outbox = PostgresHookOutbox(pool)
    statuses = await outbox.status()
    if not statuses:
        return ["No hooks are registered."]
    queued = await queued_deliveries(pool)
    now = now or datetime.now(UTC)
    lines = [
        f"{'hook':<24} {'position':>10} {'lag':>6} {'oldest':>8} {'queued':>7} {'retrying':>9} {'gave up':>8}"
    ]
    for status in statuses:
        oldest = status.oldest_undispatched_at
        age = "-" if oldest is None else f"{max(0.0, (now - oldest).total_seconds()):.0f}s"
        values = (
            status.position_event_id,
            status.undispatched,
            age,
            queued.get(status.hook, 0),
            status.retrying,
            status.given_up,
        )
        lines.append(
            f"{status.hook:<24} " + " ".join(f"{v:>{w}}" for v, w in zip(values, _WIDTHS, strict=True))
        )
    return lines


async def failures_report(pool: Pool, hook: str | None = None, *, limit: int = 50) -> list[str]:
    failures = await PostgresHookOutbox(pool).failures(hook, limit=limit)
    if not failures:
        return ["No failed deliveries."]
    lines = []
    for failure in failures:
        state = "delivered" if failure.delivered else "gave up" if failure.gave_up else "retrying"
        lines.append(
            f"{failure.hook} event {failure.event_id} (generation {failure.generation}, conversation"
            f" {failure.conversation_id}): {state} after {failure.attempts} attempt(s),"
            f" last at {failure.last_failed_at.isoformat(timespec='seconds')}: {failure.error}"
        )
    return lines


async def replay_hook(pool: Pool, hook: str, from_event_id: int) -> str:
    generation = await PostgresHookOutbox(pool).replay(hook, from_event_id)
    return f"{hook} delivers again from event {from_event_id} on (generation {generation})."


def _columns(values: tuple[object, ...]) -> str:
    return " ".join(f"{value!s:>{width}}" for value, width in zip(values, _WIDTHS, strict=True))
