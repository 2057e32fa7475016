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

Every write is keyed by its event (each row keeps the id of the event that wrote it last and takes
only newer ones), so a redelivered event stores nothing new — a `run.started` delivered again after
the run finished opens no second run and leaves its status alone. Conversations of anonymous users
are skipped. The hook writes as the application server (a member of `bastion_runtime`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from bastion.hooks.canonical import canonical_parts, chat_id_of
from bastion.hooks.events import HookEvent
from bastion.hooks.registry import Hook, RetryPolicy, define_hook

__all__ = ["PERSIST_SESSIONS_EVENTS", "persist_sessions"]

Pool: TypeAlias = AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]]

_FINAL: Final = {
    "run.waiting_for_approval": ("waiting_for_approval", "complete"),
    "run.completed": ("completed", "complete"),
    "run.failed": ("failed", "error"),
    "run.cancelled": ("cancelled", "aborted"),
    "run.interrupted": ("interrupted", "aborted"),
}

PERSIST_SESSIONS_EVENTS: Final = frozenset(
    {"run.started", "message.received", "message.completed", "message.deleted", *_FINAL}
)

_CHAT: Final = """
insert into bastion.ai_chats (id, conversation_id, owner_id, tenant_id, agent_id, title, last_message_at)
values (%s, %s, %s, %s, %s, %s, %s)
on conflict (id) do nothing
"""

_RUN_STARTED: Final = """
with opened as (
  insert into bastion.ai_runs (id, chat_id, owner_id, tenant_id, event_id, started_at)
  values (%(run)s, %(chat)s, %(owner)s, %(tenant)s, %(event)s, %(at)s)
  on conflict (id) do nothing
  returning id
)
update bastion.ai_chats c set active_run_id = o.id, updated_at = now()
  from opened o
 where c.id = %(chat)s
"""

_RUN_FINISHED: Final = """
with settled as (
  insert into bastion.ai_runs
    (id, chat_id, owner_id, tenant_id, status, usage, event_id, started_at, ended_at)
  values (%(run)s, %(chat)s, %(owner)s, %(tenant)s, %(status)s, %(usage)s, %(event)s, %(at)s, %(at)s)
  on conflict (id) do update
     set status = excluded.status, usage = excluded.usage, event_id = excluded.event_id,
         ended_at = excluded.ended_at
   where bastion.ai_runs.event_id < excluded.event_id
  returning id, assistant_message_id
),
message as (
  update bastion.ai_messages m set status = %(message_status)s, updated_at = now()
    from settled s
   where m.chat_id = %(chat)s and m.id = s.assistant_message_id
)
update bastion.ai_chats c set active_run_id = null, updated_at = now()
  from settled s
 where c.id = %(chat)s and c.active_run_id = s.id
"""

_MESSAGE: Final = """
with written as (
  insert into bastion.ai_messages
    (chat_id, id, parent_id, owner_id, tenant_id, role, parts, format, native, metadata, run_id, event_id,
     created_at)
  values (%(chat)s, %(id)s, %(parent)s, %(owner)s, %(tenant)s, %(role)s, %(parts)s, %(format)s, %(native)s,
          %(metadata)s, %(run)s, %(event)s, %(at)s)
  on conflict (chat_id, id) do update
     set parent_id = excluded.parent_id, parts = excluded.parts, native = excluded.native,
         metadata = excluded.metadata, run_id = coalesce(excluded.run_id, bastion.ai_messages.run_id),
         event_id = excluded.event_id, updated_at = now()
   where bastion.ai_messages.event_id < excluded.event_id
  returning id
),
run as (
  update bastion.ai_runs r set assistant_message_id = w.id
    from written w
   where %(role)s = 'assistant' and r.id = %(run)s
)
update bastion.ai_chats c
   set current_leaf_id = %(id)s, leaf_event_id = %(event)s, last_message_at = %(at)s, updated_at = now()
 where c.id = %(chat)s and c.leaf_event_id < %(event)s
"""

_DELETED: Final = """
update bastion.ai_chats c set current_leaf_id = %(parent)s, leaf_event_id = %(event)s, updated_at = now()
 where c.id = %(chat)s and c.current_leaf_id = %(id)s and c.leaf_event_id < %(event)s
"""


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

    async def write(events: Sequence[HookEvent]) -> None:
        signed_in = [event for event in events if event.signed_in]
        if not signed_in:
            return
        chats: set[str] = set()
        async with pool.connection() as conn:
            if not conn.autocommit:
                await conn.set_autocommit(True)
            async with conn.transaction(), conn.pipeline():
                for event in signed_in:
                    chat = chat_id_of(event.conversation_id)
                    if chat not in chats:
                        chats.add(chat)
                        await conn.execute(
                            _CHAT,
                            (
                                chat,
                                event.conversation_id,
                                event.user_id,
                                event.tenant_id,
                                agent_id,
                                title,
                                event.created_at,
                            ),
                        )
                    statement, extra = _write(event)
                    if statement is not None:
                        params = {
                            "chat": chat,
                            "owner": event.user_id,
                            "tenant": event.tenant_id,
                            "event": event.id,
                            "at": event.created_at,
                        }
                        await conn.execute(statement, params | extra)

    async def handle(event: HookEvent) -> None:
        await write([event])

    return define_hook(
        name,
        events=PERSIST_SESSIONS_EVENTS,
        handle=handle,
        handle_batch=write,
        retry=retry,
        start="earliest",
    )


def _write(event: HookEvent) -> tuple[str | None, dict[str, Any]]:
    data = event.data
    if event.type == "run.started":
        return (_RUN_STARTED, {"run": event.run_id}) if event.run_id else (None, {})
    if event.type in _FINAL:
        run_id = data.get("runId") or event.run_id
        if not isinstance(run_id, str):
            return None, {}
        status, message_status = _FINAL[event.type]
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return _RUN_FINISHED, {
            "run": run_id,
            "status": status,
            "message_status": message_status,
            "usage": Jsonb(usage),
        }
    if event.type == "message.deleted":
        return _DELETED, {"id": data.get("messageId"), "parent": data.get("parentId")}
    message = data.get("message")
    if not isinstance(message, dict):
        return None, {}
    assistant = data.get("role") == "assistant"
    metadata = message.get("metadata")
    return _MESSAGE, {
        "id": data.get("messageId"),
        "parent": data.get("parentId"),
        "role": "assistant" if assistant else "user",
        "parts": Jsonb(canonical_parts(message)),
        "format": "ai-sdk" if assistant else "canonical",
        "native": Jsonb(message) if assistant else None,
        "metadata": Jsonb(metadata if isinstance(metadata, dict) else {}),
        "run": event.run_id,
    }
