"""Followers of a running turn over HTTP (`GET /api/chat/{id}/stream`): in one process they share one reader
of the turn's log, they are capped per user and per turn (429 `too_many_followers` with `Retry-After`),
a follower that leaves frees its place at once, and one user at the cap costs other users nothing."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from bastion import define_agent
from bastion.chat.endpoint import chat_routes
from bastion.stores import FollowerLimits, NotFoundError, PostgresStore, StoreIdentity
from bastion.stores.postgres_live import PostgresLiveTurns
from bastion.worker import create_agent_worker
from tests.conftest import MigratedDatabase
from tests.live_server import served_here
from tests.test_live_turns import TENANT, GatedModel, Project, Worker, sse_chunks, start_turn

WAIT = 20  # seconds any one step may take at most: a broken fan-out fails instead of hanging


@contextlib.asynccontextmanager
async def worker(
    database: MigratedDatabase, project: Project, model: GatedModel, limits: FollowerLimits | None = None
) -> AsyncIterator[Worker]:
    """One process's worth: its own store (pool, listener, followers) and its own HTTP server."""
    store = await PostgresStore.open(database.app_dsn, max_size=4, follower_limits=limits or FollowerLimits())
    agent = define_agent(name="followed", instructions="Answer.")
    app = create_agent_worker(
        env=project.env, routes=chat_routes(agent=agent, store=store, model=model, context=lambda turn: turn)
    )
    try:
        async with served_here(app) as url:
            try:
                yield Worker(url=url, store=store)
            finally:
                model.gate.set()  # a failed test must not leave a turn waiting forever
    finally:
        await store.close()


async def in_flight(store: PostgresStore, identity: StoreIdentity, conversation: str) -> str:
    """The conversation's running turn's id, once it is created and its turn claimed."""
    async with asyncio.timeout(WAIT):
        while True:
            with contextlib.suppress(NotFoundError):
                current = await store.live_turns().live_run(identity, conversation)
                if current is not None:
                    return current.run_id
            await asyncio.sleep(0.02)


async def until(condition: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0.01)


