"""`persist_sessions`: a hook that copies conversations into the canonical chat tables, so a chat UI,
search or analytics read them like any other chat (seed 004, "Sessions in the chat tables").

| event                             | written                                                          |
| --------------------------------- | ---------------------------------------------------------------- |
| any, of a new conversation        | an `ai_chats` row with the id `chat_id_of(conversation_id)`      |
| `run.started`                     | an `ai_runs` row with the run's id, engine `bastion`             |
| `message.received`                | the user message in the canonical format                         |
| `message.completed`               | the assistant message, format `ai-sdk`, native: the UI message   |
| `message.deleted`                 | the chat's leaf moves back (the old branch stays in the tree)    |
| `run.completed`/`failed`/…        | the run's status, usage and end; its message's status            |

A conversation's rows belong to it: deleting the conversation deletes them (and its outbox events)
in the same transaction, and a write applies only while its conversation exists and is owned by the
event's owner and tenant (chat-table migration 0005), so a late event of a deleted conversation writes
nothing and an id used again by another user never reaches the first owner's rows.

Every write is keyed by its event (each row keeps the id of the event that wrote it last and takes
only newer ones), so a redelivered event stores nothing new — a `run.started` delivered again after
the run finished opens no second run and leaves its status alone. Conversations of anonymous users
are skipped. The hook writes as the application server (a member of `bastion_runtime`).

The hook takes its batches as outbox ids (`handle_event_ids`) and writes a batch in one statement:
the chat tables' function `bastion.persist_session_outbox` (migration 0003) reads the events from
the outbox and does all the per-event work in the database — the conversion into canonical parts
and chat ids included (`canonical_parts` and `chat_id_of` stay here for applications; the two are
tested equal) — so delivery loads no event into this process. A single event is written the same
way, by its id. The batch's writes are applied at once (migration 0004): each chat, message and run
the batch touches is written with its final state in a few statements, which store exactly what
the events applied one by one store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from bastion.hooks.events import HookEvent
from bastion.hooks.outbox import Pool, autocommit_connection
from bastion.hooks.registry import Hook, RetryPolicy, define_hook

__all__ = ["PERSIST_SESSIONS_EVENTS", "persist_sessions"]


PERSIST_SESSIONS_EVENTS: Final = frozenset(
    {
        "run.started",
        "run.waiting_for_approval",
        "run.completed",
        "run.failed",
        "run.cancelled",
        "run.interrupted",
        "message.received",
        "message.completed",
        "message.deleted",
    }
)

_WRITE: Final = "select bastion.persist_session_outbox(%s, %s, %s)"


def persist_sessions(
    pool: Pool,
    *,
    name: str = "persist_sessions",
    agent_id: str | None = None,
    title: str = "",
    retry: RetryPolicy | None = None,
) -> Hook:
    """The hook copying every conversation of a signed-in user into `ai_chats`, `ai_messages` and
    `ai_runs` (apply `apply_chat_table_migrations` first). `pool` connects as the application's role.
    It starts from the outbox's oldest event, so conversations since the hooks were installed are
    copied in full."""

    async def write(event_ids: Sequence[int]) -> None:
        if not event_ids:
            return
        async with autocommit_connection(pool) as conn:
            await conn.execute(_WRITE, (list(event_ids), agent_id, title))

    async def handle(event: HookEvent) -> None:
        await write([event.id])

    return define_hook(
        name,
        events=PERSIST_SESSIONS_EVENTS,
        handle=handle,
        handle_event_ids=write,
        retry=retry,
        start="earliest",
    )
