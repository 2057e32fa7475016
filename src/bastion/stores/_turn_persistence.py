"""The store-independent arithmetic of a turn: which rows a reconciled history changes, which events
a turn records, and how its outcome is named.

Writes are proportional to what changed: reconciliation returns the stored tail with at most its
last message changed or one user message added, so a turn adds one row, replaces one (an approval
answer or an edit) or drops the rows after an edited or regenerated message. Event data never holds
tool inputs, outputs, error text or approval reasons.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Final

from pydantic_core import to_jsonable_python

from bastion.approvals import CanRespondToApproval
from bastion.history import reconcile_agent_messages
from bastion.persistence import AgentPersistence, RunInput, RunStatus, ToolOperation
from bastion.stores.entities import TurnContext, TurnState, check_text, is_storable_text
from bastion.stores.errors import (
    InvalidInputError,
    ToolOperationConflictError,
    ToolOperationMismatchError,
    ToolOperationUncertainError,
)

__all__ = [
    "MAX_TITLE",
    "CheckedOperation",
    "HistoryWrites",
    "TurnPersistence",
    "approval_request_events",
    "approval_response_events",
    "browser_message_ids",
    "canonical_json",
    "check_response",
    "check_storable_message",
    "check_title",
    "json_value",
    "pending_approval_ids",
    "plan_history_writes",
    "recordable",
    "replayed_result",
    "run_event",
    "run_status",
]


@dataclass(frozen=True, slots=True)
class HistoryWrites:
    """Delete stored rows after `truncate_after` (if set), then write each `{seq, message, replace}`."""

    truncate_after: int | None
    writes: list[dict[str, Any]]


def plan_history_writes(
    tail: Sequence[tuple[int, dict[str, Any]]], result: Sequence[dict[str, Any]], *, last_seq: int
) -> HistoryWrites:
    """Turn a reconciled history into row changes; `tail` is the stored rows it was reconciled with."""
    same = 0
    while same < len(tail) and same < len(result) and _same(result[same], tail[same][1]):
        same += 1
    writes: list[dict[str, Any]] = []
    truncate_after: int | None
    if same < len(tail) and same < len(result) and result[same].get("id") == tail[same][1].get("id"):
        seq = tail[same][0]
        writes.append({"seq": seq, "message": result[same], "replace": True})
        truncate_after, next_seq, rest = seq, seq + 1, result[same + 1 :]
    elif same < len(tail):
        truncate_after, next_seq, rest = tail[same][0] - 1, tail[same][0], result[same:]
    else:
        truncate_after, next_seq, rest = None, last_seq + 1, result[same:]
    writes.extend(
        {"seq": next_seq + offset, "message": message, "replace": False}
        for offset, message in enumerate(rest)
    )
    for write in writes:
        check_storable_message(write["message"])
    if truncate_after is not None and truncate_after >= last_seq:
        truncate_after = None
    return HistoryWrites(truncate_after, writes)


def approval_response_events(
    tail: Sequence[tuple[int, dict[str, Any]]], result: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`approval.responded` for each tool part the reconciled history answered (no reasons)."""
    if not tail or not result or result[-1].get("id") != tail[-1][1].get("id"):
        return []
    stored = {part.get("toolCallId"): part for part in _tool_parts(tail[-1][1])}
    events = []
    for part in _tool_parts(result[-1]):
        before = stored.get(part.get("toolCallId"))
        if before is None or before.get("state") != "approval-requested":
            continue
        if part.get("state") != "approval-responded":
            continue
        approval = part.get("approval") or {}
        data = _tool_data(part) | {"approvalId": approval.get("id"), "approved": approval.get("approved")}
        events.append({"type": "approval.responded", "data": data})
    return events


def pending_approval_ids(messages: Sequence[dict[str, Any]]) -> frozenset[str]:
    """Approval ids still waiting in the latest message, so finishing does not announce them again."""
    if not messages:
        return frozenset()
    return frozenset(
        approval_id
        for part in _tool_parts(messages[-1])
        if part.get("state") == "approval-requested"
        and isinstance(approval_id := (part.get("approval") or {}).get("id"), str)
    )


