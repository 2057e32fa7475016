"""The Postgres store's claim cache: a later turn claims in one round trip when this process remembers the
conversation's stored tail, and falls back to a fresh load whenever that memory is stale or does not cover
what the browser sent. Two stores on one database stand for two processes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from bastion.history import AgentHistoryConflictError
from bastion.persistence import RunInput, RunOutcome, RunStart, ToolOperation
from bastion.stores import (
    NotFoundError,
    PostgresStore,
    StoreIdentity,
    ToolOperationUncertainError,
    TurnConflictError,
    TurnContext,
)
from bastion.stores._tail_cache import CachedTail, TailCache, row_size, tail_key
from tests.conftest import MigratedDatabase
from tests.pg import RoundTripCounter
from tests.test_postgres_store import (
    SUBMIT,
    answered,
    approval_pending,
    assistant_message,
    context,
    event_types,
    identity,
    stored,
    turn,
    user_message,
)


@asynccontextmanager
async def counted_store(database: MigratedDatabase) -> AsyncIterator[tuple[PostgresStore, RoundTripCounter]]:
    """A store whose every round trip goes through a counting proxy (one connection, so none are hidden)."""
    counter = RoundTripCounter(database.cluster)
    await counter.start()
    dsn = database.cluster.dsn(database.name, user="bastion_app", host=counter.socket_dir)
    try:
        async with await PostgresStore.open(dsn, min_size=1, max_size=1) as store:
            yield store, counter
    finally:
        await counter.close()


@pytest.fixture
async def other_process(migrated_database: MigratedDatabase) -> AsyncIterator[PostgresStore]:
    """A second store on the same database: another process, with its own claim cache."""
    async with await PostgresStore.open(migrated_database.app_dsn, max_size=4) as store:
        yield store


async def conversation_with_one_turn(store: PostgresStore, who: StoreIdentity) -> str:
    conversation = await store.create_conversation(who)
    await turn(
        store.persistence(), who, conversation.id, [user_message("u1")], response=assistant_message("a1")
    )
    return conversation.id


async def _ok() -> str:
    return "ok"


async def test_a_later_turn_on_a_remembered_conversation_takes_one_round_trip_to_claim(
    migrated_database: MigratedDatabase,
) -> None:
    async with counted_store(migrated_database) as (store, counter):
        alice = identity()
        conversation_id = await conversation_with_one_turn(store, alice)
        persistence = store.persistence()
        ctx = context(alice, conversation_id)
        history = [user_message("u1"), assistant_message("a1"), user_message("u2")]
        counter.round_trips = 0
        start = await persistence.start_run(ctx, RunInput(messages=history, trigger=SUBMIT))
        assert counter.round_trips == 1
        operation = ToolOperation(
            name="lookup", tool_call_id="call-1", input={}, execute=_ok, key="op/call-1"
        )
        await persistence.execute_tool(ctx, start.state, operation)
        assert counter.round_trips == 2
        await persistence.finish_run(
            ctx, start.state, RunOutcome(status="completed", response_message=assistant_message("a2"))
        )
        assert counter.round_trips == 3
        assert start.messages == history
        assert [m["id"] for m in await stored(store, alice, conversation_id)] == ["u1", "a1", "u2", "a2"]
        assert (await store.get_conversation(alice, conversation_id)).revision == 4


@pytest.mark.parametrize("idempotent", [False, True])
async def test_an_operation_this_run_already_ran_is_answered_from_memory_without_a_round_trip(
    migrated_database: MigratedDatabase, idempotent: bool
) -> None:
    async with counted_store(migrated_database) as (store, counter):
        alice = identity()
        conversation_id = await conversation_with_one_turn(store, alice)
        persistence = store.persistence()
        ctx = context(alice, conversation_id)
        history = [user_message("u1"), assistant_message("a1"), user_message("u2")]
        start = await persistence.start_run(ctx, RunInput(messages=history, trigger=SUBMIT))
        runs: list[str] = []

        async def once() -> str:
            runs.append("ran")
            return "done"

        operation = ToolOperation(
            name="lookup",
            tool_call_id="call-1",
            input={},
            execute=once,
            key="op/call-1",
            idempotent=idempotent,
        )
        assert await persistence.execute_tool(ctx, start.state, operation) == "done"
        counter.round_trips = 0
        assert await persistence.execute_tool(ctx, start.state, operation) == "done"
        assert counter.round_trips == 0
        assert runs == ["ran"]


async def test_a_failed_operation_of_this_run_is_uncertain_without_a_round_trip(
    migrated_database: MigratedDatabase,
) -> None:
    async with counted_store(migrated_database) as (store, counter):
        alice = identity()
        conversation_id = await conversation_with_one_turn(store, alice)
        persistence = store.persistence()
        ctx = context(alice, conversation_id)
        history = [user_message("u1"), assistant_message("a1"), user_message("u2")]
        start = await persistence.start_run(ctx, RunInput(messages=history, trigger=SUBMIT))

        async def fails() -> str:
            raise RuntimeError("down")

        operation = ToolOperation(name="lookup", tool_call_id="call-1", input={}, execute=fails, key="op/1")
        with pytest.raises(RuntimeError):
            await persistence.execute_tool(ctx, start.state, operation)
        counter.round_trips = 0
        with pytest.raises(ToolOperationUncertainError):
            await persistence.execute_tool(ctx, start.state, replace(operation, execute=_ok))
        assert counter.round_trips == 0


async def test_every_turn_after_the_first_claims_in_one_round_trip(
    migrated_database: MigratedDatabase,
) -> None:
    async with counted_store(migrated_database) as (store, counter):
        alice = identity()
        conversation_id = await conversation_with_one_turn(store, alice)
        persistence = store.persistence()
        claims = []
        for n in range(2, 5):
            counter.round_trips = 0
            ctx = context(alice, conversation_id)
            start = await persistence.start_run(
                ctx, RunInput(messages=[user_message(f"u{n}")], trigger=SUBMIT)
            )
            claims.append(counter.round_trips)
            await persistence.finish_run(
                ctx, start.state, RunOutcome(status="completed", response_message=assistant_message(f"a{n}"))
            )
        assert claims == [1, 1, 1]
        assert len(await stored(store, alice, conversation_id)) == 8


async def test_a_stale_cache_falls_back_to_a_fresh_load_and_the_turn_sees_the_other_process_turn(
    store: PostgresStore, other_process: PostgresStore
) -> None:
    alice = identity()
    conversation_id = await conversation_with_one_turn(store, alice)
    await turn(
        other_process.persistence(),
        alice,
        conversation_id,
        [user_message("u2")],
        response=assistant_message("a2"),
    )
    start = await turn(
        store.persistence(), alice, conversation_id, [user_message("u3")], response=assistant_message("a3")
    )
    assert [m["id"] for m in start.messages] == ["u1", "a1", "u2", "a2", "u3"]
    assert [m["id"] for m in await stored(store, alice, conversation_id)] == [
        "u1",
        "a1",
        "u2",
        "a2",
        "u3",
        "a3",
    ]


async def test_a_stale_cache_costs_one_extra_round_trip_and_then_serves_again(
    migrated_database: MigratedDatabase, other_process: PostgresStore
) -> None:
    async with counted_store(migrated_database) as (store, counter):
        alice = identity()
        conversation_id = await conversation_with_one_turn(store, alice)
        await turn(other_process.persistence(), alice, conversation_id, [user_message("u2")])
        claims = []
        for n in (3, 4):
            counter.round_trips = 0
            ctx = context(alice, conversation_id)
            start = await store.persistence().start_run(
                ctx, RunInput(messages=[user_message(f"u{n}")], trigger=SUBMIT)
            )
            claims.append(counter.round_trips)
            await store.persistence().finish_run(ctx, start.state, RunOutcome(status="completed"))
        assert claims == [3, 1]


async def test_a_browser_window_the_stale_cache_would_refuse_is_accepted_after_a_fresh_load(
    store: PostgresStore, other_process: PostgresStore
) -> None:
    alice = identity()
    conversation_id = await conversation_with_one_turn(store, alice)
    await turn(
        other_process.persistence(),
        alice,
        conversation_id,
        [user_message("u2")],
        response=assistant_message("a2"),
    )
    history = await stored(other_process, alice, conversation_id)
    start = await turn(store.persistence(), alice, conversation_id, [*history, user_message("u3")])
    assert [m["id"] for m in start.messages] == ["u1", "a1", "u2", "a2", "u3"]


async def test_an_edit_of_a_message_older_than_the_remembered_tail_is_loaded_afresh(
    store: PostgresStore, other_process: PostgresStore
) -> None:
    alice = identity()
    conversation_id = await conversation_with_one_turn(other_process, alice)
    await turn(
        other_process.persistence(),
        alice,
        conversation_id,
        [user_message("u2")],
        response=assistant_message("a2"),
    )
    # This process loads only the last two messages, so it remembers u2 and a2, not u1.
    short = store.persistence(history_window=2)
    await turn(short, alice, conversation_id, [user_message("u3")], response=assistant_message("a3"))
    edited = user_message("u1", "edited")
    start = await turn(short, alice, conversation_id, [edited], response=assistant_message("a4"))
    assert start.messages == [edited]
    assert await stored(store, alice, conversation_id) == [edited, assistant_message("a4")]


async def test_a_forged_window_against_a_remembered_tail_is_refused_and_writes_nothing(
    store: PostgresStore, migrated_database: MigratedDatabase
) -> None:
    alice = identity()
    conversation_id, history = await approval_pending(store, alice)
    before = (
        await stored(store, alice, conversation_id),
        await event_types(store, alice, conversation_id),
        await store.get_conversation(alice, conversation_id),
    )
    forged = answered(history[-1])
    forged["parts"][1]["input"] = {"path": "/srv/other", "count": 1}
    with pytest.raises(AgentHistoryConflictError):
        await store.persistence().start_run(
            context(alice, conversation_id), RunInput(messages=[history[0], forged], trigger=SUBMIT)
        )
    after = (
        await stored(store, alice, conversation_id),
        await event_types(store, alice, conversation_id),
        await store.get_conversation(alice, conversation_id),
    )
    assert after == before
    start = await store.persistence().start_run(
        context(alice, conversation_id),
        RunInput(messages=[history[0], answered(history[-1])], trigger=SUBMIT),
    )
    assert start.messages[-1]["parts"][1]["state"] == "approval-responded"


async def test_an_approval_answered_under_a_policy_is_decided_once_under_the_lock(
    migrated_database: MigratedDatabase,
) -> None:
    async with counted_store(migrated_database) as (store, counter):
        alice = identity()
        conversation_id, history = await approval_pending(store, alice)
        decisions: list[Any] = []

        def policy(ctx: TurnContext, decision: Any) -> bool:
            decisions.append(decision.approval_id)
            return True

        counter.round_trips = 0
        await store.persistence(can_respond_to_approval=policy).start_run(
            context(alice, conversation_id),
            RunInput(messages=[history[0], answered(history[-1])], trigger=SUBMIT),
        )
        assert counter.round_trips == 2
        assert decisions == ["approval-1"]


@pytest.mark.parametrize("same_user", [False, True], ids=["another user", "same user in another tenant"])
async def test_another_identity_neither_uses_nor_disturbs_a_remembered_tail(
    migrated_database: MigratedDatabase, same_user: bool
) -> None:
    async with counted_store(migrated_database) as (store, counter):
        alice = identity("tenant-a")
        conversation_id = await conversation_with_one_turn(store, alice)
        other = (
            StoreIdentity(user_id=alice.user_id, tenant_id="tenant-b") if same_user else identity("tenant-a")
        )
        history = [user_message("u1"), assistant_message("a1"), user_message("u2")]
        with pytest.raises(NotFoundError):
            await store.persistence().start_run(
                context(other, conversation_id), RunInput(messages=history, trigger=SUBMIT)
            )
        counter.round_trips = 0
        start = await store.persistence().start_run(
            context(alice, conversation_id), RunInput(messages=history, trigger=SUBMIT)
        )
        assert counter.round_trips == 1
        assert start.messages == history


async def test_of_simultaneous_turns_on_a_remembered_conversation_exactly_one_proceeds(
    store: PostgresStore, other_process: PostgresStore
) -> None:
    alice = identity()
    conversation_id = await conversation_with_one_turn(store, alice)
    await turn(other_process.persistence(), alice, conversation_id, [user_message("u2")])
    await turn(store.persistence(), alice, conversation_id, [user_message("u3")])
    # `store` remembers the current tail, `other_process` a stale one: both paths race.
    starts = await asyncio.gather(
        *(
            process.persistence().start_run(
                context(alice, conversation_id), RunInput(messages=[user_message(f"n{i}")], trigger=SUBMIT)
            )
            for i, process in enumerate([store, other_process] * 4)
        ),
        return_exceptions=True,
    )
    assert sum(isinstance(result, RunStart) for result in starts) == 1
    assert all(isinstance(result, RunStart | TurnConflictError) for result in starts)
    assert len(await stored(store, alice, conversation_id)) == 5


async def test_a_claim_on_a_conversation_with_a_live_run_is_a_conflict(store: PostgresStore) -> None:
    alice = identity()
    conversation_id = await conversation_with_one_turn(store, alice)
    persistence = store.persistence()
    await persistence.start_run(
        context(alice, conversation_id), RunInput(messages=[user_message("u2")], trigger=SUBMIT)
    )
    with pytest.raises(TurnConflictError):
        await persistence.start_run(
            context(alice, conversation_id), RunInput(messages=[user_message("u3")], trigger=SUBMIT)
        )
    assert [m["id"] for m in await stored(store, alice, conversation_id)] == ["u1", "a1", "u2"]


async def test_a_finish_of_a_replaced_run_forgets_the_tail(store: PostgresStore) -> None:
    alice = identity()
    conversation_id = await conversation_with_one_turn(store, alice)
    expiring = store.persistence(lease_seconds=0)
    first_context = context(alice, conversation_id)
    first = await expiring.start_run(first_context, RunInput(messages=[user_message("u2")], trigger=SUBMIT))
    await turn(
        store.persistence(), alice, conversation_id, [user_message("u3")], response=assistant_message("a3")
    )
    await expiring.finish_run(
        first_context, first.state, RunOutcome(status="completed", response_message=assistant_message("late"))
    )
    assert store.claim_cache.get(tail_key(alice, conversation_id)) is None
    start = await turn(store.persistence(), alice, conversation_id, [user_message("u4")])
    assert [m["id"] for m in start.messages] == ["u1", "a1", "u2", "u3", "a3", "u4"]


async def test_a_store_with_no_claim_cache_claims_in_two_round_trips(
    migrated_database: MigratedDatabase,
) -> None:
    counter = RoundTripCounter(migrated_database.cluster)
    await counter.start()
    dsn = migrated_database.cluster.dsn(migrated_database.name, user="bastion_app", host=counter.socket_dir)
    try:
        async with await PostgresStore.open(dsn, max_size=1, claim_cache_size=0) as store:
            alice = identity()
            conversation_id = await conversation_with_one_turn(store, alice)
            counter.round_trips = 0
            await store.persistence().start_run(
                context(alice, conversation_id), RunInput(messages=[user_message("u2")], trigger=SUBMIT)
            )
            assert counter.round_trips == 2
    finally:
        await counter.close()


# The cache itself


def _tail(revision: int) -> CachedTail:
    return CachedTail(revision=revision, last_seq=0, first_seq=1, rows=())


def test_the_cache_forgets_the_least_recently_used_conversation_beyond_its_size() -> None:
    cache = TailCache(2)
    keys = [(str(uuid.uuid4()), None, str(uuid.uuid4())) for _ in range(3)]
    cache.put(keys[0], _tail(1))
    cache.put(keys[1], _tail(1))
    assert cache.get(keys[0]) is not None
    cache.put(keys[2], _tail(1))
    assert [cache.get(key) is not None for key in keys] == [True, False, True]


def test_the_cache_keeps_the_later_revision_of_a_conversation() -> None:
    cache = TailCache(2)
    key = (str(uuid.uuid4()), None, str(uuid.uuid4()))
    cache.put(key, _tail(5))
    cache.put(key, _tail(3))
    entry = cache.get(key)
    assert entry is not None and entry.revision == 5


def test_cache_keys_differ_by_user_and_by_tenant() -> None:
    conversation_id = str(uuid.uuid4())
    alice = identity("tenant-a")
    keys = {
        tail_key(alice, conversation_id),
        tail_key(identity("tenant-a"), conversation_id),
        tail_key(StoreIdentity(user_id=alice.user_id, tenant_id="tenant-b"), conversation_id),
        tail_key(StoreIdentity(user_id=alice.user_id), conversation_id),
    }
    assert len(keys) == 4


def test_a_remembered_tail_serves_a_window_only_if_it_holds_it() -> None:
    partial = CachedTail(revision=1, last_seq=10, first_seq=7, rows=())
    assert partial.covers_window(4) and not partial.covers_window(5)
    assert CachedTail(revision=1, last_seq=3, first_seq=1, rows=()).covers_window(100)


@pytest.mark.parametrize("size", [-1, 1.5, True])
def test_a_cache_size_must_be_a_non_negative_integer(size: Any) -> None:
    with pytest.raises(ValueError):
        TailCache(size)


def test_a_tail_longer_than_max_rows_is_not_kept_and_forgets_the_older_one() -> None:
    cache = TailCache(4, max_rows=2)
    key = (str(uuid.uuid4()), None, str(uuid.uuid4()))
    message: dict[str, Any] = {"id": "m", "role": "user", "parts": []}
    cache.put(key, CachedTail(revision=1, last_seq=2, first_seq=1, rows=((1, message), (2, message))))
    assert cache.get(key) is not None
    long = CachedTail(revision=2, last_seq=3, first_seq=1, rows=((1, message), (2, message), (3, message)))
    cache.put(key, long)
    assert cache.get(key) is None


def _sized_tail(revision: int, *texts: str) -> CachedTail:
    rows = tuple((seq, user_message(f"u{seq}", text)) for seq, text in enumerate(texts, start=1))
    return CachedTail(revision=revision, last_seq=len(rows), first_seq=1, rows=rows)


def test_a_cached_tail_measures_its_rows() -> None:
    tail = _sized_tail(1, "x" * 1000, "y" * 10)
    assert tail.sizes == tuple(row_size(message) for _, message in tail.rows)
    assert 1010 < tail.size < 1300
    with pytest.raises(ValueError):
        CachedTail(revision=1, last_seq=1, first_seq=1, rows=tail.rows, sizes=(1,))


def test_the_cache_forgets_the_least_recently_used_tails_beyond_its_bytes() -> None:
    cache = TailCache(100, max_bytes=4000)
    keys = [(str(uuid.uuid4()), None, str(uuid.uuid4())) for _ in range(9)]
    tail = _sized_tail(1, "x" * 400)
    assert 400 < tail.size <= 4000 // 8 and 8 * tail.size <= 4000 < 9 * tail.size
    for key in keys[:8]:
        cache.put(key, tail)
    assert cache.bytes == 8 * tail.size
    assert cache.get(keys[0]) is not None
    cache.put(keys[8], tail)
    assert [cache.get(key) is not None for key in keys] == [True, False, *[True] * 7]
    assert cache.bytes == 8 * tail.size
    cache.put(keys[0], _sized_tail(2, "x" * 10))
    assert cache.bytes == 7 * tail.size + _sized_tail(2, "x" * 10).size


def test_a_tail_over_an_eighth_of_the_bytes_is_not_kept_and_forgets_the_older_one() -> None:
    cache = TailCache(4, max_bytes=8 * 1000)
    key = (str(uuid.uuid4()), None, str(uuid.uuid4()))
    cache.put(key, _sized_tail(1, "x" * 100))
    assert cache.get(key) is not None
    cache.put(key, _sized_tail(2, "x" * 1000))
    assert cache.get(key) is None
    assert cache.bytes == 0


@pytest.mark.parametrize("max_bytes", [0, -1, 1.5, True])
def test_a_cache_byte_budget_must_be_a_positive_integer(max_bytes: Any) -> None:
    with pytest.raises(ValueError):
        TailCache(4, max_bytes=max_bytes)


async def test_large_messages_never_make_the_store_remember_more_than_its_bytes(
    migrated_database: MigratedDatabase,
) -> None:
    budget = 200_000  # a tail may hold 25 KB; twelve conversations of 20 KB do not fit
    async with await PostgresStore.open(migrated_database.app_dsn, claim_cache_bytes=budget) as store:
        alice = identity()
        persistence = store.persistence()
        conversations = [(await store.create_conversation(alice)).id for _ in range(12)]
        histories: dict[str, list[dict[str, Any]]] = {cid: [] for cid in conversations}
        for n in range(4):
            for cid in conversations:
                message = user_message(f"u{n}", "x" * 5_000)
                answer = assistant_message(f"a{n}", "y" * 100)
                await turn(persistence, alice, cid, [*histories[cid], message], response=answer)
                histories[cid] += [message, answer]
                assert store.claim_cache.bytes <= budget
        remembered = [store.claim_cache.get(tail_key(alice, cid)) for cid in conversations]
        kept = [entry for entry in remembered if entry is not None]
        assert 0 < len(kept) < len(conversations)
        assert remembered[-1] is not None  # the most recent conversation stays
        for entry in kept:
            assert entry.sizes == tuple(row_size(message) for _, message in entry.rows)
        assert store.claim_cache.bytes == sum(entry.size for entry in kept)
        big = user_message("u9", "z" * (budget // 8))
        cid = conversations[-1]
        await turn(persistence, alice, cid, [*histories[cid], big], response=assistant_message("a9"))
        assert store.claim_cache.get(tail_key(alice, cid)) is None
        assert [m["id"] for m in await stored(store, alice, cid)][-2:] == ["u9", "a9"]


async def test_a_conversation_deleted_and_created_again_elsewhere_is_not_served_from_an_old_tail(
    migrated_database: MigratedDatabase,
) -> None:
    """Two processes: A remembers the old conversation; B deletes it, creates it again under the same id
    and brings it to the same revision. A's next turn must see the new conversation, not the old one."""
    async with (
        await PostgresStore.open(migrated_database.app_dsn, max_size=2) as process_a,
        await PostgresStore.open(migrated_database.app_dsn, max_size=2) as process_b,
    ):
        alice = identity()
        conversation_id = str(uuid.uuid4())
        await process_a.create_conversation(alice, conversation_id=conversation_id)
        a, b = process_a.persistence(), process_b.persistence()

        request = context(alice, conversation_id)
        first = RunInput(messages=[user_message("u1", "my secret")], trigger=SUBMIT)
        started = await a.start_run(request, first)
        done = RunOutcome(status="completed", response_message=assistant_message("a1"))
        await a.finish_run(request, started.state, done)

        await process_b.delete_conversation(alice, conversation_id)
        await process_b.create_conversation(alice, conversation_id=conversation_id)
        request = context(alice, conversation_id)
        started = await b.start_run(request, RunInput(messages=[user_message("x1", "fresh")], trigger=SUBMIT))
        await b.finish_run(request, started.state, RunOutcome(status="failed", response_message=None))

        request = context(alice, conversation_id)
        started = await a.start_run(request, RunInput(messages=[user_message("x2", "next")], trigger=SUBMIT))
        assert [message["id"] for message in started.messages] == ["x1", "x2"]
        stored = await process_b.list_messages(alice, conversation_id)
        assert [(row.seq, row.id) for row in stored] == [(1, "x1"), (2, "x2")]
