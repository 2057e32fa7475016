"""Workflows the durable engine's tests run, declared at import as DBOS wants, in the test process and
in the worker processes the tests kill.

`counted(key)` records one side effect per executed step in `durable_effects` (outside DBOS, so a step
that runs twice shows twice), then waits in its second step until the test releases it.
"""

from __future__ import annotations

import asyncio
import os

import psycopg
from dbos import DBOS

EFFECTS_TABLE = """
create table if not exists public.durable_effects (
  workflow text not null, step text not null, executor text not null, at timestamptz default now()
);
grant select, insert on public.durable_effects to bastion_app;
create table if not exists public.durable_release (workflow text primary key);
grant select on public.durable_release to bastion_app;
"""


def _conninfo() -> str:
    return os.environ["BASTION_TEST_DSN"]


async def _record(workflow: str, step: str) -> None:
    async with await psycopg.AsyncConnection.connect(_conninfo(), autocommit=True) as conn:
        await conn.execute(
            "insert into public.durable_effects (workflow, step, executor) values (%s, %s, %s)",
            (workflow, step, os.environ.get("BASTION_EXECUTOR_ID", "test")),
        )


@DBOS.step(name="tests.durable.first")
async def first(key: str) -> str:
    await _record(key, "first")
    return f"first:{key}"


@DBOS.step(name="tests.durable.wait")
async def wait_for_release(key: str) -> str:
    await _record(key, "wait")
    async with await psycopg.AsyncConnection.connect(_conninfo(), autocommit=True) as conn:
        while True:
            cursor = await conn.execute("select 1 from public.durable_release where workflow = %s", (key,))
            if await cursor.fetchone() is not None:
                return f"released:{key}"
            await asyncio.sleep(0.05)


@DBOS.workflow(name="tests.durable.counted")
async def counted(key: str) -> list[str]:
    return [await first(key), await wait_for_release(key)]


@DBOS.workflow(name="tests.durable.which_loop")
async def which_loop() -> int:
    """The id of the event loop the workflow runs on."""
    return id(asyncio.get_running_loop())
