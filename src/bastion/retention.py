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

A running turn's log, an undelivered event and an unexpired recall are never touched. Import this module
before launching the engine and start `Retention` in every process that launches it, as any process may
dequeue a run: a run dequeued (or recovered from a dead worker) before its process started `Retention`
waits for it, up to `READY_WAIT_SECONDS`, then fails (logged as an error, DBOS's `ERROR`). The operators'
commands (`bastion hooks prune`, `prune_finished_turns`, `prune_outbox`) stay for pruning at once.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final

from dbos import DBOS

from bastion.chat.durable_turns import prune_finished_turns
from bastion.durable._ready import REGISTRATION_WAIT_SECONDS, registered
from bastion.durable.engine import prune_finished_workflows
from bastion.hooks import PostgresHookOutbox, Pruned, prune_deliveries, prune_outbox
from bastion.inbox.replies import REPLY_WORKFLOW
from bastion.memory.extraction_jobs import EXTRACTION_WORKFLOW

if TYPE_CHECKING:
    from bastion.durable import DurableEngine
    from bastion.memory import PostgresMemoryStore
    from bastion.stores import PostgresStore

__all__ = ["Retention", "RetentionNotStarted", "RetentionPolicy", "RetentionReport"]

logger = logging.getLogger("bastion.retention")

SCHEDULE_NAME: Final = "bastion.retention"
READY_WAIT_SECONDS: float = REGISTRATION_WAIT_SECONDS
"""How long a scheduled run waits for its process's `Retention` to start before it fails."""


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

    async def start(self, engine: DurableEngine) -> None:
        """Run on `engine`'s schedule from now on (one retention per process)."""
        global _running
        if _running is not None and _running is not self:
            raise RuntimeError("Another Retention already runs in this process.")
        _running = self
        await DBOS.apply_schedules_async(
            [
                {
                    "schedule_name": SCHEDULE_NAME,
                    "workflow_fn": _scheduled_retention,
                    "schedule": self.policy.schedule,
                }
            ]
        )

    def stop(self) -> None:
        global _running
        if _running is self:
            _running = None


# DBOS calls scheduled workflows by name, with no application object: the one `Retention` a process
# runs is found here.
_running: Retention | None = None


class RetentionNotStarted(RuntimeError):
    """A scheduled run was handed to a process that started no `Retention` in time: it ends in ERROR
    (the next period's run, in any process, prunes what this one would have)."""

    code: ClassVar[str] = "retention_not_started"


@DBOS.workflow(name=SCHEDULE_NAME)
async def _scheduled_retention(scheduled_at: datetime, context: Any) -> None:
    # A run recovered or dequeued while this process starts up waits for its Retention (bounded).
    if await registered(lambda: _running, timeout=READY_WAIT_SECONDS) is None:
        logger.error(
            "Retention of %s failed: no Retention was started in this process within %g s. Start it"
            " (Retention.start) in every process that launches the durable engine.",
            scheduled_at,
            READY_WAIT_SECONDS,
        )
        raise RetentionNotStarted(f"No Retention was started in this process for the run of {scheduled_at}.")
    report = await _run_step()
    logger.info("Retention of %s: %s", scheduled_at, report)


@DBOS.step(name="bastion.retention.run")
async def _run_step() -> dict[str, int]:
    """One step, so the DBOS calls inside run as plain calls rather than as steps of their own."""
    assert _running is not None
    return asdict(await _running.run_once())
