"""One DBOS per process, on the application's Postgres, with dead workers' work handed to live ones.

DBOS keeps workflows, steps and queues as rows in schema `dbos` of the application's database, and on
launch recovers only the work of its own executor id. bastion runs many stateless processes, so each
process gets an executor id of its own and holds a session advisory lock named after it for as long
as it lives. A janitor in every process looks for executors that left PENDING workflows behind and
whose lock it can take — their process is gone, because a session lock dies with its connection — and
hands their workflows back to the queues through `DBOS._recover_pending_workflows`, where exactly one
live process picks each up. A process that is stopping (draining) takes no new work: it stops its
janitor and stops dequeuing (`stop_dequeuing`), while the workflows it runs finish. Both calls reach
into DBOS; `tests/test_dbos_contract.py` pins them.

The application version is fixed (`DURABLE_APPLICATION_VERSION`), not DBOS's hash of the workflow
sources: a deploy must not orphan the turns in flight. It changes only when stored workflow history
can no longer be replayed by the new code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from bastion._extras import missing_extra

try:
    import psycopg
    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig
    from dbos._dbos import _get_dbos_instance
    from dbos._queue import queue_thread as _dbos_queue_thread
    from psycopg.conninfo import conninfo_to_dict
except ImportError as error:
    raise missing_extra("bastion.durable", "durable", error) from error

__all__ = [
    "DURABLE_APPLICATION_VERSION",
    "DURABLE_SCHEMA",
    "DurableEngine",
    "DurableEngineError",
    "migrate_durable",
    "prune_finished_workflows",
    "stop_dequeuing",
    "system_database_url",
]

logger = logging.getLogger("bastion.durable")

DURABLE_APPLICATION_VERSION: Final = "bastion-1"
DURABLE_SCHEMA: Final = "dbos"
DEFAULT_APPLICATION_NAME: Final = "bastion"
DEFAULT_RECOVERY_INTERVAL: Final = 1.0
DEFAULT_QUEUE_POLLING_INTERVAL: Final = 0.1
_LOCK_PREFIX: Final = "bastion.executor:"
_EXECUTOR_ID_ENV: Final = "BASTION_EXECUTOR_ID"
# DBOS's blocking calls (migrate, destroy, recovery) run here, not on the loop's default executor, which
# DBOS replaces with its own while launched and shuts down with itself.
_BLOCKING: Final = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bastion-durable")


class DurableEngineError(RuntimeError):
    """The durable engine cannot run as configured; the message says what to change."""

    code: ClassVar[str] = "durable_engine_unavailable"


def system_database_url(conninfo: str) -> str:
    """DBOS's SQLAlchemy URL for a psycopg connection string (a URL or `key=value` pairs)."""
    if conninfo.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + conninfo.split("://", 1)[1]
    params = {key: str(value) for key, value in conninfo_to_dict(conninfo).items()}
    url = sa.URL.create(
        "postgresql+psycopg",
        username=params.pop("user", None),
        password=params.pop("password", None),
        database=params.pop("dbname", None),
        query=params,
    )
    return url.render_as_string(hide_password=False)


async def migrate_durable(admin_conninfo: str, *, app_role: str | None = None) -> None:
    """Create or upgrade DBOS's tables in schema `dbos` as the database owner, and let `app_role` use them.

    Only the application's role gets the schema: its workflow inputs hold every tenant's messages, so
    `authenticated` and `anon` are never granted anything there.
    """
    url = system_database_url(admin_conninfo)
    await _blocking(lambda: DBOS.migrate(url, schema=DURABLE_SCHEMA, application_role=app_role))


