"""The bot's replies on DBOS: one durable job per contact message, one at a time per conversation.

A contact message in a bot-mode conversation enqueues `bastion.inbox.reply` in the transaction that
stores it (`dbos.enqueue_workflow`), on a queue partitioned by conversation with a partition
concurrency of 1. The workflow id is derived from the message (`inbox.reply:<seq>:<message id>`), so a
redelivered message or a retried job is the same work, never a second one.

Messages that arrive while a reply runs are answered **in order, one reply each**: every job answers its
own message from the conversation as it stood up to that message (earlier bot replies included), so the
replies follow the messages and a retried job sees the same history. The queue runs the jobs of one
conversation in the order their messages were stored (ties broken by the message's position).

The workflow's steps: load what the job may answer (as the contact; nothing if the conversation is with
a human or changed mode since the message), run the agent as the contact, post the reply as the bot
(once: a retried step finds it posted). A job that fails for any reason (a model error, a connection
that needs a user's authorization, a step that ran out of attempts) posts nothing and hands the
conversation to staff with the reason, so the contact is never left waiting on a bot that cannot
answer.

A job recovered or dequeued while its process is still starting waits for the process's
`InboxReplies` to start (`bastion.durable._ready`) rather than failing.

The jobs run on the loop that launched the `DurableEngine`, where the application's pool, model clients
and connections live.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal, ParamSpec, TypeAlias, TypeVar

from bastion._extras import missing_extra

try:
    import psycopg
    from dbos import DBOS
except ImportError as error:
    raise missing_extra("bastion.inbox", "durable", error) from error

from pydantic_ai.models import KnownModelName, Model

from bastion.agent import Agent
from bastion.durable import DURABLE_APPLICATION_VERSION, DURABLE_SCHEMA, DurableEngine
from bastion.durable._ready import REGISTRATION_WAIT_SECONDS, registered
from bastion.durable.engine import DEFAULT_APPLICATION_NAME
from bastion.inbox.bot_turn import InboxTurn, answer_as_contact
from bastion.inbox.principal import ContactPrincipal
from bastion.inbox.store import PostgresInbox
from bastion.stores.postgres import Connection

__all__ = ["REPLY_QUEUE", "REPLY_WORKFLOW", "InboxReplies", "JobOutcome", "reply_job_id"]

logger = logging.getLogger("bastion.inbox")


REPLY_QUEUE: Final = "bastion.inbox.replies"
REPLY_WORKFLOW: Final = "bastion.inbox.reply"
JobOutcome: TypeAlias = Literal["posted", "duplicate", "dropped", "silent", "failed"]
"""`silent`: the agent answered with no text (it only handed off, say); `failed`: see the module."""

_ENQUEUE: Final = f"""
select {DURABLE_SCHEMA}.enqueue_workflow(
  %s, %s, array[%s::json, %s::json, %s::json, %s::json], '{{}}'::json,
  workflow_id => %s, app_version => %s, queue_partition_key => %s, application_name => %s
)
"""

# A step that fails is tried again after a durable pause (from 1 s, doubling up to a minute): for as long
# as the database is unreachable, and up to `_ATTEMPTS` times for any other error.
_ATTEMPTS: Final = 3
_FIRST_PAUSE: Final = 1.0
_LONGEST_PAUSE: Final = 60.0
_running: InboxReplies | None = None
P = ParamSpec("P")
R = TypeVar("R")


def reply_job_id(message_id: str, seq: int) -> str:
    """The reply job of a message: the same for every delivery of it, ordered like the messages."""
    return f"inbox.reply:{seq:019d}:{message_id}"


class InboxReplies:
    """Answers contact messages with `agent` (an `Agent[InboxTurn]`) on `model`, as a `ReplyRouter`.

    `await replies.start(engine)` registers the queue on this process's `DurableEngine` (launched after
    this module was imported, so DBOS knows the workflow) and makes this process run the jobs; only
    one `InboxReplies` runs per process, as DBOS does. Without `start`, it still routes: the jobs wait
    in the queue for a process that runs them.
    """

    def __init__(
        self,
        inbox: PostgresInbox,
        *,
        agent: Agent[InboxTurn],
        model: Model | KnownModelName | str,
        application_name: str = DEFAULT_APPLICATION_NAME,
    ) -> None:
        self.inbox = inbox
        self.agent = agent
        self.model = model
        self._application_name = application_name
        inbox.router = self

    async def start(self, engine: DurableEngine) -> None:
        global _running
        if _running is not None and _running is not self:
            raise RuntimeError("Another InboxReplies already runs the inbox's jobs in this process.")
        await engine.register_queue(REPLY_QUEUE, partition_concurrency=1)
        _running = self

    def stop(self) -> None:
        global _running
        if _running is self:
            _running = None

    async def route(self, conn: Connection, contact: ContactPrincipal, message_id: str, *, seq: int) -> None:
        """Enqueue the message's reply job in the caller's transaction (see `ReplyRouter`)."""
        arguments = [contact.tenant_id, contact.contact_id, contact.conversation_id, message_id]
        await conn.execute(
            _ENQUEUE,
            (
                REPLY_WORKFLOW,
                REPLY_QUEUE,
                *(json.dumps(value) for value in arguments),
                reply_job_id(message_id, seq),
                DURABLE_APPLICATION_VERSION,
                contact.conversation_id,
                self._application_name,
            ),
        )

    async def turn_text(self, contact: ContactPrincipal, job_id: str, history: list[dict[str, Any]]) -> str:
        turn = InboxTurn(principal=contact, job_id=job_id, inbox=self.inbox)
        return await answer_as_contact(self.agent, turn=turn, model=self.model, history=history)


async def _replies() -> InboxReplies:
    """This process's `InboxReplies`, waiting for it while the process starts."""
    replies = await registered(lambda: _running)
    if replies is None:
        raise RuntimeError(
            f"No InboxReplies was started in this process within {REGISTRATION_WAIT_SECONDS:.0f} s: "
            "start it in every process that launches the durable engine."
        )
    return replies


