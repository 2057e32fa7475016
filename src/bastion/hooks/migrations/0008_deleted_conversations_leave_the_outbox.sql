-- A deleted conversation leaves the outbox: its events (which quote its messages) and the failures
-- recorded for them go in the transaction that deletes it, whoever deletes it (the routes, or the
-- user through the Data API), so no hook is handed them afterwards. A delivery already holding their
-- ids finds them gone and delivers nothing (`no longer in the outbox`); `persist_sessions` also
-- checks each event's conversation as it writes (the chat tables' migration 0005).
--
-- An index on the conversation makes that delete a lookup rather than a scan of the outbox.
--
-- Repair: events and failures of conversations deleted before this migration, and events whose
-- owner is not their conversation's (a deleted conversation's id used again by someone else).

create index hook_events_conversation on bastion.hook_events (conversation_id);

create function bastion.hook_forget_deleted_conversations() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  delete from bastion.hook_events e using deleted_conversations d where e.conversation_id = d.id;
  delete from bastion.hook_failures f using deleted_conversations d where f.conversation_id = d.id;
  return null;
end
$$;

create trigger hook_outbox_conversations_deleted after delete on bastion.conversations
  referencing old table as deleted_conversations
  for each statement execute function bastion.hook_forget_deleted_conversations();

revoke execute on function bastion.hook_forget_deleted_conversations() from public;

delete from bastion.hook_events e
 where not exists (
   select 1 from bastion.conversations c
    where c.id = e.conversation_id and c.owner_id = e.owner_id
      and c.tenant_id is not distinct from e.tenant_id
 );
delete from bastion.hook_failures f
 where not exists (select 1 from bastion.conversations c where c.id = f.conversation_id);
