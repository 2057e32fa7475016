"""AI SDK UI messages in the SDK-neutral canonical message format of the chat tables.

The canonical parts are better-supabase's (`text`, `reasoning`, `file`, `tool-call`, `tool-result`,
`tool-approval`, `source`, `data`, `step`). A UI tool part becomes its call, its approval and its
result, in that order; a part with no counterpart becomes a `data` part named after its type, so
nothing is lost. The assistant's message keeps the UI message itself as its native copy.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["canonical_parts", "chat_id_of"]

_CHAT_NAMESPACE: Final = "bastion-conversation:"


def chat_id_of(conversation_id: str) -> str:
    """The chat id of a conversation: a UUID (version 8) from the SHA-256 of its id, so a client that
    knows one finds the other."""
    digest = bytearray(
        hashlib.sha256((_CHAT_NAMESPACE + str(uuid.UUID(conversation_id))).encode()).digest()[:16]
    )
    digest[6] = (digest[6] & 0x0F) | 0x80
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def canonical_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    parts = message.get("parts")
    return [converted for part in (parts if isinstance(parts, list) else ()) for converted in _convert(part)]


def _convert(part: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        yield {"type": "data", "name": "unknown", "data": part}
        return
    kind: str = part["type"]
    extra = _provider_metadata(part)
    if kind in ("text", "reasoning") and isinstance(part.get("text"), str):
        state = {"state": part["state"]} if part.get("state") in ("streaming", "done") else {}
        yield {"type": kind, "text": part["text"], **state, **extra}
    elif kind == "file" and isinstance(part.get("url"), str) and isinstance(part.get("mediaType"), str):
        name = {"filename": part["filename"]} if isinstance(part.get("filename"), str) else {}
        yield {"type": "file", "mediaType": part["mediaType"], "url": part["url"], **name, **extra}
    elif kind in ("source-url", "source-document") and isinstance(part.get("sourceId"), str):
        yield _source(part, "url" if kind == "source-url" else "document") | extra
    elif kind == "step-start":
        yield {"type": "step", "boundary": "start"}
    elif kind == "dynamic-tool" or kind.startswith("tool-"):
        yield from _tool(part, extra)
    elif kind.startswith("data-") and len(kind) > 5:
        ident = {"id": part["id"]} if isinstance(part.get("id"), str) else {}
        yield {"type": "data", "name": kind[5:], **ident, "data": part.get("data")}
    else:
        yield {"type": "data", "name": kind, "data": part}


def _source(part: dict[str, Any], source_type: str) -> dict[str, Any]:
    source: dict[str, Any] = {"type": "source", "sourceType": source_type, "id": part["sourceId"]}
    for key in ("url", "title", "mediaType"):
        if isinstance(part.get(key), str):
            source[key] = part[key]
    return source


def _tool(part: dict[str, Any], extra: dict[str, Any]) -> Iterator[dict[str, Any]]:
    name = part.get("toolName") if part["type"] == "dynamic-tool" else part["type"][len("tool-") :]
    call_id = part.get("toolCallId")
    if not isinstance(name, str) or not isinstance(call_id, str):
        yield {"type": "data", "name": part["type"], "data": part}
        return
    ids = {"toolCallId": call_id, "toolName": name}
    if "input" in part:
        executed = {"providerExecuted": True} if part.get("providerExecuted") is True else {}
        yield {"type": "tool-call", **ids, "input": part["input"], **executed, **extra}
    approval = part.get("approval")
    if isinstance(approval, dict) and isinstance(approval.get("id"), str):
        decided = approval.get("approved")
        state = "requested" if decided is None else "approved" if decided is True else "denied"
        reason = {"reason": approval["reason"]} if isinstance(approval.get("reason"), str) else {}
        yield {
            "type": "tool-approval",
            "toolCallId": call_id,
            "approvalId": approval["id"],
            "state": state,
            **reason,
        }
    outcome = part.get("state")
    if outcome == "output-available":
        yield {"type": "tool-result", **ids, "output": part.get("output")}
    elif outcome == "output-error":
        yield {"type": "tool-result", **ids, "output": part.get("errorText"), "isError": True}


def _provider_metadata(part: dict[str, Any]) -> dict[str, Any]:
    metadata = part.get("providerMetadata", part.get("callProviderMetadata"))
    return {"providerMetadata": metadata} if isinstance(metadata, dict) else {}
