-- Each replay of a hook: the generation it began and the position it delivers again from. A delivery
-- that ended in an error is settled by a later generation's replay from a position before its first
-- event, which delivers that event and every one after it again.

create table bastion.hook_replays (
  hook text not null references bastion.hook_subscriptions (hook) on delete cascade,
  generation integer not null,
  position_tx xid8 not null,
  position_id bigint not null,
  replayed_at timestamptz not null default now(),
  primary key (hook, generation)
);

revoke all on bastion.hook_replays from public, anon, authenticated;
grant select, insert, delete on bastion.hook_replays to bastion_runtime;
grant all on bastion.hook_replays to service_role;
alter table bastion.hook_replays enable row level security;
alter table bastion.hook_replays force row level security;
create policy hook_replays_runtime on bastion.hook_replays for all to bastion_runtime
  using (true) with check (true);
