"""Scheduled retention's DBOS workflow, declared when `bastion.durable` is imported.

DBOS hands each run of the schedule `bastion.retention` to whichever process dequeues it, or to one
that recovered it from a dead worker, and runs a module-level function there. A process that had not
declared the workflow when its engine launched cannot run it at all, and the run stays pending, so it is
declared here, with the engine, as the turns' and extraction's are. What it runs is the process's
`Retention` (`bastion.retention`), registered by `Retention.start` in `RETENTIONS`: a run handed to a
process still starting up waits for it (`bastion.durable._ready`), up to `READY_WAIT_SECONDS`, and then
fails, logged as an error and recorded by DBOS as `ERROR` (the next period's run prunes what it would
have), rather than being skipped unseen.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, ClassVar, Final, Protocol

from bastion._extras import missing_extra

try:
    from dbos import DBOS
except ImportError as error:
    raise missing_extra("bastion.durable", "durable", error) from error

from bastion.durable._ready import REGISTRATION_WAIT_SECONDS, registered

__all__ = [
    "READY_WAIT_SECONDS",
    "RETENTIONS",
    "SCHEDULE_NAME",
    "RetentionNotStarted",
    "RetentionRunner",
    "scheduled_retention",
]

logger = logging.getLogger("bastion.retention")

SCHEDULE_NAME: Final = "bastion.retention"
READY_WAIT_SECONDS: float = REGISTRATION_WAIT_SECONDS
"""How long a run waits for its process's `Retention` to start before it fails."""


class RetentionNotStarted(RuntimeError):
    """A run was handed to a process that started no `Retention` in time: it ends in ERROR."""

    code: ClassVar[str] = "retention_not_started"


class RetentionRunner(Protocol):
    """What prunes once (a started `Retention`): what it deleted, by kind."""

    async def run_scheduled(self) -> dict[str, int]: ...


# The one registry DBOS forces: the process's started Retention, under SCHEDULE_NAME.
RETENTIONS: Final[dict[str, RetentionRunner]] = {}


@DBOS.workflow(name=SCHEDULE_NAME)
async def scheduled_retention(scheduled_at: datetime, context: Any) -> None:
    """One run of the schedule (DBOS passes its time and the schedule's context)."""
    if await registered(lambda: RETENTIONS.get(SCHEDULE_NAME), timeout=READY_WAIT_SECONDS) is None:
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
    return await RETENTIONS[SCHEDULE_NAME].run_scheduled()
