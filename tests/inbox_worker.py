"""A worker process for the inbox's crash test: runs the bot's reply jobs on its own DBOS until killed.

`python -m tests.inbox_worker hang` records each model request in `public.inbox_model_calls` and never
answers (the process is killed mid-turn); `echo` records and answers like `EchoModel`; `post-hang`
answers, posts the reply, then hangs before the job can record that it posted (killed there).
`BASTION_TEST_START_DELAY` (seconds) delays starting the inbox after the engine launched, as a process
that registers slowly would: DBOS may hand it recovered jobs meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from pydantic_ai.models.function import FunctionModel

from bastion.durable import DurableEngine
from bastion.inbox import InboxReplies, PostgresInbox
from bastion.stores import PostgresStore
from tests.inbox_models import EchoModel, support_agent

CALLS_TABLE = """
create table if not exists public.inbox_model_calls (executor text not null, at timestamptz default now());
grant insert on public.inbox_model_calls to bastion_app;
"""


async def _record(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "insert into public.inbox_model_calls (executor) values (%s)",
            (os.environ["BASTION_EXECUTOR_ID"],),
        )


def _model(mode: str, dsn: str) -> FunctionModel:
    echo = EchoModel()

    async def stream(messages: Any, info: Any) -> AsyncIterator[Any]:
        await _record(dsn)
        if mode == "hang":
            await asyncio.Event().wait()
        async for item in echo._stream(messages, info):
            yield item

    return FunctionModel(stream_function=stream)


class PostThenHang(PostgresInbox):
    """Posts the bot's reply, then never returns: the step's outcome is not checkpointed."""

    async def post_bot_reply(self, contact: Any, message_id: str, text: str, *, job_id: str) -> Any:
        await super().post_bot_reply(contact, message_id, text, job_id=job_id)
        print("posted", flush=True)
        await asyncio.Event().wait()


async def main(mode: str) -> None:
    dsn = os.environ["BASTION_TEST_APP_DSN"]
    store = await PostgresStore.open(dsn, max_size=4)
    inbox = PostThenHang(store) if mode == "post-hang" else PostgresInbox(store)
    replies = InboxReplies(inbox, agent=support_agent(), model=_model(mode, dsn))
    engine = await DurableEngine.launch(dsn, recovery_interval=0.2)
    await asyncio.sleep(float(os.environ.get("BASTION_TEST_START_DELAY", "0")))
    await replies.start(engine)
    print("started", engine.executor_id, flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
