"""Reconciling the messages a browser sends with the server's stored, canonical conversation.

The browser's copy of a conversation is never trusted: not its tool inputs, outputs or approval ids,
not its assistant messages. `reconcile_agent_messages` accepts only what a user can legitimately do
and returns the history to run, built from the stored messages:

- **Send** (`submit-message`): a new user message (text and file parts only) after a window of the
  stored history. The window is any run of stored messages reaching the end of the history,
  unchanged: the AI SDK client resends the whole list, a lighter transport may send only the new
  message.
- **Edit or resend** (`submit-message`): the window ends at a stored user message, changed (an edit,
  same rules as a new message) or unchanged. The stored messages after it are dropped.
- **Regenerate** (`regenerate-message`): the AI SDK drops the assistant message being regenerated and
  everything after it, and sends the rest. The window must end at an unchanged stored user message;
  the stored messages after it are dropped. Nothing may be added, edited or approved.
- **Answer approvals** (`submit-message`): the window ends at the latest stored message, an assistant
  message whose tool parts may move from `approval-requested` to `approval-responded` with
  `approval: {"id": <stored id>, "approved": <bool>, "reason"?: <str>}`, everything else unchanged
  (other stored approval fields may be echoed unchanged or left out; the stored ones are kept).
  A message already holding a response may be resent as it is (retrying a continuation).

Anything else raises `AgentHistoryConflictError` (409: the browser's copy is stale or forged) before
any callback runs. A request that is malformed whatever is stored (a trigger or role that is not one
of the names, a message without a string id or a `parts` list) and a new or edited user message that
breaks the rules below raise its subclass `AgentMessagesInvalidError` instead: 400 `invalid_input`,
naming the field (`messages[0].parts[1].text`) and the rule. New user messages carry only `id`, `role`
and a non-empty `parts` of text and file parts: browser-chosen metadata or provider fields would
become canonical history, so they are refused. Equality is JSON equality (`1`, `1.0` and `true`
differ).

Then `can_respond_to_approval(context, decision)` runs once per changed decision. Without it,
approvals are accepted, and the caller must enforce that the responder owns the conversation.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final, NoReturn, TypeVar, overload

from bastion.approvals import ApprovalDecision, CanRespondToApproval, authorize_approval_decision
from bastion.errors import BastionError

__all__ = [
    "REGENERATE_MESSAGE",
    "SUBMIT_MESSAGE",
    "AgentHistoryConflictError",
    "AgentMessagesInvalidError",
    "check_agent_messages",
    "check_trigger",
    "reconcile_agent_messages",
]

Context = TypeVar("Context")

SUBMIT_MESSAGE: Final = "submit-message"
REGENERATE_MESSAGE: Final = "regenerate-message"
_TRIGGERS: Final = frozenset({SUBMIT_MESSAGE, REGENERATE_MESSAGE})

_ROLES: Final = frozenset({"user", "assistant"})
_NEW_USER_MESSAGE_KEYS: Final = frozenset({"id", "role", "parts"})
_TEXT_PART_KEYS: Final = frozenset({"type", "text"})
_FILE_PART_KEYS: Final = frozenset({"type", "mediaType", "url", "filename"})
_APPROVAL_ANSWER_KEYS: Final = ("approved", "reason")
_TOOL_STATE_KEYS: Final = ("state", "approval")


class AgentHistoryConflictError(BastionError):
    """The browser's messages are not a legitimate next step from the stored conversation."""

    code: ClassVar[str] = "history_conflict"
    status: ClassVar[int] = 409

    def __init__(self, message: str = "The conversation changed. Reload it before continuing.") -> None:
        super().__init__(message)


class AgentMessagesInvalidError(AgentHistoryConflictError):
    """The browser's messages are malformed: `field` names the value, the message the rule it breaks.

    A subclass of the conflict, so code that refuses any illegitimate window still catches it; its
    status is 400 because reloading would not help: the request itself is wrong.
    """

    code: ClassVar[str] = "invalid_input"
    status: ClassVar[int] = 400

    def __init__(self, field: str, rule: str) -> None:
        BastionError.__init__(self, f"{field} {rule}.", field=field)


@overload
async def reconcile_agent_messages(
    previous: Sequence[dict[str, Any]],
    incoming: Sequence[Any],
    *,
    trigger: str,
    context: Context,
    can_respond_to_approval: CanRespondToApproval[Context],
) -> list[dict[str, Any]]: ...