class DurableEngine:
    """This process's DBOS: launched once, holding its executor's liveness lock, recovering the dead.

    Declare workflows and steps (import the modules that declare them) before `launch`.
    """

    def __init__(
        self,
        *,
        executor_id: str,
        conninfo: str,
        liveness: psycopg.AsyncConnection[Any],
        recovery_interval: float,
        application_name: str = DEFAULT_APPLICATION_NAME,
    ) -> None:
        self.executor_id: Final = executor_id
        self.application_name: Final = application_name
        self._conninfo = conninfo
        self._liveness = liveness
        self._recovery_interval = recovery_interval
        self._janitor: asyncio.Task[None] | None = None
        self._closed = False
        self.recovered: list[str] = []

    @classmethod
    async def launch(
        cls,
        conninfo: str,
        *,
        executor_id: str | None = None,
        recovery_interval: float = DEFAULT_RECOVERY_INTERVAL,
        application_name: str = DEFAULT_APPLICATION_NAME,
        pool_size: int = 10,
    ) -> DurableEngine:
        """Launch DBOS for this process on `conninfo` (the application's role; a direct or session-mode
        connection, since DBOS listens for notifications). The `dbos` schema must exist (`migrate_durable`).

        `executor_id` defaults to `BASTION_EXECUTOR_ID`, else a random id: each live process needs its
        own. Every `recovery_interval` seconds the janitor looks for dead executors' workflows.
        """
        if _launched():
            raise DurableEngineError("DBOS is already launched in this process; close the engine first.")
        if recovery_interval <= 0:
            raise ValueError("recovery_interval must be positive")
        executor = executor_id or os.environ.get(_EXECUTOR_ID_ENV) or f"bastion-{secrets.token_hex(8)}"
        # The lock is taken before DBOS starts any work, so no janitor can take this process for dead.
        liveness = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        try:
            if not await _try_lock(liveness, executor):
                raise DurableEngineError(f"The executor id {executor!r} is held by a live process.")
            # Launched on this loop's thread, so DBOS runs the workflows it dequeues (recovered turns,
            # queued jobs) on this loop, where the application's pools and clients live.
            _launch_dbos(conninfo, executor, application_name, pool_size)
        except BaseException:
            await liveness.close()
            raise
        engine = cls(
            executor_id=executor,
            conninfo=conninfo,
            liveness=liveness,
            recovery_interval=recovery_interval,
            application_name=application_name,
        )
        engine._janitor = asyncio.get_running_loop().create_task(engine._recover_forever())
        return engine

    async def register_queue(self, name: str, **limits: Any) -> Any:
        """Register (or update) a DBOS queue; polled every 0.1 s unless `polling_interval_sec` is given."""
        limits.setdefault("polling_interval_sec", DEFAULT_QUEUE_POLLING_INTERVAL)
        return await DBOS.register_queue_async(name, **limits)

    async def recover_dead_executors(self, application_name: str | None = None) -> list[str]:
        """One janitor pass: hand the PENDING workflows of every dead executor of `application_name`
        (by default this engine's application) back to the queues.

        An executor is dead when its liveness lock is free. The lock is held while recovering, so two
        janitors never recover one executor at once (recovering twice would be harmless anyway: a
        workflow is dequeued by exactly one process). Returns the executors recovered.
        """
        cursor = await self._liveness.execute(
            f"select distinct executor_id from {DURABLE_SCHEMA}.workflow_status"
            " where status = 'PENDING' and application_name = %s and application_version = %s"
            " and executor_id <> %s",
            (application_name or self.application_name, DURABLE_APPLICATION_VERSION, self.executor_id),
        )
        recovered: list[str] = []
        for (executor,) in await cursor.fetchall():
            if not await _try_lock(self._liveness, executor):
                continue
            try:
                await _blocking(DBOS._recover_pending_workflows, [executor])
                recovered.append(executor)
                logger.info("Recovered the workflows of the dead executor %s.", executor)
            finally:
                await self._liveness.execute(
                    "select pg_advisory_unlock(hashtextextended(%s, 0))", (_LOCK_PREFIX + executor,)
                )
        self.recovered += recovered
        return recovered

    async def _recover_forever(self) -> None:
        while not self._closed:
            try:
                await self.recover_dead_executors()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("Recovering dead executors failed; trying again.")
                with contextlib.suppress(Exception):
                    await self._reconnect()
            await asyncio.sleep(self._recovery_interval)

    async def _reconnect(self) -> None:
        """A broken liveness connection lost this process's lock (the database restarted or failed
        over): connect again and take it back (nobody else could have recovered this executor's live
        work for long, as its workflows are fenced by DBOS). A lock another process holds for now is
        asked for again at the next pass."""
        if not self._liveness.closed:
            with contextlib.suppress(psycopg.Error):
                await self._liveness.execute("select 1")
                return
        with contextlib.suppress(psycopg.Error):
            await self._liveness.close()
        # The engine's own conninfo: a closed connection's cannot be read, and would lack the password.
        self._liveness = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        if not await _try_lock(self._liveness, self.executor_id):
            logger.warning("The liveness lock of %s is held elsewhere; asking again.", self.executor_id)
            await self._liveness.close()

    def stop_recovering(self) -> None:
        """Stop looking for dead executors (a draining process takes no new work); other processes'
        janitors still do, and this one's own workflows stay recoverable by them."""
        janitor, self._janitor = self._janitor, None
        if janitor is not None:
            janitor.cancel()

    def stop_taking_work(self) -> None:
        """What a draining process does: stop recovering dead executors and stop dequeuing jobs (inbox
        replies, hook lanes, memory extraction, turns recovered from a dead worker), so the other
        processes run them. The workflows already running here go on; those cut when the process
        leaves are recovered by another one, as a dead process's are."""
        self.stop_recovering()
        if not stop_dequeuing() and not self._closed:
            logger.warning("DBOS's queue thread was not found: this stopping process may still take jobs.")

    async def close(self) -> None:
        """Stop the janitor, shut DBOS down and release the liveness lock (the process's work is then
        recoverable by any live process)."""
        if self._closed:
            return
        self._closed = True
        janitor, self._janitor = self._janitor, None
        if janitor is not None:
            janitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await janitor
        await _blocking(DBOS.destroy)
        # DBOS made its executor the loop's default and has just shut it down: give the loop a live one.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio"))
        with contextlib.suppress(psycopg.Error):
            await self._liveness.close()

    async def __aenter__(self) -> DurableEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _blocking(function: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_BLOCKING, function, *args)


