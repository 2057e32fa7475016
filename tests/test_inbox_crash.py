"""A reply job whose worker is SIGKILLed mid-turn, or right after posting, is finished by another worker,
and the contact gets exactly one reply, even when the worker that takes it over is still starting."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from pathlib import Path

import psycopg

from bastion.inbox import InboxReplies, PostgresInbox, reply_job_id
from tests.inbox_db import InboxDatabase, channel_of, new_tenant, staff_of
from tests.inbox_models import EchoModel, support_agent
from tests.inbox_worker import CALLS_TABLE

ROOT = Path(__file__).resolve().parent.parent


async def _worker(
    database: InboxDatabase, mode: str, executor: str, *, start_delay: float = 0.0
) -> asyncio.subprocess.Process:
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "BASTION_TEST_APP_DSN": database.app_dsn,
        "BASTION_EXECUTOR_ID": executor,
        "BASTION_TEST_START_DELAY": str(start_delay),
    }
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.inbox_worker",
        mode,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert child.stdout is not None
    line = await asyncio.wait_for(child.stdout.readline(), 60)
    assert line.startswith(b"started"), (line, await child.stderr.read() if child.stderr else b"")
    return child


def _calls(database: InboxDatabase, executor: str) -> int:
    with psycopg.connect(database.admin_dsn) as conn:
        row = conn.execute("select count(*) from public.inbox_model_calls where executor = %s", (executor,))
        return row.fetchone()[0]  # type: ignore[index]


def _status(database: InboxDatabase, workflow_id: str) -> str | None:
    with psycopg.connect(database.admin_dsn) as conn:
        row = conn.execute("select status from dbos.workflow_status where workflow_uuid = %s", (workflow_id,))
        found = row.fetchone()
        return found[0] if found else None


async def _until(check: object, what: str, timeout: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_reply_killed_mid_turn_is_finished_elsewhere_and_posted_once(
    inbox: PostgresInbox, inbox_database: InboxDatabase
) -> None:
    with psycopg.connect(inbox_database.admin_dsn, autocommit=True) as conn:
        conn.execute(CALLS_TABLE)
    # This process only routes: the reply jobs run in the workers.
    InboxReplies(inbox, agent=support_agent(), model=EchoModel().model())
    dying, living = f"dying-{uuid.uuid4().hex[:6]}", f"living-{uuid.uuid4().hex[:6]}"
    first = await _worker(inbox_database, "hang", dying)
    second: asyncio.subprocess.Process | None = None
    try:
        tenant = new_tenant()
        message = await inbox.record_inbound(
            channel_of(tenant), thread_id="t", contact_id="ada", text="Are you there?", external_id="m1"
        )
        job = reply_job_id(message.message_id, message.seq)
        await _until(lambda: _calls(inbox_database, dying) == 1, "the first worker never called the model")
        first.send_signal(signal.SIGKILL)
        await first.wait()
        assert _status(inbox_database, job) == "PENDING"
        second = await _worker(inbox_database, "echo", living)
        await _until(lambda: _status(inbox_database, job) == "SUCCESS", "the job was never finished")
        messages = await inbox.list_messages(staff_of(tenant), message.conversation_id)
        assert [(m.author, m.body) for m in messages] == [
            ("contact", "Are you there?"),
            ("bot", "Re: Are you there?"),
        ]
        assert (_calls(inbox_database, dying), _calls(inbox_database, living)) == (1, 1)
    finally:
        for child in (first, second):
            if child is not None and child.returncode is None:
                child.send_signal(signal.SIGKILL)
                await child.wait()


async def test_a_reply_killed_after_posting_is_not_posted_again(
    inbox: PostgresInbox, inbox_database: InboxDatabase
) -> None:
    with psycopg.connect(inbox_database.admin_dsn, autocommit=True) as conn:
        conn.execute(CALLS_TABLE)
    InboxReplies(inbox, agent=support_agent(), model=EchoModel().model())
    dying, living = f"posting-{uuid.uuid4().hex[:6]}", f"living-{uuid.uuid4().hex[:6]}"
    first = await _worker(inbox_database, "post-hang", dying)
    second: asyncio.subprocess.Process | None = None
    try:
        tenant = new_tenant()
        message = await inbox.record_inbound(
            channel_of(tenant), thread_id="t", contact_id="ada", text="Hello", external_id="m1"
        )
        job = reply_job_id(message.message_id, message.seq)
        assert first.stdout is not None
        assert await asyncio.wait_for(first.stdout.readline(), 60) == b"posted\n"
        first.send_signal(signal.SIGKILL)
        await first.wait()
        second = await _worker(inbox_database, "echo", living)
        await _until(lambda: _status(inbox_database, job) == "SUCCESS", "the job was never finished")
        with psycopg.connect(inbox_database.admin_dsn) as conn:
            [(outcome,)] = conn.execute(
                "select output from dbos.workflow_output where workflow_uuid = %s", (job,)
            ).fetchall()
        assert "duplicate" in outcome
        messages = await inbox.list_messages(staff_of(tenant), message.conversation_id)
        assert [(m.author, m.body) for m in messages] == [("contact", "Hello"), ("bot", "Re: Hello")]
        # The turn was checkpointed before the post: the second worker did not call the model again.
        assert (_calls(inbox_database, dying), _calls(inbox_database, living)) == (1, 0)
    finally:
        for child in (first, second):
            if child is not None and child.returncode is None:
                child.send_signal(signal.SIGKILL)
                await child.wait()


async def test_a_reply_recovered_before_its_new_worker_started_the_inbox_waits_and_is_answered_once(
    inbox: PostgresInbox, inbox_database: InboxDatabase
) -> None:
    """A restart on the same database: the new worker's DBOS hands it the dead worker's job (and the one
    queued behind it) before its inbox has started; both wait for it and are answered, once each."""
    with psycopg.connect(inbox_database.admin_dsn, autocommit=True) as conn:
        conn.execute(CALLS_TABLE)
    InboxReplies(inbox, agent=support_agent(), model=EchoModel().model())
    dying, restarted = f"dying-{uuid.uuid4().hex[:6]}", f"restarted-{uuid.uuid4().hex[:6]}"
    first = await _worker(inbox_database, "hang", dying)
    second: asyncio.subprocess.Process | None = None
    try:
        tenant = new_tenant()
        running = await inbox.record_inbound(
            channel_of(tenant), thread_id="t", contact_id="ada", text="first", external_id="m1"
        )
        queued = await inbox.record_inbound(
            channel_of(tenant), thread_id="t", contact_id="ada", text="second", external_id="m2"
        )
        jobs = [reply_job_id(m.message_id, m.seq) for m in (running, queued)]
        await _until(lambda: _calls(inbox_database, dying) == 1, "the first worker never called the model")
        first.send_signal(signal.SIGKILL)
        await first.wait()
        assert [_status(inbox_database, job) for job in jobs] == ["PENDING", "ENQUEUED"]
        second = await _worker(inbox_database, "echo", restarted, start_delay=2.0)
        await _until(
            lambda: [_status(inbox_database, job) for job in jobs] == ["SUCCESS", "SUCCESS"],
            "the jobs were not both finished",
            timeout=30,
        )
        messages = await inbox.list_messages(staff_of(tenant), running.conversation_id)
        assert [(m.author, m.body) for m in messages] == [
            ("contact", "first"),
            ("contact", "second"),
            ("bot", "Re: first"),
            ("bot", "Re: second"),
        ]
        assert (_calls(inbox_database, dying), _calls(inbox_database, restarted)) == (1, 2)
    finally:
        for child in (first, second):
            if child is not None and child.returncode is None:
                child.send_signal(signal.SIGKILL)
                await child.wait()
