-- bastion's schema: conversations, their messages, runs, run events, tool executions and feedback,
-- each protected by row-level security that reads the caller's identity the way Supabase sets it.

-- Supabase's API roles, created only where absent (plain Postgres), so the same migrations run on a
-- Supabase project. `bastion_runtime` marks the application server's login role: only a session
-- whose login role is a member may write a turn (see 0003).
do $roles$
begin
  begin
    create role anon nologin noinherit;
  exception when duplicate_object then null;
  end;
  begin
    create role authenticated nologin noinherit;
  exception when duplicate_object then null;
  end;
  begin
    create role service_role nologin noinherit bypassrls;
  exception
    when duplicate_object then null;
    when insufficient_privilege then create role service_role nologin noinherit;
  end;
  begin
    create role bastion_runtime nologin noinherit;
  exception when duplicate_object then null;
  end;
end
$roles$;

-- Supabase's `auth.uid()` and `auth.jwt()`, with its definitions, where the project does not have them.
create schema if not exists auth;
grant usage on schema auth to anon, authenticated, service_role;

do $helpers$
begin
  if to_regprocedure('auth.uid()') is null then
    create function auth.uid() returns uuid
      language sql stable
      as $fn$
        select coalesce(
          nullif(current_setting('request.jwt.claim.sub', true), ''),
          (nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'sub')
        )::uuid
      $fn$;
  end if;
  if to_regprocedure('auth.jwt()') is null then
    create function auth.jwt() returns jsonb
      language sql stable
      as $fn$
        select coalesce(
          nullif(current_setting('request.jwt.claim', true), ''),
          nullif(current_setting('request.jwt.claims', true), '')
        )::jsonb
      $fn$;
  end if;
end
$helpers$;

create schema if not exists bastion;
grant usage on schema bastion to authenticated, service_role;

-- The caller's tenant: the server-controlled `app_metadata.tenant_id` claim, or null without one.
create function bastion.tenant_id() returns text
  language sql stable
  set search_path = ''
  as $$ select nullif(auth.jwt() -> 'app_metadata' ->> 'tenant_id', '') $$;

create table bastion.conversations (
  id uuid primary key default gen_random_uuid(),
  owner_id uuid not null default auth.uid(),
  tenant_id text default bastion.tenant_id(),
  title text check (char_length(title) <= 500),
  revision bigint not null default 0,
  active_run_id uuid,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  unique (id, owner_id)
);
create index conversations_owner_recent on bastion.conversations (owner_id, updated_at desc);

-- Owner and tenant are not denormalised here yet: 0002 adds and backfills them (the upgrade path).
create table bastion.messages (
  conversation_id uuid not null references bastion.conversations (id) on delete cascade,
  seq bigint not null check (seq > 0),
  id text not null check (char_length(id) between 1 and 200),
  role text not null check (role in ('user', 'assistant')),
  message jsonb not null,
  created_at timestamptz not null default now(),
  primary key (conversation_id, seq),
  unique (conversation_id, id),
  check (message ->> 'id' = id and message ->> 'role' = role)
);

create table bastion.runs (
  id uuid primary key,
  conversation_id uuid not null,
  owner_id uuid not null,
  tenant_id text,
  request_id text not null check (char_length(request_id) between 1 and 200),
  status text not null check (
    status in ('running', 'waiting_for_approval', 'completed', 'failed', 'cancelled', 'interrupted')
  ),
  lease_expires_at timestamptz not null,
  started_at timestamptz not null default now(),
  finished_at timestamptz,
  unique (conversation_id, request_id),
  foreign key (conversation_id, owner_id)
    references bastion.conversations (id, owner_id) on delete cascade
);

