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

A batch is written in one statement, one round trip: the hook turns each event into its parameters
(the canonical conversion stays here) and the chat tables' function `bastion.persist_session_events`
(migration 0002) applies them event by event, in order, with the guards above.
"""

from __future__ import annotations

import functools
import json
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

_WRITE: Final = "select bastion.persist_session_events(%s)"

# The batch's JSON as compact as the encoder makes it (parsed from JSON, it holds no cycles).
_dumps: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode

# A conversation's chat id, hashed once while it stays among the recent ones rather than once per event.
_chat_id: Final = functools.lru_cache(maxsize=4096)(chat_id_of)


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
        batch = _batch(events, agent_id, title)
        if not batch:
            return
        async with pool.connection() as conn:
            if not conn.autocommit:
                await conn.set_autocommit(True)
            await conn.execute(_WRITE, (Jsonb(batch, dumps=_dumps),))

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


def _batch(events: Sequence[HookEvent], agent_id: str | None, title: str) -> list[dict[str, Any]]:
    """The function's parameters of each signed-in event, in order; the first event of each chat also
    carries its `ai_chats` row."""
    batch: list[dict[str, Any]] = []
    chats: set[str] = set()
    for event in events:
        if not event.signed_in:
            continue
        conversation = event.conversation_id
        chat = _chat_id(conversation)
        params = _write(event)
        params["chat"] = chat
        params["owner"] = event.user_id
        params["tenant"] = event.tenant_id
        params["event"] = event.id
        params["at"] = event.created_at.isoformat()
        if chat not in chats:
            chats.add(chat)
            params["conversation"] = conversation
            params["agent"] = agent_id
            params["title"] = title
        batch.append(params)
    return batch


def _write(event: HookEvent) -> dict[str, Any]:
    """What the event writes (`write`, null for nothing) and the parameters of that write."""
    data = event.data
    kind = event.type
    if kind == "run.started":
        return {"write": "run_started", "run": event.run_id} if event.run_id else {"write": None}
    final = _FINAL.get(kind)
    if final is not None:
        run_id = data.get("runId") or event.run_id
        if not isinstance(run_id, str):
            return {"write": None}
        usage = data.get("usage")
        return {
            "write": "run_finished",
            "run": run_id,
            "status": final[0],
            "message_status": final[1],
            "usage": usage if isinstance(usage, dict) else {},
        }
    if kind == "message.deleted":
        return {"write": "deleted", "id": data.get("messageId"), "parent": data.get("parentId")}
    message = data.get("message")
    if not isinstance(message, dict):
        return {"write": None}
    assistant = data.get("role") == "assistant"
    metadata = message.get("metadata")
    return {
        "write": "message",
        "id": data.get("messageId"),
        "parent": data.get("parentId"),
        "role": "assistant" if assistant else "user",
        "parts": canonical_parts(message),
        "format": "ai-sdk" if assistant else "canonical",
        "native": message if assistant else None,
        "metadata": metadata if isinstance(metadata, dict) else {},
        "run": event.run_id,
    }
