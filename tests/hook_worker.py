"""A worker process for the hooks' delivery tests: delivers the hooks named on the command line, says
`ready`, then serves until it is killed."""

from __future__ import annotations

import asyncio
import os
import sys

from psycopg_pool import AsyncConnectionPool

from bastion.durable import DurableEngine
from bastion.hooks import HookDelivery
from tests import hook_apps


async def main(names: list[str]) -> None:
    dsn = os.environ["BASTION_TEST_APP_DSN"]
    engine = await DurableEngine.launch(dsn, recovery_interval=60)
    pool = AsyncConnectionPool(dsn, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False)
    await pool.open(wait=True)
    await HookDelivery.start(
        engine,
        pool,
        hook_apps.registry(*names),
        listen_conninfo=dsn,
        poll_interval=0.2,
        queue_polling_interval=0.02,
    )
    print("ready", engine.executor_id, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
