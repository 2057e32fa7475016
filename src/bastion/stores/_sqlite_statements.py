"""The SQLite store's named statements and the parameters every one of them takes.

SQLite has no roles and no row-level security, so the rules the database enforces for Postgres are
the statements' own: each one touching a row names the caller's owner id and tenant (`OWNED`, with
the parameters `scope` builds), so a foreign row is invisible exactly like a missing one. They are
kept together so that this can be read, and tested, in one place. Times are stored as microseconds
since the Unix epoch (`microseconds_now`), exact and ordered as integers.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from bastion.stores.entities import StoreIdentity

__all__ = [
    "ACTIVE_RUN",
    "APPEND_MESSAGE",
    "CLAIM_CONVERSATION",
    "CLAIM_TOOL",
    "CONVERSATION_EXISTS",
    "DELETE_CONVERSATION",
    "EXISTING_TOOL",
    "FIRST_NAMED_SEQ",
    "INSERT_EVENT",
    "INSERT_RUN",
    "INTERRUPT_RUN",
    "LAST_MESSAGE",
    "LAST_SEQ",
    "LIST_EVENTS",
    "LIST_MESSAGES",
    "OWNED",
    "RECLAIM_TOOL",
    "RELEASE_CONVERSATION",
    "RENEW_LEASE",
    "RENEW_WORKER_LEASES",
    "REPLACE_MESSAGE",
    "REQUEST_SEEN",
    "SETTLE_RUN",
    "SETTLE_TOOL",
    "TAIL",
    "TRUNCATE",
    "TURN_CONVERSATION",
    "UPSERT_FEEDBACK",
    "microseconds_now",
    "scope",
    "stored_time",
]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# `:owner` and `:tenant` are the caller's; every statement touching a row filters on them.
OWNED: Final = "owner_id = :owner and tenant_id is :tenant"

# The entity API.
DELETE_CONVERSATION: Final = f"delete from bastion_conversations where id = :id and {OWNED} returning id"
CONVERSATION_EXISTS: Final = f"select 1 from bastion_conversations where id = :id and {OWNED}"
LIST_MESSAGES: Final = (
    "select seq, id, role, message, created_at from bastion_messages "
    f"where conversation_id = :id and {OWNED} and seq > :after order by seq limit :limit"
)
UPSERT_FEEDBACK: Final = (
    "insert into bastion_feedback "
    "(conversation_id, message_id, owner_id, tenant_id, rating, comment, created_at, updated_at) "
    "select m.conversation_id, m.id, m.owner_id, m.tenant_id, :rating, :comment, :now, :now "
    "from bastion_messages m where m.conversation_id = :id and m.id = :message "
    "and m.owner_id = :owner and m.tenant_id is :tenant "
    "on conflict (conversation_id, message_id, owner_id) do update "
    "set rating = excluded.rating, comment = excluded.comment, updated_at = excluded.updated_at "
    "returning conversation_id, message_id, rating, comment, updated_at"
)
LIST_EVENTS: Final = (
    "select id, run_id, type, data, created_at from bastion_run_events "
    f"where conversation_id = :id and {OWNED} and id > :after order by id limit :limit"
)

# The turn protocol.
TURN_CONVERSATION: Final = (
    f"select revision, active_run_id from bastion_conversations where id = :id and {OWNED}"
)
ACTIVE_RUN: Final = (
    "select id, status, lease_expires_at, worker_key from bastion_runs "
    f"where id = :run and conversation_id = :id and {OWNED}"
)
REQUEST_SEEN: Final = (
    f"select 1 from bastion_runs where conversation_id = :id and {OWNED} and request_id = :request"
)
LAST_SEQ: Final = (
    f"select coalesce(max(seq), 0) from bastion_messages where conversation_id = :id and {OWNED}"
)
FIRST_NAMED_SEQ: Final = (
    f"select min(seq) from bastion_messages where conversation_id = :id and {OWNED} "
    "and id in (select value from json_each(:ids))"
)
TAIL: Final = (
    "select seq, message from bastion_messages "
    f"where conversation_id = :id and {OWNED} and seq >= :from order by seq"
)
INTERRUPT_RUN: Final = (
    f"update bastion_runs set status = 'interrupted', finished_at = :now where id = :run and {OWNED}"
)
INSERT_RUN: Final = (
    "insert into bastion_runs (id, conversation_id, owner_id, tenant_id, request_id, status, "
    "lease_expires_at, started_at, worker_key) "
    "values (:run, :id, :owner, :tenant, :request, 'running', :lease, :now, :worker)"
)
TRUNCATE: Final = f"delete from bastion_messages where conversation_id = :id and {OWNED} and seq > :after"
REPLACE_MESSAGE: Final = (
    "update bastion_messages set message = :message "
    f"where conversation_id = :id and {OWNED} and seq = :seq and id = :message_id and role = :role"
)
APPEND_MESSAGE: Final = (
    "insert into bastion_messages (conversation_id, owner_id, tenant_id, seq, id, role, message, created_at) "
    "values (:id, :owner, :tenant, :seq, :message_id, :role, :message, :now)"
)
LAST_MESSAGE: Final = (
    "select seq, id, role from bastion_messages "
    f"where conversation_id = :id and {OWNED} order by seq desc limit 1"
)
INSERT_EVENT: Final = (
    "insert into bastion_run_events (conversation_id, run_id, owner_id, tenant_id, type, data, created_at) "
    "values (:id, :run, :owner, :tenant, :type, :data, :now)"
)
CLAIM_CONVERSATION: Final = (
    "update bastion_conversations set revision = revision + 1, active_run_id = :run, updated_at = :now "
    f"where id = :id and {OWNED}"
)
RELEASE_CONVERSATION: Final = (
    "update bastion_conversations set revision = revision + 1, active_run_id = null, updated_at = :now "
    f"where id = :id and {OWNED}"
)
RENEW_LEASE: Final = f"update bastion_runs set lease_expires_at = :lease where id = :run and {OWNED}"
RENEW_WORKER_LEASES: Final = (
    "update bastion_runs set lease_expires_at = :lease "
    "where id in (select value from json_each(:runs)) and worker_key = :worker and status = 'running'"
)
SETTLE_RUN: Final = (
    f"update bastion_runs set status = :status, finished_at = :now where id = :run and {OWNED}"
)
CLAIM_TOOL: Final = (
    "insert into bastion_tool_executions (conversation_id, operation_key, tool_call_id, run_id, owner_id, "
    "tenant_id, tool_name, input, status, started_at) "
    "values (:id, :key, :call, :run, :owner, :tenant, :name, :input, 'in_flight', :now) "
    "on conflict (conversation_id, operation_key) do nothing"
)
EXISTING_TOOL: Final = (
    "select t.tool_name, t.input, t.status, t.output, r.status, r.lease_expires_at, r.worker_key "
    "from bastion_tool_executions t join bastion_runs r on r.id = t.run_id "
    "where t.conversation_id = :id and t.operation_key = :key "
    "and t.owner_id = :owner and t.tenant_id is :tenant"
)
RECLAIM_TOOL: Final = (
    "update bastion_tool_executions set run_id = :run, tool_call_id = :call, status = 'in_flight', "
    "output = null, started_at = :now, finished_at = null "
    f"where conversation_id = :id and operation_key = :key and {OWNED}"
)
SETTLE_TOOL: Final = (
    "update bastion_tool_executions set status = :status, output = :output, finished_at = :now "
    f"where conversation_id = :id and operation_key = :key and run_id = :run and {OWNED} "
    "and status = 'in_flight' returning tool_name, tool_call_id"
)


def scope(identity: StoreIdentity, conversation_id: str | None = None) -> dict[str, Any]:
    """The parameters every statement filters on: the caller's owner id and tenant."""
    return {"owner": identity.user_id, "tenant": identity.tenant_id, "id": conversation_id}


def microseconds_now() -> int:
    """Microseconds since the Unix epoch: exact, and ordered as integers."""
    return time.time_ns() // 1000


def stored_time(microseconds: int) -> datetime:
    """A stored time as an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=microseconds)