-- The one ordered event stream of a conversation; `id` is the replay cursor. Event data never
-- holds tool inputs, error text or approval reasons.
create table bastion.run_events (
  id bigint generated always as identity primary key,
  conversation_id uuid not null,
  run_id uuid not null,
  owner_id uuid not null,
  tenant_id text,
  type text not null check (
    type in (
      'run.started', 'tool.started', 'tool.completed', 'tool.failed', 'approval.requested',
      'approval.responded', 'run.waiting_for_approval', 'run.completed', 'run.failed',
      'run.cancelled', 'run.interrupted'
    )
  ),
  data jsonb not null default '{}'::jsonb,
  created_at timestamptz not null default now(),
  foreign key (conversation_id, owner_id)
    references bastion.conversations (id, owner_id) on delete cascade
);
create index run_events_replay on bastion.run_events (conversation_id, id);

-- Operation claims: a tool call runs at most once per conversation.
create table bastion.tool_executions (
  conversation_id uuid not null,
  tool_call_id text not null check (char_length(tool_call_id) between 1 and 200),
  run_id uuid not null,
  owner_id uuid not null,
  tenant_id text,
  tool_name text not null check (char_length(tool_name) between 1 and 200),
  input jsonb,
  status text not null check (status in ('in_flight', 'completed', 'failed')),
  output jsonb,
  started_at timestamptz not null default now(),
  finished_at timestamptz,
  primary key (conversation_id, tool_call_id),
  foreign key (conversation_id, owner_id)
    references bastion.conversations (id, owner_id) on delete cascade
);

create table bastion.feedback (
  conversation_id uuid not null,
  message_id text not null,
  owner_id uuid not null default auth.uid(),
  tenant_id text default bastion.tenant_id(),
  rating text not null check (rating in ('up', 'down')),
  comment text check (char_length(comment) <= 4000),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  primary key (conversation_id, message_id, owner_id),
  foreign key (conversation_id, message_id)
    references bastion.messages (conversation_id, id) on delete cascade,
  foreign key (conversation_id, owner_id)
    references bastion.conversations (id, owner_id) on delete cascade
);

-- Explicit grants: new tables are not granted to the API roles automatically. Users create, rename
-- and delete their conversations and rate messages; everything else they may only read. Owner,
-- tenant and revision are not writable columns: the defaults above inject the caller's identity.
revoke all on all tables in schema bastion from public, anon, authenticated;
grant select, delete on bastion.conversations to authenticated;
grant insert (id, title) on bastion.conversations to authenticated;
grant update (title, updated_at) on bastion.conversations to authenticated;
grant select on bastion.messages, bastion.runs, bastion.run_events, bastion.tool_executions
  to authenticated;
grant select, delete on bastion.feedback to authenticated;
grant insert (conversation_id, message_id, rating, comment) on bastion.feedback to authenticated;
grant update (rating, comment, updated_at) on bastion.feedback to authenticated;
grant all on all tables in schema bastion to service_role;

alter table bastion.conversations enable row level security;
alter table bastion.conversations force row level security;
alter table bastion.messages enable row level security;
alter table bastion.messages force row level security;
alter table bastion.runs enable row level security;
alter table bastion.runs force row level security;
alter table bastion.run_events enable row level security;
alter table bastion.run_events force row level security;
alter table bastion.tool_executions enable row level security;
alter table bastion.tool_executions force row level security;
alter table bastion.feedback enable row level security;
alter table bastion.feedback force row level security;

-- A user reaches only their own rows, and only inside the tenant of their token: a token with a
-- tenant claim sees that tenant's rows, a token without one sees rows created without a tenant.
-- `(select ...)` makes each helper an init plan evaluated once per statement, not once per row.
create policy conversations_owner on bastion.conversations for all to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()))
  with check (
    owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id())
  );

create policy messages_owner on bastion.messages for select to authenticated
  using (exists (select 1 from bastion.conversations c where c.id = conversation_id));

create policy runs_owner on bastion.runs for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));

create policy run_events_owner on bastion.run_events for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));

create policy tool_executions_owner on bastion.tool_executions for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));

-- Feedback only on a message of a conversation the caller can see.
create policy feedback_owner on bastion.feedback for all to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()))
  with check (
    owner_id = (select auth.uid())
    and tenant_id is not distinct from (select bastion.tenant_id())
    and exists (select 1 from bastion.conversations c where c.id = conversation_id)
  );
