-- Each user's usage, counted by the assistant's `usage` hook from the finished runs' events: runs and
-- tokens per user and tenant. `usage_events` holds the events already counted, so an event delivered
-- again counts once. Users read their own totals; only the application server writes them.
create table assistant.usage (
  owner_id uuid not null,
  tenant_id text,
  runs bigint not null default 0,
  input_tokens bigint not null default 0,
  output_tokens bigint not null default 0,
  total_tokens bigint not null default 0,
  updated_at timestamptz not null default now(),
  unique nulls not distinct (owner_id, tenant_id)
);

create table assistant.usage_events (
  event_id bigint primary key,
  counted_at timestamptz not null default now()
);

alter table assistant.usage enable row level security;
alter table assistant.usage force row level security;
alter table assistant.usage_events enable row level security;
alter table assistant.usage_events force row level security;

create policy usage_is_their_owners on assistant.usage for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));
create policy usage_runtime on assistant.usage for all to bastion_runtime using (true) with check (true);
create policy usage_events_runtime on assistant.usage_events for all to bastion_runtime
  using (true) with check (true);

grant usage on schema assistant to bastion_runtime;
grant select on assistant.usage to authenticated;
grant select, insert, update on assistant.usage, assistant.usage_events to bastion_runtime;
