-- The assistant's notes: one row per note, readable and writable only by its owner (and tenant) under
-- row-level security. The owner and tenant come from the verified claims, never from the client.
create schema if not exists assistant;
grant usage on schema assistant to authenticated;

create table assistant.notes (
  id uuid primary key default gen_random_uuid(),
  owner_id uuid not null default auth.uid(),
  tenant_id text default bastion.tenant_id(),
  body text not null check (char_length(body) between 1 and 2000),
  idempotency_key text not null check (char_length(idempotency_key) between 1 and 200),
  created_at timestamptz not null default now(),
  unique nulls not distinct (owner_id, tenant_id, idempotency_key)
);
create index notes_owner_recent on assistant.notes (owner_id, created_at desc);

alter table assistant.notes enable row level security;
alter table assistant.notes force row level security;

create policy notes_are_their_owners on assistant.notes
  for all to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()))
  with check (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));

grant select, delete on assistant.notes to authenticated;
grant insert (body, idempotency_key) on assistant.notes to authenticated;
