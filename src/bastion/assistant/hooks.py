"""The assistant's event hooks: conversations copied into the chat tables (`persist_sessions`) and a
per-user usage counter, delivered on this process's durable engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from bastion.hooks import (
    Hook,
    HookEvent,
    HookRegistry,
    autocommit_connection,
    define_hook,
    persist_sessions,
)
from bastion.stores import PostgresStore

__all__ = ["FINISHED_RUNS", "assistant_hooks", "usage_counter"]

FINISHED_RUNS: Final = frozenset(
    {"run.completed", "run.failed", "run.cancelled", "run.waiting_for_approval", "run.interrupted"}
)

# A batch of finished runs in one statement, read from the outbox by id: the events not counted yet,
# summed per user and tenant (a run without usage counts with no tokens).
_COUNT: Final = """
with batch as (
  select e.id as event_id, e.owner_id, e.tenant_id,
         coalesce((e.data -> 'usage' ->> 'inputTokens')::bigint, 0) as input_tokens,
         coalesce((e.data -> 'usage' ->> 'outputTokens')::bigint, 0) as output_tokens,
         coalesce((e.data -> 'usage' ->> 'totalTokens')::bigint, 0) as total_tokens
    from bastion.hook_events e
   where e.id = any(%s)
),
counted as (
  insert into assistant.usage_events (event_id) select event_id from batch
  on conflict do nothing
  returning event_id
)
insert into assistant.usage as u (owner_id, tenant_id, runs, input_tokens, output_tokens, total_tokens)
select b.owner_id, b.tenant_id, count(*), sum(b.input_tokens), sum(b.output_tokens), sum(b.total_tokens)
  from batch b join counted c on c.event_id = b.event_id
 group by b.owner_id, b.tenant_id
on conflict (owner_id, tenant_id) do update
   set runs = u.runs + excluded.runs,
       input_tokens = u.input_tokens + excluded.input_tokens,
       output_tokens = u.output_tokens + excluded.output_tokens,
       total_tokens = u.total_tokens + excluded.total_tokens,
       updated_at = now()
"""


def usage_counter(store: PostgresStore) -> Hook:
    """Counts every finished run and its tokens per user and tenant (`assistant.usage`), each event once;
    a batch of runs in one statement, which reads the events from the outbox itself."""

    async def count_all(event_ids: Sequence[int]) -> None:
        async with autocommit_connection(store.pool) as conn:
            await conn.execute(_COUNT, (list(event_ids),))

    async def count(event: HookEvent) -> None:
        await count_all([event.id])

    return define_hook(
        "usage", events=FINISHED_RUNS, handle=count, handle_event_ids=count_all, start="earliest"
    )


def assistant_hooks(store: PostgresStore) -> HookRegistry:
    return HookRegistry([persist_sessions(store.pool, agent_id="assistant"), usage_counter(store)])
