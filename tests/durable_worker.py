"""A worker process for the durable engine's tests: launches an engine, starts `counted(key)` under the
workflow id `key`, says `started`, then serves until it is killed."""

from __future__ import annotations

import asyncio
import os
import sys

from dbos import DBOS, SetWorkflowID

from bastion.durable import DurableEngine
from tests import durable_workflows


async def main(key: str) -> None:
    engine = await DurableEngine.launch(os.environ["BASTION_TEST_APP_DSN"], recovery_interval=60)
    with SetWorkflowID(key):
        await DBOS.start_workflow_async(durable_workflows.counted, key)
    print("started", engine.executor_id, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