async def read_followed(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> str:
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        return (await response.aread()).decode()


@contextlib.asynccontextmanager
async def following(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> AsyncIterator[None]:
    """A follower holding its stream open until the block ends (then it disconnects)."""
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        yield


async def refused(http: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> httpx2.Response:
    response = await http.get(url, headers=headers)
    assert response.status_code == 429, response.text
    return response


async def test_followers_of_one_turn_in_one_process_share_one_reader_and_all_get_the_whole_stream(
    migrated_database: MigratedDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = Project()
    model = GatedModel(["Hel", "lo"], [", ", "wor", "ld."])
    ada = str(uuid.uuid4())
    conversation = str(uuid.uuid4())
    readers: dict[str, set[asyncio.Task[Any] | None]] = {}
    read = PostgresLiveTurns._read

    async def counted_read(
        self: PostgresLiveTurns, identity: StoreIdentity, run_id: str, *args: Any, **kwargs: Any
    ) -> Any:
        # Who reads the log from the database: one task (one reader) per turn, not one per follower.
        readers.setdefault(run_id, set()).add(asyncio.current_task())
        return await read(self, identity, run_id, *args, **kwargs)

    monkeypatch.setattr(PostgresLiveTurns, "_read", counted_read)
    followers = 8
    async with (
        worker(migrated_database, project, model) as first,
        worker(migrated_database, project, model) as second,
        httpx2.AsyncClient(timeout=WAIT) as http,
    ):
        posted = await start_turn(http, first.url, project.headers(ada), conversation, "hi")
        await model.waiting.wait()
        run_id = await in_flight(second.store, StoreIdentity(user_id=ada, tenant_id=TENANT), conversation)
        url = f"{second.url}/api/chat/{conversation}/stream"
        reads = [
            asyncio.ensure_future(read_followed(http, url, project.headers(ada))) for _ in range(followers)
        ]
        live = second.store.live_turns()
        await until(lambda: live.followers.count(ada) == followers)
        assert live.followers.readers == 1
        model.gate.set()
        streams = await asyncio.gather(*reads)
        response = await posted
        assert response.status_code == 200
        whole = sse_chunks(response.text)
        assert "".join(c["delta"] for c in whole if c["type"] == "text-delta") == "Hello, world."
        for text in streams:
            assert sse_chunks(text) == whole
            assert text.endswith("data: [DONE]\n\n")
        assert len(readers[run_id]) == 1, f"{len(readers[run_id])} readers for {followers} followers"
        # The reader stopped with the turn, and every place is free again.
        await until(lambda: live.followers.readers == 0 and live.followers.count(ada) == 0)


async def test_a_follower_past_the_cap_gets_429_with_retry_after_and_a_place_frees_when_one_leaves(
    migrated_database: MigratedDatabase,
) -> None:
    project = Project()
    model = GatedModel(["Hel", "lo"], [", ", "world."])
    ada = str(uuid.uuid4())
    identity = StoreIdentity(user_id=ada, tenant_id=TENANT)
    one, other = str(uuid.uuid4()), str(uuid.uuid4())
    limits = FollowerLimits(per_user=3, per_turn=2, retry_after_seconds=7)
    async with (
        worker(migrated_database, project, model, limits) as first,
        httpx2.AsyncClient(timeout=WAIT) as http,
    ):
        headers = project.headers(ada)
        turns = [await start_turn(http, first.url, headers, c, "hi") for c in (one, other)]
        for conversation in (one, other):
            await in_flight(first.store, identity, conversation)
        live = first.store.live_turns()
        url_one, url_other = (f"{first.url}/api/chat/{c}/stream" for c in (one, other))
        async with contextlib.AsyncExitStack() as held:
            await held.enter_async_context(following(http, url_one, headers))
            async with following(http, url_one, headers):
                # The turn has its fill (per_turn = 2).
                turn_full = await refused(http, url_one, headers)
                assert turn_full.json()["code"] == "too_many_followers"
                assert turn_full.headers["retry-after"] == "7"
                async with following(http, url_other, headers):
                    # The user has its fill (per_user = 3), whichever turn the next one follows.
                    user_full = await refused(http, url_other, headers)
                    assert user_full.json()["code"] == "too_many_followers"
                    assert user_full.headers["retry-after"] == "7"
                    assert live.followers.count(ada) == 3
                # The follower that disconnected left at once: its place is free.
                await until(lambda: live.followers.count(ada) == 2)
                async with following(http, url_other, headers):
                    assert live.followers.count(ada) == 3
            await until(lambda: live.followers.count(ada) == 1)
        # The last follower of each turn gone, no reader is left running.
        await until(lambda: live.followers.readers == 0 and live.followers.count(ada) == 0)
        model.gate.set()
        for turn in turns:
            assert (await turn).status_code == 200


async def test_another_users_follower_is_unaffected_by_a_user_at_the_cap_and_never_shares_a_reader(
    migrated_database: MigratedDatabase,
) -> None:
    project = Project()
    model = GatedModel(["Hel", "lo"], [", ", "world."])
    ada, grace = str(uuid.uuid4()), str(uuid.uuid4())
    ada_identity = StoreIdentity(user_id=ada, tenant_id=TENANT)
    grace_identity = StoreIdentity(user_id=grace, tenant_id=TENANT)
    ada_conversation, grace_conversation = str(uuid.uuid4()), str(uuid.uuid4())
    limits = FollowerLimits(per_user=2, per_turn=3)  # Ada reaches her cap, her turn has room
    async with (
        worker(migrated_database, project, model, limits) as first,
        httpx2.AsyncClient(timeout=WAIT) as http,
    ):
        ada_turn = await start_turn(http, first.url, project.headers(ada), ada_conversation, "hi")
        grace_turn = await start_turn(http, first.url, project.headers(grace), grace_conversation, "hi")
        ada_run = await in_flight(first.store, ada_identity, ada_conversation)
        await in_flight(first.store, grace_identity, grace_conversation)
        ada_url = f"{first.url}/api/chat/{ada_conversation}/stream"
        grace_url = f"{first.url}/api/chat/{grace_conversation}/stream"
        live = first.store.live_turns()
        async with (
            following(http, ada_url, project.headers(ada)),
            following(http, ada_url, project.headers(ada)),
        ):
            assert (await refused(http, ada_url, project.headers(ada))).json()["code"] == "too_many_followers"
            # Ada's run id named by Grace gets a reader of Grace's own (under her rights): nothing of Ada's.
            foreign, received = live.follow(grace_identity, ada_run), []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    async for chunk in foreign:
                        received.append(chunk)
            await foreign.aclose()
            assert received == []
            grace_read = asyncio.ensure_future(read_followed(http, grace_url, project.headers(grace)))
            await until(lambda: live.followers.count(grace) == 1)
            assert live.followers.readers == 2
            model.gate.set()
            grace_stream = await grace_read
        grace_response = await grace_turn
        assert sse_chunks(grace_stream) == sse_chunks(grace_response.text)
        assert "".join(c["delta"] for c in sse_chunks(grace_stream) if c["type"] == "text-delta") == (
            "Hello, world."
        )
        assert (await ada_turn).status_code == 200


def test_follower_limits_refuse_a_cap_below_one() -> None:
    with pytest.raises(ValueError, match="per_turn"):
        FollowerLimits(per_turn=0)


async def running_turn(store: PostgresStore) -> tuple[StoreIdentity, str]:
    """A claimed turn nothing streams: its log is written by hand."""
    from bastion import start_agent_run
    from bastion.stores import TurnContext

    identity = StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=TENANT)
    conversation = (await store.create_conversation(identity, title="t")).id
    run = await start_agent_run(
        persistence=store.persistence(),
        context=TurnContext(identity=identity, conversation_id=conversation, request_id=str(uuid.uuid4())),
        messages=[{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        trigger="submit-message",
    )
    return identity, run.state.run_id


async def test_followers_of_a_closing_store_end_short_so_their_clients_resume(store: PostgresStore) -> None:
    from bastion.chat.endpoint import _events

    identity, run_id = await running_turn(store)
    live = store.live_turns()
    log = live.log(identity, run_id, on_stop=lambda: None)
    log.add({"type": "start", "messageId": "a1"})
    await log.flush()
    events = _events(aiter(live.follow(identity, run_id)))
    async with asyncio.timeout(WAIT):
        assert await anext(events) == b'data: {"type":"start","messageId":"a1"}\n\n'
        await live.followers.close()
        assert [event async for event in events] == []  # no `[DONE]`: the stream was cut short
    assert live.followers.readers == 0
    await log.close()


async def test_a_follower_is_sent_what_each_read_brought_in_one_write(store: PostgresStore) -> None:
    from bastion.chat.endpoint import _grouped_events

    identity, run_id = await running_turn(store)
    live = store.live_turns()
    log = live.log(identity, run_id, on_stop=lambda: None)
    for chunk in ({"type": "start"}, {"type": "start-step"}, {"type": "text-start", "id": "t"}):
        log.add(chunk)
    await log.flush()
    followed = live.follow(identity, run_id)
    events = _grouped_events(followed.groups())
    async with asyncio.timeout(WAIT):
        first = await anext(events)  # one write carries the three chunks the first read brought
        assert [chunk["type"] for chunk in sse_chunks(first.decode())] == [
            "start",
            "start-step",
            "text-start",
        ]
        log.add({"type": "text-delta", "id": "t", "delta": "Hi"})
        log.add({"type": "finish"})
        await log.close()
        rest = [event async for event in events]
    assert [chunk["type"] for chunk in sse_chunks(rest[0].decode())] == ["text-delta", "finish"]
    assert rest[1:] == [b"data: [DONE]\n\n"]
    assert live.followers.readers == 0