def approval_request_events(message: dict[str, Any] | None, *, known: frozenset[str]) -> list[dict[str, Any]]:
    """`approval.requested` for each approval the response asks for that was not pending before."""
    if message is None:
        return []
    events = []
    for part in _tool_parts(message):
        approval = part.get("approval") or {}
        if part.get("state") == "approval-requested" and approval.get("id") not in known:
            data = _tool_data(part) | {"approvalId": approval.get("id")}
            events.append({"type": "approval.requested", "data": data})
    return events


def run_status(status: RunStatus, message: dict[str, Any] | None) -> str:
    """A completed run whose response waits for an approval is `waiting_for_approval`."""
    waiting = message is not None and any(
        part.get("state") == "approval-requested" for part in _tool_parts(message)
    )
    return "waiting_for_approval" if status == "completed" and waiting else status


def _tool_parts(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    parts = message.get("parts")
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if isinstance(kind, str) and (kind == "dynamic-tool" or kind.startswith("tool-")):
            yield part


def _tool_data(part: dict[str, Any]) -> dict[str, Any]:
    kind = part["type"]
    name = part.get("toolName") if kind == "dynamic-tool" else kind[len("tool-") :]
    return {"toolCallId": part.get("toolCallId"), "toolName": name}


def _same(left: Any, right: Any) -> bool:
    """JSON equality: unlike `==`, `true`, `1` and `1.0` differ."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same(item, right[key]) for key, item in left.items())
    if isinstance(left, list):
        return len(left) == len(right) and all(map(_same, left, right))
    return bool(left == right)


# Checks and shapes shared by the stores.

MAX_TITLE: Final = 500


def canonical_json(value: Any) -> str:
    """JSON text with sorted keys, so equal inputs compare equal as text (`1` and `1.0` differ)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def json_value(value: Any) -> Any:
    """`value` as plain JSON that every store accepts (no NaN, no NUL), or `InvalidInputError`."""
    try:
        plain = to_jsonable_python(value)
        text = json.dumps(plain, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        raise InvalidInputError() from None
    if "\\u0000" in text or not is_storable_text(text):
        raise InvalidInputError()
    return plain


def check_response(message: Any) -> None:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise InvalidInputError()
    if not isinstance(message.get("parts"), list):
        raise InvalidInputError()
    check_storable_message(message)


def browser_message_ids(messages: Sequence[Any]) -> list[str]:
    """The ids the browser names, to load the stored tail they cover; reconciliation checks the rest."""
    if not isinstance(messages, list | tuple):
        return []
    ids = (message.get("id") for message in messages if isinstance(message, dict))
    return [
        value for value in ids if isinstance(value, str) and 0 < len(value) <= 200 and is_storable_text(value)
    ]


def check_title(title: object) -> None:
    if title is not None and (
        not isinstance(title, str) or len(title) > MAX_TITLE or not is_storable_text(title)
    ):
        raise InvalidInputError()


def check_storable_message(message: dict[str, Any]) -> None:
    """A message a turn is about to store: an id the tables accept and JSON Postgres can hold.

    Reconciliation decides what a browser may write; this refuses what cannot be stored (a NUL or a
    lone surrogate in a text or an approval reason, an id over 200 characters) as `InvalidInputError`
    before anything is written. Every store runs it; an application that creates a conversation
    before its first turn runs it first, so a refused message leaves no empty conversation.
    """
    check_text(message.get("id"))
    if json_value(message) != message:
        raise InvalidInputError()


def run_event(run_id: str, status: str, message: dict[str, Any] | None = None) -> dict[str, Any]:
    """`run.<status>`; a finished run's event carries the token usage its response reported, if any."""
    data: dict[str, Any] = {"runId": run_id, "status": status}
    metadata = message.get("metadata") if message is not None else None
    if isinstance(metadata, dict) and _is_usage(metadata.get("usage")):
        data["usage"] = metadata["usage"]
        requests = metadata.get("requestUsage")
        if isinstance(requests, list) and all(_is_usage(request) for request in requests):
            data["requestUsage"] = requests
    return {"type": f"run.{status}", "data": data}


_USAGE_KEYS: Final = frozenset({"inputTokens", "outputTokens", "totalTokens"})


def _is_usage(value: Any) -> bool:
    """The shape the stream's finish metadata gives usage (`usage_metadata=True`)."""
    return (
        isinstance(value, dict)
        and set(value) == _USAGE_KEYS
        and all(type(count) is int and count >= 0 for count in value.values())
    )


def replayed_result(result: dict[str, Any], name: str, tool_input: Any) -> Any:
    """A call this process ran earlier in the same run, not yet recorded: the same rules as stored ones."""
    if result["toolName"] != name or canonical_json(result["input"]) != canonical_json(tool_input):
        raise ToolOperationMismatchError()
    if result["status"] != "completed":
        raise ToolOperationUncertainError()
    return result["output"]


@dataclass(frozen=True, slots=True)
class CheckedOperation:
    """An operation's fields as the stores write them: checked text and plain JSON input."""

    key: str
    name: str
    call_id: str
    input: Any
    idempotent: bool


class TurnPersistence(AgentPersistence[TurnContext, TurnState]):
    """What both stores' persistence does the same way: settings, reconciliation, and running a claimed
    tool call so that its result is recorded (failed unless it completed) with the run's next write."""

    def __init__(
        self,
        *,
        history_window: int,
        lease_seconds: float,
        can_respond_to_approval: CanRespondToApproval[TurnContext] | None,
    ) -> None:
        if type(history_window) is not int or history_window < 1:
            raise ValueError("history_window must be a positive integer.")
        if not 0 <= lease_seconds <= 86_400:
            raise ValueError("lease_seconds must be between 0 and 86400.")
        self._window = history_window
        self._lease_seconds = float(lease_seconds)
        self._can_respond = can_respond_to_approval

    async def _reconcile(
        self, previous: list[dict[str, Any]], input: RunInput, context: TurnContext
    ) -> list[dict[str, Any]]:
        if self._can_respond is None:
            return await reconcile_agent_messages(previous, input.messages, trigger=input.trigger)
        return await reconcile_agent_messages(
            previous,
            input.messages,
            trigger=input.trigger,
            context=context,
            can_respond_to_approval=self._can_respond,
        )

    @staticmethod
    def _checked_operation(state: TurnState, operation: ToolOperation) -> CheckedOperation:
        """The operation as stored; an operation already running in this run is a conflict."""
        checked = CheckedOperation(
            key=check_text(operation.key),
            name=check_text(operation.name),
            call_id=check_text(operation.tool_call_id),
            input=json_value(operation.input),
            idempotent=operation.idempotent is True,
        )
        if checked.key in state.running_tool_calls:
            raise ToolOperationConflictError()
        return checked

    @staticmethod
    def _replayed(state: TurnState, operation: CheckedOperation) -> tuple[bool, Any]:
        """This run's earlier result for the operation, not yet written to the store, if it decides:
        `(True, output)` to replay; `(False, None)` to ask the store (nothing earlier, or an
        idempotent operation that did not complete and may run again)."""
        earlier = next(
            (result for result in state.unrecorded_results if result["operationKey"] == operation.key), None
        )
        if earlier is None or (operation.idempotent and earlier["status"] != "completed"):
            return False, None
        return True, replayed_result(earlier, operation.name, operation.input)

    async def _execute(self, state: TurnState, operation: ToolOperation, checked: CheckedOperation) -> Any:
        """Run the claimed side effect; its result is recorded with this run's next write."""
        record = {
            "operationKey": checked.key,
            "toolName": checked.name,
            "input": checked.input,
            "status": "failed",
            "output": None,
        }
        try:
            value = await operation.execute()
        except BaseException:
            state.unrecorded_results.append(record)
            raise
        finally:
            state.running_tool_calls.discard(checked.key)
        # A result that cannot be stored cannot be replayed: it stays recorded as failed, never rerun.
        with suppress(InvalidInputError):
            record |= {"status": "completed", "output": json_value(value)}
        state.unrecorded_results.append(record)
        return value


def recordable(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The part of this run's unrecorded results the store writes."""
    return [{key: result[key] for key in ("operationKey", "status", "output")} for result in results]
