"""The assistant's usage counter: a batch of finished runs, delivered twice by id, counts each run once
per user and tenant, as single events do, reading each run's usage from the outbox."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from bastion.assistant.hooks import usage_counter
from bastion.hooks import PostgresHookOutbox
from bastion.stores import PostgresStore, apply_application_migrations, available_migrations
from tests.hooks_db import HooksDatabase, someone


def finished(database: HooksDatabase, user: str, tenant: str | None, tokens: int | None) -> int:
    """A finished run's event in the outbox (with `tokens` as its usage, or none); its id."""
    usage = {"inputTokens": tokens, "outputTokens": 2 * tokens, "totalTokens": 3 * tokens} if tokens else None
    [(event_id,)] = database.rows(
        "insert into bastion.hook_events (conversation_id, owner_id, tenant_id, signed_in, type, data)"
        " values (gen_random_uuid(), %s, %s, true, 'run.completed', %s) returning id",
        user,
        tenant,
        Jsonb({} if usage is None else {"usage": usage}),
    )
    return int(event_id)


async def test_a_batch_of_runs_delivered_twice_counts_each_run_once_per_user_and_tenant(
    hooks_database: HooksDatabase, hooks_store: PostgresStore
) -> None:
    await apply_application_migrations(
        hooks_database.admin_dsn,
        component="assistant",
        migrations=available_migrations("bastion.assistant", "migrations"),
    )
    ada, bob = someone().user_id, someone().user_id
    hook = usage_counter(hooks_store)
    assert hook.handle_event_ids is not None
    batch = [finished(hooks_database, *run) for run in [(ada, "t", 10), (bob, None, 1), (ada, "t", 5)]]
    await hook.handle_event_ids(batch)
    await hook.handle_event_ids(batch)
    outbox = PostgresHookOutbox(hooks_store.pool)
    [again] = (await outbox.events([batch[1]])).values()
    [later] = (await outbox.events([finished(hooks_database, ada, None, 7)])).values()
    await hook.handle(again)
    await hook.handle(later)
    await hook.handle_event_ids([finished(hooks_database, bob, "t", None)])
    counted = hooks_database.rows(
        "select owner_id::text, tenant_id, runs, input_tokens, output_tokens, total_tokens"
        " from assistant.usage order by runs desc, tenant_id"
    )
    expected = [(ada, "t", 2, 15, 30, 45), (bob, None, 1, 1, 2, 3), (ada, None, 1, 7, 14, 21)]
    assert sorted(counted, key=str) == sorted([*expected, (bob, "t", 1, 0, 0, 0)], key=str)
