-- bastion's SQLite schema: the tables of the Postgres store, for one process and no server.
-- SQLite has no roles or row-level security: owner and tenant are on every row, and every statement
-- of `bastion.stores.sqlite` filters on them. Times are microseconds since the Unix epoch (UTC); JSON
-- is text checked with `json_valid`. Names carry a `bastion_` prefix because a database file has no
-- schemas and may be shared with the application's own tables.

create table bastion_conversations (
  id text primary key check (length(id) = 36),
  owner_id text not null check (length(owner_id) = 36),
  tenant_id text check (tenant_id is null or length(tenant_id) between 1 and 200),
  title text check (title is null or length(title) <= 500),
  revision integer not null default 0 check (revision >= 0),
  active_run_id text,
  created_at integer not null,
  updated_at integer not null,
  unique (id, owner_id)
) strict;
create index bastion_conversations_owner_recent
  on bastion_conversations (owner_id, tenant_id, updated_at desc);

-- A message never names an owner other than its conversation's (the composite foreign key).
create table bastion_messages (
  conversation_id text not null,
  owner_id text not null,
  tenant_id text,
  seq integer not null check (seq > 0),
  id text not null check (length(id) between 1 and 200),
  role text not null check (role in ('user', 'assistant')),
  message text not null check (
    json_valid(message) and json_extract(message, '$.id') = id and json_extract(message, '$.role') = role
  ),
  created_at integer not null,
  primary key (conversation_id, seq),
  unique (conversation_id, id),
  foreign key (conversation_id, owner_id)
    references bastion_conversations (id, owner_id) on delete cascade
) strict;

create table bastion_runs (
  id text primary key,
  conversation_id text not null,
  owner_id text not null,
  tenant_id text,
  request_id text not null check (length(request_id) between 1 and 200),
  status text not null check (
    status in ('running', 'waiting_for_approval', 'completed', 'failed', 'cancelled', 'interrupted')
  ),
  lease_expires_at integer not null,
  started_at integer not null,
  finished_at integer,
  unique (conversation_id, request_id),
  foreign key (conversation_id, owner_id)
    references bastion_conversations (id, owner_id) on delete cascade
) strict;

-- The one ordered event stream of a conversation. AUTOINCREMENT: a cursor is never reused, even
-- after the newest events are deleted with their conversation.
create table bastion_run_events (
  id integer primary key autoincrement,
  conversation_id text not null,
  run_id text not null,
  owner_id text not null,
  tenant_id text,
  type text not null check (
    type in (
      'run.started', 'tool.started', 'tool.completed', 'tool.failed', 'approval.requested',
      'approval.responded', 'run.waiting_for_approval', 'run.completed', 'run.failed',
      'run.cancelled', 'run.interrupted'
    )
  ),
  data text not null default '{}' check (json_valid(data)),
  created_at integer not null,
  foreign key (conversation_id, owner_id)
    references bastion_conversations (id, owner_id) on delete cascade
) strict;
create index bastion_run_events_replay on bastion_run_events (conversation_id, id);

-- Operation claims: a tool call runs at most once per conversation. `input` is canonical JSON text
-- (sorted keys), compared as text.
create table bastion_tool_executions (
  conversation_id text not null,
  tool_call_id text not null check (length(tool_call_id) between 1 and 200),
  run_id text not null,
  owner_id text not null,
  tenant_id text,
  tool_name text not null check (length(tool_name) between 1 and 200),
  input text not null check (json_valid(input)),
  status text not null check (status in ('in_flight', 'completed', 'failed')),
  output text check (output is null or json_valid(output)),
  started_at integer not null,
  finished_at integer,
  primary key (conversation_id, tool_call_id),
  foreign key (conversation_id, owner_id)
    references bastion_conversations (id, owner_id) on delete cascade
) strict;

create table bastion_feedback (
  conversation_id text not null,
  message_id text not null,
  owner_id text not null,
  tenant_id text,
  rating text not null check (rating in ('up', 'down')),
  comment text check (comment is null or length(comment) <= 4000),
  created_at integer not null,
  updated_at integer not null,
  primary key (conversation_id, message_id, owner_id),
  foreign key (conversation_id, message_id)
    references bastion_messages (conversation_id, id) on delete cascade,
  foreign key (conversation_id, owner_id)
    references bastion_conversations (id, owner_id) on delete cascade
) strict;
