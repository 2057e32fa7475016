"""The chat request's shape: checked strictly, and the messages kept as the JSON the browser sent."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bastion.chat.request import ChatRequest

CONVERSATION = "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"


def test_messages_are_kept_value_for_value() -> None:
    """Reconciliation compares with JSON equality, so 1.0 must stay a float and true a bool."""
    assistant = {
        "id": "a1",
        "role": "assistant",
        "metadata": {"model": "x"},
        "parts": [{"type": "tool-plan", "toolCallId": "c1", "input": {"seats": 1.0, "annual": True, "n": 1}}],
    }
    body = {"id": CONVERSATION, "trigger": "submit-message", "messages": [assistant], "messageId": "m"}
    request = ChatRequest.model_validate(body)
    [kept] = request.messages
    assert kept == assistant
    values = kept["parts"][0]["input"]  # type: ignore[typeddict-item]
    assert [type(values[key]) for key in ("seats", "annual", "n")] == [float, bool, int]
    assert request.trigger == "submit-message"


@pytest.mark.parametrize(
    "body",
    [
        {"id": CONVERSATION, "messages": []},
        {"id": "not-a-uuid", "messages": [{"id": "m", "role": "user", "parts": []}]},
        {"id": CONVERSATION, "trigger": {}, "messages": [{"id": "m", "role": "user", "parts": []}]},
        {"id": CONVERSATION, "messages": [{"id": "m", "role": "user", "parts": 5}]},
        {"id": CONVERSATION, "messages": [{"id": "m", "role": [], "parts": []}]},
        {"id": CONVERSATION, "messages": [{"id": 5, "role": "user", "parts": []}]},
        {"id": CONVERSATION, "messages": [{"id": "m" * 201, "role": "user", "parts": []}]},
        {"id": CONVERSATION, "messages": [{"id": "m", "role": "user", "parts": [{"text": "no type"}]}]},
    ],
)
def test_a_request_of_another_shape_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ChatRequest.model_validate(body)
