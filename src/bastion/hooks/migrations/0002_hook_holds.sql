-- Conversations a hook's delivery has set aside: while a conversation has a row here, the hook's
-- batches hand its events to the conversation's own delivery (`workflow_id`, one row per such
-- delivery, each deleting its row when done) rather than deliver them themselves, so the
-- conversation's events stay in order behind the one being retried.

create table bastion.hook_holds (
  hook text not null references bastion.hook_subscriptions (hook) on delete cascade,
  conversation_id uuid not null,
  workflow_id text not null,
  created_at timestamptz not null default now(),
  primary key (hook, conversation_id, workflow_id)
);

revoke all on bastion.hook_holds from public, anon, authenticated;
grant select, insert, delete on bastion.hook_holds to bastion_runtime;
grant all on bastion.hook_holds to service_role;
alter table bastion.hook_holds enable row level security;
alter table bastion.hook_holds force row level security;
create policy hook_holds_runtime on bastion.hook_holds for all to bastion_runtime
  using (true) with check (true);
