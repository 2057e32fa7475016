-- A deleted run takes its stored recall answers with it. A turn stores what it recalled under its
-- operation id (`recall/{scope}/{operation}` in scope `bastion-ops`), and bastion's turns name the
-- operation by their run; runs go only with their conversation, so deleting a conversation deletes the
-- recall records of its turns in the same transaction. Memories themselves are the user's, not the
-- conversation's, and stay (the user forgets them one by one).
--
-- Repair, once: recall records named by a run id that no run of their owner has any more (a record is a
-- cache of one operation's answer: one deleted by mistake is recalled afresh when asked again).

create function bastion.memory_forget_deleted_runs() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  delete from bastion.memory_documents d using deleted_runs r
   where d.owner_id = r.owner_id and d.tenant_id is not distinct from r.tenant_id
     and d.scope = 'bastion-ops' and d.path like 'recall/%'
     and split_part(d.path, '/', 3) = r.id::text;
  return null;
end
$$;

create trigger memory_runs_deleted after delete on bastion.runs
  referencing old table as deleted_runs
  for each statement execute function bastion.memory_forget_deleted_runs();

revoke execute on function bastion.memory_forget_deleted_runs() from public;

delete from bastion.memory_documents d
 where d.scope = 'bastion-ops' and d.path like 'recall/%'
   and split_part(d.path, '/', 3) ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
   and not exists (
     select 1 from bastion.runs r
      where r.id = split_part(d.path, '/', 3)::uuid and r.owner_id = d.owner_id
   );
