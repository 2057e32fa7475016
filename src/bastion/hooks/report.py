"""The operator's view of the hooks, as text: each hook's position, lag and failures, replays, pruning
and forgetting a hook.

`bastion hooks` prints it; any application can call these over its own pool.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

from bastion.hooks.delivery_status import failed_deliveries, failed_delivery_counts, queued_deliveries
from bastion.hooks.outbox import Pool, PostgresHookOutbox
from bastion.hooks.retention import forget_deliveries, prune_deliveries, prune_outbox

__all__ = ["failures_report", "forget_hook", "parse_age", "prune_hooks", "replay_hook", "status_report"]

_AGE: Final = re.compile(r"([0-9]{1,6})([smhd])")
_UNITS: Final = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}

_WIDTHS = (10, 6, 8, 7, 9, 8, 7)


async def status_report(pool: Pool, *, now: datetime | None = None) -> list[str]:
    """One line per hook: events not yet handed to delivery (lag) and the age of the oldest, delivery
    workflows queued or running (each a batch of events, or a conversation's set aside), events
    retrying, events given up, and deliveries that ended in an error (see `failures_report`)."""
    outbox = PostgresHookOutbox(pool)
    statuses = await outbox.status()
    if not statuses:
        return ["No hooks are registered."]
    queued = await queued_deliveries(pool)
    failed = await failed_delivery_counts(pool)
    now = now or datetime.now(UTC)
    lines = [
        f"{'hook':<24} {'position':>10} {'lag':>6} {'oldest':>8} {'queued':>7} {'retrying':>9} {'gave up':>8}"
        f" {'failed':>7}"
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
            failed.get(status.hook, 0),
        )
        lines.append(
            f"{status.hook:<24} " + " ".join(f"{v:>{w}}" for v, w in zip(values, _WIDTHS, strict=True))
        )
    return lines


async def failures_report(pool: Pool, hook: str | None = None, *, limit: int = 50) -> list[str]:
    """The deliveries that ended in an error, each with the replay that delivers its events, then the
    events whose hook failed on them (retrying, given up or delivered at last), latest first. An
    unknown hook: LookupError."""
    outbox = PostgresHookOutbox(pool)
    if hook is not None and hook not in await outbox.hooks():
        raise LookupError(f"There is no hook named {hook!r}.")
    ended = await failed_deliveries(pool, hook, limit=limit)
    failures = await outbox.failures(hook, limit=limit)
    if not ended and not failures:
        return ["No failed deliveries."]
    lines = [
        f"{delivery.hook} delivery {delivery.workflow_id} ended in an error"
        f" ({delivery.status}) at {delivery.ended_at.isoformat(timespec='seconds')}: its events may not"
        f" have been delivered; bastion hooks replay {delivery.hook} --from {delivery.first_event_id}"
        for delivery in ended
    ]
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


def parse_age(text: str) -> timedelta:
    """An age such as `30d`, `12h`, `45m` or `90s`; ValueError otherwise."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not an age: a whole number and s, m, h or d, e.g. 7d.")
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


async def prune_hooks(pool: Pool, conninfo: str, older_than: timedelta) -> str:
    """Delete outbox events older than `older_than` that every hook has passed, their failure records,
    and the hooks' delivery workflows that finished that long ago."""
    pruned = await prune_outbox(pool, older_than)
    workflows = await prune_deliveries(conninfo, await PostgresHookOutbox(pool).hooks(), older_than)
    return (
        f"Pruned {pruned.events} event(s) every hook has passed, {pruned.failures} failure record(s)"
        f" and {workflows} finished delivery workflow(s), all older than {older_than}."
    )


async def forget_hook(pool: Pool, conninfo: str, hook: str) -> str:
    """Delete a retired hook's subscription, failures and holds, and its deliveries (cancelling the
    unfinished). Run again after an interruption, it deletes what is left; LookupError when nothing of
    it is left."""
    forgotten = await PostgresHookOutbox(pool).forget(hook)
    deliveries = await forget_deliveries(conninfo, hook)
    if forgotten is None and deliveries.deleted == 0:
        raise LookupError(f"There is no hook named {hook!r}.")
    position = (
        "it had no subscription left"
        if forgotten is None
        else f"deleted its position, {forgotten.failures} failure record(s) and {forgotten.holds} hold(s)"
    )
    return (
        f"Forgot {hook}: {position}; deleted {deliveries.deleted} delivery workflow(s), of which"
        f" {deliveries.cancelled} unfinished were cancelled."
    )