def _contact(tenant_id: str, contact_id: str, conversation_id: str) -> ContactPrincipal:
    return ContactPrincipal(tenant_id=tenant_id, contact_id=contact_id, conversation_id=conversation_id)


@DBOS.step(name="bastion.inbox.reply.load")
async def _load(
    tenant_id: str, contact_id: str, conversation_id: str, message_id: str, job_id: str
) -> list[dict[str, Any]] | None:
    """The history the job answers from, or None when it may not answer."""
    contact = _contact(tenant_id, contact_id, conversation_id)
    replies = await _replies()
    job = await replies.inbox.reply_job(contact, message_id, job_id=job_id)
    return job.history if job.answerable else None


@DBOS.step(name="bastion.inbox.reply.turn")
async def _turn(
    tenant_id: str, contact_id: str, conversation_id: str, job_id: str, history: list[dict[str, Any]]
) -> dict[str, str]:
    """The agent's reply (`text`), or why it could not answer (`failure`): never raised, so the
    workflow can hand the conversation to staff."""
    contact = _contact(tenant_id, contact_id, conversation_id)
    try:
        replies = await _replies()
        return {"text": await replies.turn_text(contact, job_id, history)}
    except Exception as error:
        code = getattr(error, "code", None)
        logger.warning("The inbox's bot turn %s failed.", job_id, exc_info=True)
        return {"failure": code if isinstance(code, str) and code.isidentifier() else "turn_failed"}


@DBOS.step(name="bastion.inbox.reply.post")
async def _post(
    tenant_id: str, contact_id: str, conversation_id: str, message_id: str, job_id: str, text: str
) -> str:
    contact = _contact(tenant_id, contact_id, conversation_id)
    replies = await _replies()
    return await replies.inbox.post_bot_reply(contact, message_id, text, job_id=job_id)


@DBOS.step(name="bastion.inbox.reply.handoff")
async def _handoff(tenant_id: str, contact_id: str, conversation_id: str, job_id: str, failure: str) -> None:
    contact = _contact(tenant_id, contact_id, conversation_id)
    replies = await _replies()
    reason = f"The bot could not answer ({failure})."
    await replies.inbox.request_handoff(contact, reason, job_id=job_id)


@DBOS.workflow(name=REPLY_WORKFLOW)
async def _reply(tenant_id: str, contact_id: str, conversation_id: str, message_id: str) -> str:
    job_id = DBOS.workflow_id
    assert job_id is not None
    ids = (tenant_id, contact_id, conversation_id)
    try:
        history = await _persisting(_load, *ids, message_id, job_id)
        if history is None:
            return "dropped"
        answer = await _turn(*ids, job_id, history)
        if "failure" not in answer:
            if not answer["text"]:
                return "silent"
            return await _persisting(_post, *ids, message_id, job_id, answer["text"])
        failure = answer["failure"]
    except Exception:
        # A step out of attempts: the job still ends in the hand-off, never silently.
        logger.warning("The inbox's reply job %s failed.", job_id, exc_info=True)
        failure = "reply_failed"
    await _persisting(_handoff, *ids, job_id, failure)
    return "failed"


async def _persisting(step: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs) -> R:
    """Run a step until it succeeds, with a durable pause before each new try: as long as the database
    cannot be reached, `_ATTEMPTS` tries in all for any other error (then raises). Each try is a
    recorded step, so a job run again after a crash takes the same path."""
    pause, failures = _FIRST_PAUSE, 0
    while True:
        try:
            return await step(*args, **kwargs)
        except psycopg.OperationalError:
            logger.warning("An inbox reply job could not reach the database; trying again.", exc_info=True)
        except Exception:
            failures += 1
            if failures >= _ATTEMPTS:
                raise
        await DBOS.sleep_async(pause)
        pause = min(pause * 2, _LONGEST_PAUSE)
