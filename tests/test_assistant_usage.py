"""The assistant's usage counter: a batch of finished runs, delivered twice, counts each run once per
user and tenant, as single events do."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from bastion.assistant.hooks import usage_counter
from bastion.hooks import HookEvent
from bastion.stores import PostgresStore, apply_application_migrations, available_migrations
from tests.hooks_db import HooksDatabase, someone


def finished(event_id: int, user: str, tenant: str | None, tokens: int) -> HookEvent:
    usage: dict[str, Any] = {"inputTokens": tokens, "outputTokens": 2 * tokens, "totalTokens": 3 * tokens}
    return HookEvent(
        id=event_id,
        type="run.completed",
        conversation_id="00000000-0000-0000-0000-000000000000",
        run_id=None,
        user_id=user,
        tenant_id=tenant,
        signed_in=True,
        data={"usage": usage},
        run_event_id=None,
        created_at=datetime.now(UTC),
    )


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
    assert hook.handle_batch is not None
    batch = [finished(1, ada, "t", 10), finished(2, bob, None, 1), finished(3, ada, "t", 5)]
    await hook.handle_batch(batch)
    await hook.handle_batch(batch)
    await hook.handle(batch[1])
    await hook.handle(finished(4, ada, None, 7))
    counted = hooks_database.rows(
        "select owner_id::text, tenant_id, runs, input_tokens, output_tokens, total_tokens"
        " from assistant.usage order by runs desc, tenant_id"
    )
    assert sorted(counted, key=str) == sorted(
        [(ada, "t", 2, 15, 30, 45), (bob, None, 1, 1, 2, 3), (ada, None, 1, 7, 14, 21)], key=str
    )
