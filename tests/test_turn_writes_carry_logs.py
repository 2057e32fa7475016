"""A turn's own writes carry its stream log (`ChunkLog.carry`), and lock its run row without waiting
for transactions that only reference the run (the log's inserts, whose foreign key check share-locks
it)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from bastion.persistence import RunInput, RunOutcome, ToolOperation
from bastion.stores import PostgresStore, StoreIdentity, TurnContext
from bastion.stores.live import ChunkBatch, ChunkLog
from tests.conftest import MigratedDatabase


def user_message(text: str) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": text}]}


async def test_a_tool_claim_and_a_close_do_not_wait_for_a_transaction_that_references_the_run(
    migrated_database: MigratedDatabase,
) -> None:
    alice = StoreIdentity(user_id=str(uuid.uuid4()))
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=2) as store:
        conversation = await store.create_conversation(alice)
        context = TurnContext(identity=alice, conversation_id=conversation.id, request_id=str(uuid.uuid4()))
        persistence = store.persistence()
        start = await persistence.start_run(
            context, RunInput(messages=[user_message("hi")], trigger="submit-message")
        )

        async def lookup() -> str:
            return "found"

        async with await psycopg.AsyncConnection.connect(migrated_database.admin_dsn) as other:
            # What another transaction's insert of a row referencing the run holds until it commits.
            await other.execute(
                "select 1 from bastion.runs where id = %s for key share", (start.state.run_id,)
            )
            operation = ToolOperation(name="lookup", tool_call_id="c1", input={}, execute=lookup, key="op/c1")
            assert (
                await asyncio.wait_for(persistence.execute_tool(context, start.state, operation), 10)
                == "found"
            )
            outcome = RunOutcome(
                status="completed",
                response_message={"id": "a1", "role": "assistant", "parts": [{"type": "text", "text": "ok"}]},
            )
            await asyncio.wait_for(persistence.finish_run(context, start.state, outcome), 10)
            await other.rollback()
        [stored] = [
            m.message for m in await store.list_messages(alice, conversation.id) if m.role == "assistant"
        ]
        assert stored["id"] == "a1"


def _types(batches: list[ChunkBatch]) -> list[str]:
    return [chunk["type"] for batch in batches for chunk in batch.chunks]


async def test_a_carried_log_keeps_what_a_failed_write_carried_and_ends_with_the_last_finish() -> None:
    written: list[ChunkBatch] = []

    async def sink(batch: ChunkBatch) -> bool:
        written.append(batch)
        return False

    log = ChunkLog(sink, interval=3600)
    log.carried = True
    for kind in ("start", "start-step", "finish-step"):
        log.add({"type": kind})
    await asyncio.sleep(0.01)
    assert written == []  # a carried log's step boundary leaves the write to the run's next one
    log.closing({"type": "finish", "finishReason": "stop"})
    with pytest.raises(RuntimeError):
        async with log.carry(closing=True) as carried:
            assert _types(carried.batches) == ["start", "start-step", "finish-step", "finish"]
            raise RuntimeError("the close failed")
    # The save failed: the turn ends with an error, and a `finish` saying so, after what was logged.
    log.add({"type": "error", "errorText": "Unable to generate a response. Try again."})
    log.closing({"type": "finish", "finishReason": "error"})
    await log.close()
    assert _types(written) == ["start", "start-step", "finish-step", "error", "finish"]
    assert written[-1].chunks[-1] == {"type": "finish", "finishReason": "error"}
    assert [batch.seq for batch in written] == [0]


async def test_a_carried_write_that_finds_the_run_asked_to_stop_stops_it_and_its_finish_is_written_once() -> (
    None
):
    written: list[ChunkBatch] = []
    stopped: list[bool] = []

    async def sink(batch: ChunkBatch) -> bool:
        written.append(batch)
        return False

    log = ChunkLog(sink, interval=3600, on_stop=lambda: stopped.append(True))
    log.carried = True
    log.add({"type": "start"})
    async with log.carry() as carried:
        assert _types(carried.batches) == ["start"]
        carried.stop = True
    assert stopped == [True]
    log.closing({"type": "finish"})
    async with log.carry(closing=True) as carried:
        assert _types(carried.batches) == ["finish"]
        assert carried.batches[0].seq == 1
    log.closing({"type": "finish", "finishReason": "error"})  # too late: the close stored one
    await log.close()
    assert written == []
