"""The batch `persist_sessions` built in Python before its conversion moved into the database: the
parameters of 0002's `bastion.persist_session_events(jsonb)`, which processes of that version still
call during a rolling upgrade. The tests check that entry point still writes what the new one does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from bastion.hooks import HookEvent, canonical_parts, chat_id_of

_FINAL: Final = {
    "run.waiting_for_approval": ("waiting_for_approval", "complete"),
    "run.completed": ("completed", "complete"),
    "run.failed": ("failed", "error"),
    "run.cancelled": ("cancelled", "aborted"),
    "run.interrupted": ("interrupted", "aborted"),
}


def previous_batch(events: Sequence[HookEvent], agent_id: str | None, title: str) -> list[dict[str, Any]]:
    """The function's parameters of each signed-in event, in order; the first event of each chat also
    carries its `ai_chats` row."""
    batch: list[dict[str, Any]] = []
    chats: set[str] = set()
    for event in events:
        if not event.signed_in:
            continue
        chat = chat_id_of(event.conversation_id)
        params = _write(event)
        params |= {
            "chat": chat,
            "owner": event.user_id,
            "tenant": event.tenant_id,
            "event": event.id,
            "at": event.created_at.isoformat(),
        }
        if chat not in chats:
            chats.add(chat)
            params |= {"conversation": event.conversation_id, "agent": agent_id, "title": title}
        batch.append(params)
    return batch


def _write(event: HookEvent) -> dict[str, Any]:
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
