-- Retention: the application's role may delete outbox events every hook has passed
-- (`PostgresHookOutbox.prune`), and the outbox remembers the highest event id it pruned, so a
-- replay from a pruned event says so rather than that the event never existed.

create table bastion.hook_retention (
  singleton boolean primary key default true check (singleton),
  pruned_through_id bigint not null,
  pruned_at timestamptz not null default now()
);

revoke all on bastion.hook_retention from public, anon, authenticated;
grant select, insert, update on bastion.hook_retention to bastion_runtime;
grant all on bastion.hook_retention to service_role;
alter table bastion.hook_retention enable row level security;
alter table bastion.hook_retention force row level security;
create policy hook_retention_runtime on bastion.hook_retention for all to bastion_runtime
  using (true) with check (true);

grant delete on bastion.hook_events to bastion_runtime;
create policy hook_events_runtime_prune on bastion.hook_events for delete to bastion_runtime using (true);