@overload
async def reconcile_agent_messages(
    previous: Sequence[dict[str, Any]],
    incoming: Sequence[Any],
    *,
    trigger: str,
    context: object = None,
    can_respond_to_approval: None = None,
) -> list[dict[str, Any]]: ...


async def reconcile_agent_messages(
    previous: Sequence[dict[str, Any]],
    incoming: Sequence[Any],
    *,
    trigger: str,
    context: Any = None,
    can_respond_to_approval: CanRespondToApproval[Any] | None = None,
) -> list[dict[str, Any]]:
    """Return the canonical history to run: new lists and dicts, the arguments left untouched.

    `previous` is the stored conversation, `incoming` the browser's messages (any JSON), `trigger`
    the AI SDK's request trigger. Run it inside the transaction that claims the turn, so the stored
    history cannot change between the check and the run.

    Raises `AgentHistoryConflictError` for anything but the moves listed in the module docstring,
    before any callback. Then each new approval decision goes to `can_respond_to_approval`
    (`AgentApprovalAuthorizationError` unless it returns `True`). With no policy, approvals are
    accepted: the caller must already have checked that the responder owns the conversation.
    """
    check_trigger(trigger)
    positions = _stored_positions(previous)
    window = _in_stored_shape_all(check_agent_messages(incoming))
    history, decisions = _reconcile(previous, positions, window, trigger)
    if can_respond_to_approval is not None:
        for decision in decisions:
            await authorize_approval_decision(
                decision, context=context, can_respond_to_approval=can_respond_to_approval
            )
    return history


def _conflict() -> NoReturn:
    raise AgentHistoryConflictError()


def _stored_positions(previous: Sequence[dict[str, Any]]) -> dict[str, int]:
    positions: dict[str, int] = {}
    for index, message in enumerate(previous):
        message_id = message.get("id") if isinstance(message, dict) else None
        if not isinstance(message_id, str) or message_id in positions:
            _conflict()
        positions[message_id] = index
    return positions


def check_trigger(trigger: object) -> str:
    """The AI SDK trigger, or `AgentMessagesInvalidError` naming `trigger`."""
    if not isinstance(trigger, str) or trigger not in _TRIGGERS:
        raise AgentMessagesInvalidError("trigger", f"must be '{SUBMIT_MESSAGE}' or '{REGENERATE_MESSAGE}'")
    return trigger


def check_agent_messages(incoming: object) -> list[dict[str, Any]]:
    """The browser's messages if their shape is one reconciliation reads, whatever is stored.

    A non-empty list of objects, each with a unique non-empty string `id`, a `role` of `user` or
    `assistant` and a `parts` list of objects with a string `type`. Anything else is
    `AgentMessagesInvalidError` naming the first field at fault (`messages[2].role`).
    """
    if not isinstance(incoming, list | tuple) or not incoming:
        raise AgentMessagesInvalidError("messages", "must be a non-empty list of UI messages")
    seen: set[str] = set()
    for index, message in enumerate(incoming):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise AgentMessagesInvalidError(where, "must be an object")
        message_id, role, parts = message.get("id"), message.get("role"), message.get("parts")
        if not isinstance(message_id, str) or not message_id:
            raise AgentMessagesInvalidError(f"{where}.id", "must be a non-empty string")
        if message_id in seen:
            raise AgentMessagesInvalidError(f"{where}.id", "repeats the id of an earlier message")
        if not isinstance(role, str) or role not in _ROLES:
            raise AgentMessagesInvalidError(f"{where}.role", "must be 'user' or 'assistant'")
        if not isinstance(parts, list):
            raise AgentMessagesInvalidError(f"{where}.parts", "must be a list of message parts")
        for number, part in enumerate(parts):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise AgentMessagesInvalidError(f"{where}.parts[{number}]", "must be an object with a type")
        seen.add(message_id)
    return list(incoming)


def _in_stored_shape_all(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_in_stored_shape(message) for message in messages]


def _in_stored_shape(message: dict[str, Any]) -> dict[str, Any]:
    """The message with ai 6's name for a refused tool input (`rawInput`) changed to ai 7's (`input`).

    Streams store the ai 7 form; an ai 6 client sends the same part back under the other key, and must
    not be refused for it. Nothing else is renamed, and a part carrying both keys stays as it is.
    """
    parts = message["parts"]
    if not any(_names_raw_input(part) for part in parts):
        return message
    renamed = [
        {("input" if key == "rawInput" else key): value for key, value in part.items()}
        if _names_raw_input(part)
        else part
        for part in parts
    ]
    return {**message, "parts": renamed}


