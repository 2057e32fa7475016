-- Denormalise owner and tenant onto every message (seed 003's upgrade migration): row-level security
-- on messages then checks the row itself instead of joining the conversation, and existing rows are
-- backfilled from their conversation so historical messages stay visible to their owner.

alter table bastion.messages add column owner_id uuid, add column tenant_id text;

update bastion.messages m
set owner_id = c.owner_id, tenant_id = c.tenant_id
from bastion.conversations c
where c.id = m.conversation_id and m.owner_id is null;

alter table bastion.messages alter column owner_id set not null;

-- A message can never name an owner other than its conversation's (no reparenting).
alter table bastion.messages
  add constraint messages_conversation_owner foreign key (conversation_id, owner_id)
  references bastion.conversations (id, owner_id) on delete cascade;
create index messages_owner on bastion.messages (owner_id);

drop policy messages_owner on bastion.messages;
create policy messages_owner on bastion.messages for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));
