"""The assistant's event hooks: conversations copied into the chat tables (`persist_sessions`) and a
per-user usage counter, delivered on this process's durable engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from bastion.hooks import Hook, HookEvent, HookRegistry, define_hook, persist_sessions
from bastion.stores import PostgresStore

__all__ = ["FINISHED_RUNS", "assistant_hooks", "usage_counter"]

FINISHED_RUNS: Final = frozenset(
    {"run.completed", "run.failed", "run.cancelled", "run.waiting_for_approval", "run.interrupted"}
)

_COUNT: Final = """
with counted as (
  insert into assistant.usage_events (event_id) values (%(event)s) on conflict do nothing returning event_id
)
insert into assistant.usage (owner_id, tenant_id, runs, input_tokens, output_tokens, total_tokens)
select %(owner)s, %(tenant)s, 1, %(input)s, %(output)s, %(total)s from counted
on conflict (owner_id, tenant_id) do update
   set runs = assistant.usage.runs + 1,
       input_tokens = assistant.usage.input_tokens + excluded.input_tokens,
       output_tokens = assistant.usage.output_tokens + excluded.output_tokens,
       total_tokens = assistant.usage.total_tokens + excluded.total_tokens,
       updated_at = now()
"""


def usage_counter(store: PostgresStore) -> Hook:
    """Counts every finished run and its tokens per user and tenant (`assistant.usage`), each event once;
    a batch of runs in one transaction."""

    async def count_all(events: Sequence[HookEvent]) -> None:
        async with store.pool.connection() as conn:
            if not conn.autocommit:
                await conn.set_autocommit(True)
            async with conn.transaction(), conn.pipeline():
                for event in events:
                    usage: dict[str, Any] = event.data.get("usage") or {}
                    await conn.execute(
                        _COUNT,
                        {
                            "event": event.id,
                            "owner": event.user_id,
                            "tenant": event.tenant_id,
                            "input": usage.get("inputTokens", 0),
                            "output": usage.get("outputTokens", 0),
                            "total": usage.get("totalTokens", 0),
                        },
                    )

    async def count(event: HookEvent) -> None:
        await count_all([event])

    return define_hook("usage", events=FINISHED_RUNS, handle=count, handle_batch=count_all, start="earliest")


def assistant_hooks(store: PostgresStore) -> HookRegistry:
    return HookRegistry([persist_sessions(store.pool, agent_id="assistant"), usage_counter(store)])
