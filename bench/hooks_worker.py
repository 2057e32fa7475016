"""A process that only delivers hooks, for `bench/hooks.py`'s third phase: the assistant's hooks
(`persist_sessions` and the usage counter) on DBOS, on the database named on the command line, as
an application would run delivery beside the processes serving turns. Says `ready` once delivering
and delivers until its standard input closes.

    python bench/hooks_worker.py DSN [BATCH_INTERVAL] [QUEUE_POLL]
"""

from __future__ import annotations

import asyncio
import sys

from bastion.assistant.hooks import usage_counter
from bastion.durable import DurableEngine
from bastion.hooks import HookDelivery, HookRegistry, persist_sessions
from bastion.stores import PostgresStore


async def deliver(dsn: str, batch_interval: float, queue_poll: float) -> None:
    async with (
        await PostgresStore.open(dsn, max_size=4) as store,
        await DurableEngine.launch(dsn) as engine,
    ):
        hooks = HookRegistry([persist_sessions(store.pool), usage_counter(store)])
        delivery = await HookDelivery.start(
            engine,
            store.pool,
            hooks,
            listen_conninfo=dsn,
            batch_interval=batch_interval,
            queue_polling_interval=queue_poll,
        )
        try:
            print("ready", flush=True)
            await asyncio.to_thread(sys.stdin.read)
        finally:
            await delivery.close()


if __name__ == "__main__":
    arguments = sys.argv[1:]
    asyncio.run(
        deliver(
            arguments[0],
            float(arguments[1]) if len(arguments) > 1 else 0.5,
            float(arguments[2]) if len(arguments) > 2 else 1.0,
        )
    )