def _names_raw_input(part: dict[str, Any]) -> bool:
    return part.get("state") == "output-error" and "rawInput" in part and "input" not in part


def _reconcile(
    previous: Sequence[dict[str, Any]],
    positions: Mapping[str, int],
    window: list[dict[str, Any]],
    trigger: str,
) -> tuple[list[dict[str, Any]], list[ApprovalDecision]]:
    *earlier, last = window
    where = f"messages[{len(earlier)}]"
    start = positions.get(window[0]["id"])
    if start is None:
        if earlier:
            _conflict()
        return _append(previous, last, trigger, where), []
    for offset, message in enumerate(earlier):
        position = start + offset
        if position >= len(previous) or not _same(message, previous[position]):
            _conflict()
    position = start + len(earlier)
    if last["id"] not in positions:
        if position != len(previous):
            _conflict()
        return _append(previous, last, trigger, where), []
    if positions[last["id"]] != position or previous[position].get("role") != last["role"]:
        _conflict()
    if last["role"] == "user":
        return _resend(previous, position, last, trigger, where), []
    return _answer_approvals(previous, position, last, trigger)


def _append(
    previous: Sequence[dict[str, Any]], message: dict[str, Any], trigger: str, where: str
) -> list[dict[str, Any]]:
    """A message the store does not have: only a user may add one, and only by sending it."""
    if trigger != SUBMIT_MESSAGE or message["role"] != "user":
        _conflict()
    return [*_copies(previous), _new_user_message(message, where)]


def _resend(
    previous: Sequence[dict[str, Any]], position: int, message: dict[str, Any], trigger: str, where: str
) -> list[dict[str, Any]]:
    """Regenerate from, resend or edit a stored user message; later stored messages are dropped."""
    if _same(message, previous[position]):
        return _copies(previous[: position + 1])
    if trigger != SUBMIT_MESSAGE:
        _conflict()
    return [*_copies(previous[:position]), _new_user_message(message, where)]


def _new_user_message(message: dict[str, Any], where: str) -> dict[str, Any]:
    """A copy of a browser-written user message holding only what a user may write."""
    parts = message["parts"]
    extra = sorted(message.keys() - _NEW_USER_MESSAGE_KEYS)
    if extra:
        raise AgentMessagesInvalidError(
            f"{where}.{_shown(extra[0])}", "is not allowed: send only id, role and parts"
        )
    if not parts:
        raise AgentMessagesInvalidError(f"{where}.parts", "must hold at least one part")
    return {
        "id": message["id"],
        "role": "user",
        "parts": [_user_part(part, f"{where}.parts[{index}]") for index, part in enumerate(parts)],
    }


def _user_part(part: dict[str, Any], where: str) -> dict[str, str]:
    kind = part["type"]
    if kind == "text":
        _only_keys(part, _TEXT_PART_KEYS, where)
        if not isinstance(part.get("text"), str):
            raise AgentMessagesInvalidError(f"{where}.text", "must be a string")
        return {"type": "text", "text": part["text"]}
    if kind == "file":
        _only_keys(part, _FILE_PART_KEYS, where)
        for key in ("mediaType", "url", "filename"):
            if (key in part or key != "filename") and not isinstance(part.get(key), str):
                raise AgentMessagesInvalidError(f"{where}.{key}", "must be a string")
        if not _is_file_url(part["url"]):
            raise AgentMessagesInvalidError(f"{where}.url", "must be an http(s) address or a base64 data URL")
        return dict(part)
    raise AgentMessagesInvalidError(f"{where}.type", "must be 'text' or 'file' in a message a user writes")