def _launch_dbos(conninfo: str, executor_id: str, application_name: str, pool_size: int) -> None:
    config: DBOSConfig = {
        "name": application_name,
        "system_database_url": system_database_url(conninfo),
        "dbos_system_schema": DURABLE_SCHEMA,
        "run_migrations": False,
        "application_version": DURABLE_APPLICATION_VERSION,
        "executor_id": executor_id,
        "sys_db_pool_size": pool_size,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    try:
        DBOS.launch()
    except BaseException:
        DBOS.destroy()
        raise


def stop_dequeuing() -> bool:
    """Stop this process's DBOS from dequeuing, for good, leaving the rest of it running (workflows
    already started finish; starting, recovering and reading workflows still work); whether it could.

    DBOS has no call for it at runtime (`DBOS.listen_queues` only before launch), so this sets the
    event its queue thread and that thread's per-queue pollers stop on, the one `DBOS.destroy` sets:
    found as the argument of the thread running `dbos._queue.queue_thread`. Internal to DBOS:
    `tests/test_dbos_contract.py` pins it.
    """
    try:
        threads = list(_get_dbos_instance()._background_threads)
    except Exception:
        return False  # DBOS is not launched (or already destroyed): nothing dequeues
    for thread in threads:
        if getattr(thread, "_target", None) is _dbos_queue_thread:
            stop = getattr(thread, "_args", (None,))[0]
            if isinstance(stop, threading.Event):
                stop.set()
                return True
    return False


def _launched() -> bool:
    try:
        return bool(_get_dbos_instance()._launched)
    except Exception:
        return False


async def _try_lock(conn: psycopg.AsyncConnection[Any], executor_id: str) -> bool:
    cursor = await conn.execute(
        "select pg_try_advisory_lock(hashtextextended(%s, 0))", (_LOCK_PREFIX + executor_id,)
    )
    row = await cursor.fetchone()
    return bool(row and row[0])


async def prune_finished_workflows(name: str, *, older_than: timedelta) -> int:
    """Retention: delete the workflows named `name` that finished (or that DBOS gave up recovering) more
    than `older_than` ago, through this process's launched DBOS; returns how many."""
    finished = await DBOS.list_workflows_async(
        name=name,
        status=["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"],
        completed_before=(datetime.now(UTC) - older_than).isoformat(),
        load_input=False,
        load_output=False,
    )
    ids = [workflow.workflow_id for workflow in finished]
    if ids:
        await DBOS.delete_workflows_async(ids)
    return len(ids)
