"""The store-independent arithmetic of a turn (`bastion.stores._turn_persistence`): which rows a
reconciled history writes, which approval events it records, and which values the stores accept.
Both stores run these plans, so their edge cases are pinned here once, without a database."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bastion.stores import InvalidInputError
from bastion.stores._turn_persistence import (
    approval_response_events,
    browser_message_ids,
    json_value,
    pending_approval_ids,
    plan_history_writes,
    run_status,
)


def message(message_id: str, text: str = "hello", role: str = "user") -> dict[str, Any]:
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": text}]}


def tool_part(call_id: str, state: str, **fields: Any) -> dict[str, Any]:
    return {"type": "tool-save_note", "toolCallId": call_id, "state": state, "input": {}, **fields}


def assistant(message_id: str, *parts: Any) -> dict[str, Any]:
    return {"id": message_id, "role": "assistant", "parts": list(parts)}


def requested(call_id: str) -> dict[str, Any]:
    return tool_part(call_id, "approval-requested", approval={"id": f"ap-{call_id}"})


def responded(call_id: str, approved: bool = True) -> dict[str, Any]:
    return tool_part(call_id, "approval-responded", approval={"id": f"ap-{call_id}", "approved": approved})


# Row writes


def test_an_edit_replaces_its_row_drops_the_later_ones_and_appends_after_it() -> None:
    a, b, c = message("a"), message("b"), message("c")
    edited, new = message("b", "edited"), message("d")
    plan = plan_history_writes([(5, a), (6, b), (7, c)], [a, edited, new], last_seq=7)
    assert plan.truncate_after == 6
    assert plan.writes == [
        {"seq": 6, "message": edited, "replace": True},
        {"seq": 7, "message": new, "replace": False},
    ]


def test_a_different_message_in_place_of_a_stored_one_truncates_before_it_and_takes_its_seq() -> None:
    a, b, other = message("a"), message("b"), message("x")
    plan = plan_history_writes([(3, a), (4, b)], [a, other], last_seq=4)
    assert plan.truncate_after == 3
    assert plan.writes == [{"seq": 4, "message": other, "replace": False}]


def test_messages_after_the_stored_tail_take_consecutive_seqs() -> None:
    a = message("a")
    new = [message("b"), message("c"), message("d")]
    plan = plan_history_writes([(9, a)], [a, *new], last_seq=9)
    assert plan.truncate_after is None
    assert [write["seq"] for write in plan.writes] == [10, 11, 12]
    assert [write["message"] for write in plan.writes] == new


def test_replacing_the_last_row_deletes_nothing_after_it() -> None:
    a, b = message("a"), message("b")
    answered = message("b", "changed")
    plan = plan_history_writes([(1, a), (2, b)], [a, answered], last_seq=2)
    assert plan.truncate_after is None
    assert plan.writes == [{"seq": 2, "message": answered, "replace": True}]


@pytest.mark.parametrize(("stored", "sent"), [(1, 1.0), (1, True), (0, False), ("1", 1), (None, 0)])
def test_a_value_of_another_json_type_is_a_change_even_when_python_calls_it_equal(
    stored: Any, sent: Any
) -> None:
    before = {**message("a"), "metadata": {"n": [stored]}}
    after = {**message("a"), "metadata": {"n": [sent]}}
    plan = plan_history_writes([(1, before)], [after], last_seq=1)
    assert plan.writes == [{"seq": 1, "message": after, "replace": True}]


# Approval events


def test_only_the_calls_answered_in_this_turn_are_approval_responses() -> None:
    stored = assistant(
        "a1",
        tool_part("c0", "approval-responded", approval={"id": "ap-c0"}),
        requested("c1"),
        requested("c2"),
    )
    answered = assistant(
        "a1",
        responded("c0"),  # answered by an earlier turn: already announced
        tool_part("new", "approval-responded", approval={"id": "ap-new"}),  # never asked for
        requested("c1"),  # still waiting
        responded("c2", approved=False),
    )
    events = approval_response_events([(1, message("u1")), (2, stored)], [message("u1"), answered])
    assert events == [
        {
            "type": "approval.responded",
            "data": {"toolCallId": "c2", "toolName": "save_note", "approvalId": "ap-c2", "approved": False},
        }
    ]


def test_answers_in_a_message_other_than_the_stored_last_one_are_not_approval_responses() -> None:
    stored = assistant("a1", requested("c1"))
    other = assistant("a2", responded("c1"))
    assert approval_response_events([(1, stored)], [other]) == []


def test_pending_approvals_are_the_requested_ones_of_the_latest_message() -> None:
    latest = assistant(
        "a2",
        requested("c1"),
        responded("c2"),
        tool_part("c3", "approval-requested"),  # no approval id to name
        {"type": "text", "text": "x", "state": "approval-requested"},
    )
    assert pending_approval_ids([assistant("a1", requested("old")), latest]) == {"ap-c1"}
    assert pending_approval_ids([]) == frozenset()


@pytest.mark.parametrize("parts", [None, "tool-x", {"type": "tool-x"}])
def test_a_message_whose_parts_are_not_a_list_has_no_tool_parts(parts: Any) -> None:
    shaped = {"id": "a1", "role": "assistant", "parts": parts}
    assert run_status("completed", shaped) == "completed"
    assert pending_approval_ids([shaped]) == frozenset()


def test_parts_that_are_not_tool_parts_are_skipped_and_the_tool_parts_after_them_still_count() -> None:
    shaped = assistant("a1", 5, {"text": "no type"}, {"type": 7}, requested("c1"))
    assert run_status("completed", shaped) == "waiting_for_approval"
    assert pending_approval_ids([shaped]) == {"ap-c1"}


# Values the stores accept


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, {"score": [math.nan]}])
def test_non_finite_numbers_are_not_storable_json(value: Any) -> None:
    with pytest.raises(InvalidInputError):
        json_value(value)


def test_browser_message_ids_keep_the_ids_a_table_can_hold() -> None:
    longest = "x" * 200
    sent = [{"id": ""}, {"id": "a"}, {"id": longest}, {"id": "y" * 201}, {"id": 5}, "not a message"]
    assert browser_message_ids(sent) == ["a", longest]
