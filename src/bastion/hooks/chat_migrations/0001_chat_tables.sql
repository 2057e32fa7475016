-- The canonical chat tables `persist_sessions` copies conversations into, in the shape of
-- better-supabase's AI chat block: one chat per conversation, a message tree in the canonical AI
-- message format (the assistant's with its native AI SDK copy) and one run per turn. Applied as the
-- `chat_tables` component, after bastion's and the hooks' migrations.
--
-- A chat's id is derived from its conversation's (`bastion.hooks.chat_id_of`), run ids are the
-- runs' own. The tree: `parent_id` is the message before; an edit or a regeneration leaves the old
-- branch in place and moves `current_leaf_id`, so the path from the leaf is the conversation.
-- Every row records the outbox event that wrote it last (`event_id`): an event is applied only over
-- older ones, so a redelivered or replayed event stores nothing new.
--
-- Users read their own rows inside their tenant, like conversations; only the application server
-- (a member of `bastion_runtime`) writes them.

create table bastion.ai_chats (
  id uuid primary key,
  conversation_id uuid not null unique,
  owner_id uuid not null,
  tenant_id text,
  agent_id text check (char_length(agent_id) <= 200),
  title text not null default '' check (char_length(title) <= 500),
  current_leaf_id text,
  active_run_id uuid,
  leaf_event_id bigint not null default 0,
  last_message_at timestamptz not null default now(),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);
create index ai_chats_owner_recent on bastion.ai_chats (owner_id, last_message_at desc);

create table bastion.ai_messages (
  chat_id uuid not null references bastion.ai_chats (id) on delete cascade,
  id text not null check (char_length(id) between 1 and 200),
  parent_id text,
  owner_id uuid not null,
  tenant_id text,
  role text not null check (role in ('system', 'user', 'assistant', 'tool')),
  parts jsonb not null default '[]' check (
    jsonb_typeof(parts) = 'array'
    and not jsonb_path_exists(parts, '$[*] ? (!(@.type == "text" || @.type == "reasoning" || @.type == "file" || @.type == "tool-call" || @.type == "tool-result" || @.type == "tool-approval" || @.type == "source" || @.type == "data" || @.type == "step"))')
  ),
  format text not null default 'canonical' check (char_length(format) between 1 and 50),
  native jsonb,
  metadata jsonb not null default '{}' check (jsonb_typeof(metadata) = 'object'),
  status text not null default 'complete' check (status in ('complete', 'aborted', 'error')),
  run_id uuid,
  event_id bigint not null,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  primary key (chat_id, id)
);
create index ai_messages_parent on bastion.ai_messages (chat_id, parent_id);
create index ai_messages_owner on bastion.ai_messages (owner_id);

create table bastion.ai_runs (
  id uuid primary key,
  chat_id uuid not null references bastion.ai_chats (id) on delete cascade,
  owner_id uuid not null,
  tenant_id text,
  assistant_message_id text,
  engine text not null default 'bastion' check (char_length(engine) between 1 and 50),
  status text not null default 'running' check (
    status in ('running', 'waiting_for_approval', 'completed', 'failed', 'cancelled', 'interrupted')
  ),
  usage jsonb not null default '{}' check (jsonb_typeof(usage) = 'object'),
  event_id bigint not null,
  started_at timestamptz not null default now(),
  ended_at timestamptz
);
create index ai_runs_chat on bastion.ai_runs (chat_id, started_at desc);
create index ai_runs_owner on bastion.ai_runs (owner_id);

revoke all on bastion.ai_chats, bastion.ai_messages, bastion.ai_runs from public, anon, authenticated;
grant select on bastion.ai_chats, bastion.ai_messages, bastion.ai_runs to authenticated;
grant select, insert, update on bastion.ai_chats, bastion.ai_messages, bastion.ai_runs to bastion_runtime;
grant all on bastion.ai_chats, bastion.ai_messages, bastion.ai_runs to service_role;

alter table bastion.ai_chats enable row level security;
alter table bastion.ai_chats force row level security;
alter table bastion.ai_messages enable row level security;
alter table bastion.ai_messages force row level security;
alter table bastion.ai_runs enable row level security;
alter table bastion.ai_runs force row level security;

create policy ai_chats_owner on bastion.ai_chats for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));
create policy ai_messages_owner on bastion.ai_messages for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));
create policy ai_runs_owner on bastion.ai_runs for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));

-- The server writes as itself, never as a user: these policies bind only outside `authenticated`.
create policy ai_chats_runtime on bastion.ai_chats for all to bastion_runtime using (true) with check (true);
create policy ai_messages_runtime on bastion.ai_messages for all to bastion_runtime
  using (true) with check (true);
create policy ai_runs_runtime on bastion.ai_runs for all to bastion_runtime using (true) with check (true);
