"""Retention that runs by itself: what bastion keeps only for a while, pruned on a schedule.

`Retention.start(engine)` registers a DBOS schedule (`bastion.retention`, every ten minutes by default).
DBOS names each firing's workflow after the schedule and its time, so however many processes serve,
each period prunes once, in whichever process dequeues it. A run deletes, each past its age in
`RetentionPolicy`:

- the workflows of finished turns (their inputs hold the conversation) and the stream logs of runs that
  ended (a log is replayed only while its run is in flight);
- the finished memory extraction jobs (their inputs hold a turn's messages), at the turns' age;
- the finished inbox reply jobs;
- the outbox events every hook has passed and no delivery still carries, their failure records, and
  the hooks' finished delivery workflows;
- memory's expired operation records (each lives its store's `operation_ttl`).

A running turn's log, an undelivered event and an unexpired recall are never touched. Start `Retention` in
every process that launches the engine, as any of them may be handed a run (the run's workflow is declared
with the engine, `bastion.durable.retention_workflow`): a run handed to a process before it started
`Retention` (one recovered from a dead worker, say) waits for it (30 s at most), then fails, logged as an
error and recorded as DBOS's `ERROR`. The operators' commands (`bastion hooks prune`,
`prune_finished_turns`, `prune_outbox`) stay for pruning at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from dbos import DBOS

from bastion.chat.durable_turns import prune_finished_turns
from bastion.durable.engine import prune_finished_workflows
from bastion.durable.retention_workflow import (
    RETENTIONS,
    SCHEDULE_NAME,
    RetentionNotStarted,
    scheduled_retention,
)
from bastion.hooks import PostgresHookOutbox, Pruned, prune_deliveries, prune_outbox
from bastion.inbox.replies import REPLY_WORKFLOW
from bastion.memory.extraction_jobs import EXTRACTION_WORKFLOW

if TYPE_CHECKING:
    from bastion.durable import DurableEngine
    from bastion.memory import PostgresMemoryStore
    from bastion.stores import PostgresStore

__all__ = [
    "SCHEDULE_NAME",
    "Retention",
    "RetentionNotStarted",
    "RetentionPolicy",
    "RetentionReport",
]


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """How long each kind of record is kept after it is finished, and how often retention runs.

    `schedule` is a DBOS cron expression with seconds (six fields).
    """

    finished_turns: timedelta = timedelta(days=7)
    inbox_jobs: timedelta = timedelta(days=7)
    delivered_events: timedelta = timedelta(days=30)
    schedule: str = "0 */10 * * * *"

    def __post_init__(self) -> None:
        for name in ("finished_turns", "inbox_jobs", "delivered_events"):
            if getattr(self, name) < timedelta(0):
                raise ValueError(f"{name} must not be negative.")


@dataclass(frozen=True)
class RetentionReport:
    """What one run deleted."""

    turn_workflows: int
    stream_log_rows: int
    inbox_jobs: int
    events: int
    event_failures: int
    delivery_workflows: int
    memory_records: int
    extraction_jobs: int = 0


class Retention:
    """Prunes `store` (and `memory`, when given) by `policy`; see the module.

    `conninfo` is the application role's connection string, for DBOS's client (the hooks' deliveries).
    `hooks=False` leaves the outbox alone, for a database without the hooks' migrations.
    """

    def __init__(
        self,
        store: PostgresStore,
        *,
        conninfo: str,
        policy: RetentionPolicy | None = None,
        hooks: bool = True,
        memory: PostgresMemoryStore | None = None,
    ) -> None:
        self.store = store
        self.conninfo = conninfo
        self.policy = policy or RetentionPolicy()
        self.hooks = hooks
        self.memory = memory

    async def run_once(self) -> RetentionReport:
        """Prune everything past its age now."""
        policy = self.policy
        workflows, log_rows = await prune_finished_turns(self.store, older_than=policy.finished_turns)
        inbox_jobs = await prune_finished_workflows(REPLY_WORKFLOW, older_than=policy.inbox_jobs)
        extraction_jobs = await prune_finished_workflows(
            EXTRACTION_WORKFLOW, older_than=policy.finished_turns
        )
        events, deliveries = Pruned(0, 0), 0
        if self.hooks:
            events = await prune_outbox(self.store.pool, policy.delivered_events)
            hooks = await PostgresHookOutbox(self.store.pool).hooks()
            deliveries = await prune_deliveries(self.conninfo, hooks, policy.delivered_events)
        memory_records = await self.memory.purge() if self.memory is not None else 0
        return RetentionReport(
            turn_workflows=workflows,
            stream_log_rows=log_rows,
            inbox_jobs=inbox_jobs,
            events=events.events,
            event_failures=events.failures,
            delivery_workflows=deliveries,
            memory_records=memory_records,
            extraction_jobs=extraction_jobs,
        )

    async def run_scheduled(self) -> dict[str, int]:
        """`run_once`, as the scheduled workflow records it."""
        return asdict(await self.run_once())

    async def start(self, engine: DurableEngine) -> None:
        """Run on `engine`'s schedule from now on (one retention per process)."""
        running = RETENTIONS.get(SCHEDULE_NAME)
        if running is not None and running is not self:
            raise RuntimeError("Another Retention already runs in this process.")
        RETENTIONS[SCHEDULE_NAME] = self
        await DBOS.apply_schedules_async(
            [
                {
                    "schedule_name": SCHEDULE_NAME,
                    "workflow_fn": scheduled_retention,
                    "schedule": self.policy.schedule,
                }
            ]
        )

    def stop(self) -> None:
        if RETENTIONS.get(SCHEDULE_NAME) is self:
            del RETENTIONS[SCHEDULE_NAME]
