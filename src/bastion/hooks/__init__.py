"""Event hooks: every conversation's events delivered to application subscribers from a durable
outbox in Postgres, at least once and in order per conversation, each hook at its own position.

- `define_hook`, `Hook`, `HookRegistry`, `RetryPolicy`: named subscribers to event types
  (`EVENT_TYPES`); a handler gets a `HookEvent` whose `id` is stable across redeliveries.
- `apply_hooks_migrations`: the outbox, written by triggers in the transaction of each change.
- `HookDelivery`: this process's dispatcher and the hooks' DBOS queues (on `bastion.durable`).
- `persist_sessions`: the built-in hook copying conversations into the chat tables
  (`apply_chat_table_migrations`), with `chat_id_of` and `canonical_parts`.
- `autocommit_connection`: a pooled connection whose statements commit, for handlers that write.
- `PostgresHookOutbox`: positions, lag, failures and replay, for operators (`bastion hooks`);
  `HookEventPruned` (code `hook_event_pruned`) for a replay from a pruned event;
  `queued_deliveries` and `failed_deliveries`: delivery workflows unfinished, or ended in an error.
- `prune_outbox`, `prune_deliveries`: retention of what every hook has passed (`bastion hooks prune`);
  `PostgresHookOutbox.forget` and `forget_deliveries` retire a hook no longer registered
  (`bastion hooks forget`), whose position would otherwise hold retention back.

Needs Postgres and the `durable` extra.
"""

from bastion.hooks.canonical import canonical_parts, chat_id_of
from bastion.hooks.delivery import (
    HookDelivery,
    delivery_workflow_id,
    delivery_workflow_prefix,
    hook_queue_name,
)
from bastion.hooks.delivery_status import (
    FailedDelivery,
    failed_deliveries,
    failed_delivery_counts,
    queued_deliveries,
)
from bastion.hooks.events import EVENT_TYPES, HookEvent
from bastion.hooks.outbox import (
    EventWindow,
    ForgottenHook,
    HookEventPruned,
    HookFailure,
    HookStatus,
    PostgresHookOutbox,
    apply_chat_table_migrations,
    apply_hooks_migrations,
    autocommit_connection,
    hook_migrations,
)
from bastion.hooks.registry import (
    BatchHandler,
    EventIdsHandler,
    Hook,
    HookHandler,
    HookRegistry,
    RetryPolicy,
    define_hook,
)
from bastion.hooks.retention import (
    ForgottenDeliveries,
    Pruned,
    forget_deliveries,
    prune_deliveries,
    prune_outbox,
)
from bastion.hooks.sessions import PERSIST_SESSIONS_EVENTS, persist_sessions

__all__ = [
    "EVENT_TYPES",
    "PERSIST_SESSIONS_EVENTS",
    "BatchHandler",
    "EventIdsHandler",
    "EventWindow",
    "FailedDelivery",
    "ForgottenDeliveries",
    "ForgottenHook",
    "Hook",
    "HookDelivery",
    "HookEvent",
    "HookEventPruned",
    "HookFailure",
    "HookHandler",
    "HookRegistry",
    "HookStatus",
    "PostgresHookOutbox",
    "Pruned",
    "RetryPolicy",
    "apply_chat_table_migrations",
    "apply_hooks_migrations",
    "autocommit_connection",
    "canonical_parts",
    "chat_id_of",
    "define_hook",
    "delivery_workflow_id",
    "delivery_workflow_prefix",
    "failed_deliveries",
    "failed_delivery_counts",
    "forget_deliveries",
    "hook_migrations",
    "hook_queue_name",
    "persist_sessions",
    "prune_deliveries",
    "prune_outbox",
    "queued_deliveries",
]