def _only_keys(part: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = sorted(part.keys() - allowed)
    if extra:
        names = ", ".join(sorted(allowed))
        raise AgentMessagesInvalidError(f"{where}.{_shown(extra[0])}", f"is not allowed: send only {names}")


def _shown(key: str) -> str:
    """A key as named in an error: the browser's own text, cut short so a huge key cannot echo back."""
    return key if len(key) <= 40 and key.isprintable() else f"{key[:40].encode('ascii', 'replace').decode()}…"


def _is_file_url(url: str) -> bool:
    """An http(s) address or a base64 data URL: what the model layer can turn into content."""
    if url.startswith("data:"):
        header, separator, data = url.partition(",")
        if not separator or not header.endswith(";base64"):
            return False
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            return False
        return True
    scheme, _, rest = url.partition("://")
    return scheme in ("http", "https") and bool(rest) and not any(char.isspace() for char in url)


def _answer_approvals(
    previous: Sequence[dict[str, Any]], position: int, message: dict[str, Any], trigger: str
) -> tuple[list[dict[str, Any]], list[ApprovalDecision]]:
    """Apply approval answers to the latest stored assistant message, rebuilt from the stored copy."""
    stored = previous[position]
    if trigger != SUBMIT_MESSAGE or position != len(previous) - 1:
        _conflict()
    stored_parts = stored.get("parts")
    if not isinstance(stored_parts, list) or len(stored_parts) != len(message["parts"]):
        _conflict()
    if not _same(_without(message, ("parts",)), _without(stored, ("parts",))):
        _conflict()
    parts: list[Any] = []
    decisions: list[ApprovalDecision] = []
    for stored_part, part in zip(stored_parts, message["parts"], strict=True):
        if _same(part, stored_part):
            parts.append(_copy(stored_part))
            continue
        answered, decision = _answer(stored["id"], stored_part, part)
        parts.append(answered)
        decisions.append(decision)
    if not any(_is_tool_part(part) and part.get("state") == "approval-responded" for part in parts):
        _conflict()
    answered_message = _copy(stored)
    answered_message["parts"] = parts
    return [*_copies(previous[:position]), answered_message], decisions


def _answer(message_id: str, stored: Any, part: dict[str, Any]) -> tuple[dict[str, Any], ApprovalDecision]:
    """Validate one `approval-requested` → `approval-responded` move; identity comes from `stored`."""
    if not (_is_tool_part(stored) and stored.get("state") == "approval-requested"):
        _conflict()
    if part.get("state") != "approval-responded":
        _conflict()
    if not _same(_without(part, _TOOL_STATE_KEYS), _without(stored, _TOOL_STATE_KEYS)):
        _conflict()
    request, answer = stored.get("approval"), part.get("approval")
    if not isinstance(request, dict) or not isinstance(request.get("id"), str):
        _conflict()
    if not isinstance(answer, dict) or not _answers_request(answer, request):
        _conflict()
    approved, reason = answer.get("approved"), answer.get("reason")
    if not isinstance(approved, bool) or ("reason" in answer and not isinstance(reason, str)):
        _conflict()
    tool_name = stored.get("toolName") if stored["type"] == "dynamic-tool" else stored["type"][5:]
    tool_call_id = stored.get("toolCallId")
    if not isinstance(tool_name, str) or not isinstance(tool_call_id, str):
        _conflict()

    approval = {**_copy(request), "approved": approved}
    if reason is not None:
        approval["reason"] = reason
    answered = {**_copy(stored), "state": "approval-responded", "approval": approval}
    decision = ApprovalDecision(
        message_id=message_id,
        approval_id=request["id"],
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        input=stored.get("input"),
        approved=approved,
        reason=reason,
    )
    return answered, decision


def _answers_request(answer: dict[str, Any], request: dict[str, Any]) -> bool:
    """The answer names the stored request: same id, no field added or changed.

    Stored fields may be missing: the AI SDK client (6.x) rewrites the approval as `{id, approved,
    reason}`. The answered part is rebuilt from the stored request, so nothing is lost.
    """
    echoed = _without(answer, _APPROVAL_ANSWER_KEYS)
    return (
        "id" in echoed
        and echoed.keys() <= request.keys()
        and all(_same(value, request[key]) for key, value in echoed.items())
    )


def _is_tool_part(part: Any) -> bool:
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    return isinstance(kind, str) and (kind == "dynamic-tool" or kind.startswith("tool-"))


def _without(value: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: item for key, item in value.items() if key not in keys}


def _copies(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_copy(message) for message in messages]


def _copy(value: Any) -> Any:
    """A deep copy of a JSON value; a third of `copy.deepcopy`'s cost, which counts on long histories."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(item) for item in value]
    return value


def _same(left: Any, right: Any) -> bool:
    """JSON equality: unlike `==`, `true`, `1` and `1.0` differ, as they do on the wire."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same(item, right[key]) for key, item in left.items())
    if isinstance(left, list | tuple):
        return len(left) == len(right) and all(map(_same, left, right))
    return bool(left == right)
