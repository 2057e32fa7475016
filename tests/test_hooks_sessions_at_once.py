"""A batch's session writes applied at once (`bastion.apply_session_writes_at_once`, which
`bastion.apply_session_writes` calls after its owner checks; each row written once with its final
state) store exactly what the same writes applied one by one store, for generated chats
that do everything a batch can hold: runs started, settled twice, settled without a start or started
again; assistant messages written before their run exists, updated, or naming no run; deletions of
the leaf and of other messages; windows handed over again; and batches out of a chat's event order,
which take the one-by-one path."""

from __future__ import annotations

import random
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from bastion.hooks import chat_id_of
from tests.hooks_db import HooksDatabase, create_hooks_database
from tests.pg import PostgresCluster
from tests.test_hooks_sessions_batch import chat_rows

_FINAL = [
    ("completed", "complete"),
    ("failed", "error"),
    ("cancelled", "aborted"),
    ("interrupted", "aborted"),
    ("waiting_for_approval", "complete"),
]
_AT_ONCE = (
    "select bastion.apply_session_writes_at_once(array("
    " select w from jsonb_populate_recordset(null::bastion.session_write, %s) w))"
)
_IN_ORDER = (
    "select bastion.apply_session_writes_in_order(array("
    " select w from jsonb_populate_recordset(null::bastion.session_write, %s) w))"
)


class Chat:
    def __init__(self, rng: random.Random) -> None:
        self.conversation = str(uuid.uuid4())
        self.chat, self.owner = chat_id_of(self.conversation), str(uuid.uuid4())
        self.tenant = rng.choice([None, "tenant-a"])
        self.messages: list[tuple[str, str]] = []
        self.runs: list[str] = []
        self.later_runs = [str(uuid.uuid4()) for _ in range(3)]  # named by messages before they start


def writes(rng: random.Random, chats: int, steps: int) -> list[dict[str, Any]]:
    """`steps` writes of `chats` chats, interleaved, each chat's in rising event order."""
    every = [Chat(rng) for _ in range(chats)]
    result, event = [], 0
    for _ in range(steps):
        chat = rng.choice(every)
        event += rng.randint(1, 3)
        write: dict[str, Any] = {
            "chat": chat.chat,
            "owner": chat.owner,
            "tenant": chat.tenant,
            "event": event,
            "at": f"2026-12-01T00:{event // 60 % 60:02d}:{event % 60:02d}+00:00",
            "conversation": chat.conversation,
        }
        roll = rng.random()
        if roll < 0.15 or not chat.runs:
            run = chat.later_runs.pop() if chat.later_runs and rng.random() < 0.5 else str(uuid.uuid4())
            if chat.runs and rng.random() < 0.1:
                run = rng.choice(chat.runs)  # started again
            chat.runs.append(run)
            write |= {"write": "run_started", "run": run}
        elif roll < 0.3:
            status, message_status = rng.choice(_FINAL)
            run = rng.choice(chat.runs[-2:]) if rng.random() < 0.9 else str(uuid.uuid4())
            chat.runs.append(run)
            write |= {
                "write": "run_finished",
                "run": run,
                "status": status,
                "message_status": message_status,
                "usage": {"inputTokens": rng.randint(0, 9)},
            }
        elif roll < 0.75:
            if chat.messages and rng.random() < 0.3:
                message, role = rng.choice(chat.messages[-3:])  # updated
            else:
                role = rng.choice(["user", "assistant"])
                message = f"{role[0]}{len(chat.messages)}"
                chat.messages.append((message, role))
            assistant = role == "assistant"
            write |= {
                "write": "message",
                "id": message,
                "parent": rng.choice([None, *(m for m, _ in chat.messages[-3:] if m != message)]),
                "role": role,
                "parts": [{"type": "text", "text": f"version {event}"}],
                "format": "ai-sdk" if assistant else "canonical",
                "native": {"id": message, "version": event} if assistant else None,
                "metadata": {"version": event} if rng.random() < 0.3 else {},
                "run": rng.choice([None, *chat.runs[-2:], *chat.later_runs[-1:]]),
            }
        elif roll < 0.9 and chat.messages:
            message, _ = rng.choice(chat.messages[-2:])
            others = [m for m, _ in chat.messages[-4:] if m != message]
            write |= {"write": "deleted", "id": message, "parent": rng.choice([None, *others])}
        else:
            write |= {"write": None}
        result.append(write)
    return result


def windows(rng: random.Random, writes: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The writes as delivery hands them over: consecutive windows, some handed over again, a few in
    no order at all; each with its chats' rows on the first write of each chat (as the hook builds it)."""
    result, start = [], 0
    while start < len(writes):
        end = min(len(writes), start + rng.randint(1, 40))
        window = writes[start:end]
        result.append(rng.sample(window, len(window)) if rng.random() < 0.15 else window)
        if rng.random() < 0.2:
            result.append(writes[max(0, start - rng.randint(0, 30)) : end])
        start = end
    return [_first_of_each_chat(window) for window in result]


def _first_of_each_chat(window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    result = []
    for write in window:
        first = write["chat"] not in seen
        seen.add(write["chat"])
        result.append(write | ({"agent": "assistant", "title": ""} if first else {"conversation": None}))
    return result


@pytest.fixture(scope="module")
def databases(pg_cluster: PostgresCluster) -> tuple[HooksDatabase, HooksDatabase]:
    """One database written one write at a time, one written a batch at once (each seed's chats are
    its own)."""
    return create_hooks_database(pg_cluster), create_hooks_database(pg_cluster)


@pytest.mark.parametrize("seed", range(16))
def test_a_batch_written_at_once_stores_what_its_writes_one_by_one_store(
    databases: tuple[HooksDatabase, HooksDatabase], seed: int
) -> None:
    one_by_one, at_once = databases
    rng = random.Random(seed)
    generated = writes(rng, chats=3, steps=200)
    with (
        psycopg.connect(one_by_one.app_dsn, autocommit=True) as singly,
        psycopg.connect(at_once.app_dsn, autocommit=True) as batched,
    ):
        for window in windows(rng, generated):
            for write in window:
                singly.execute(_IN_ORDER, (Jsonb([write]),))
            batched.execute(_AT_ONCE, (Jsonb(window),))
    chats = sorted({write["chat"] for write in generated})
    expected = chat_rows(one_by_one, chats)
    assert all(expected.values())
    assert chat_rows(at_once, chats) == expected
