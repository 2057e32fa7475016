-- A conversation's chat rows live and die with it, and belong only to its owner.
--
-- * Deleting a conversation deletes its `ai_chats` row (and with it its messages and runs) in the
--   same transaction, whoever deletes it (the routes, or the user through the Data API).
-- * Every write checks its conversation as it applies (`bastion.apply_session_writes`, so every entry
--   point: `persist_session_outbox`, `persist_session_events` and the function itself): a write
--   applies only while its conversation exists and is owned by the write's owner and tenant, to a
--   chat whose id is the conversation's (`chat_id_of`) and whose row, if any, has that owner, and to
--   a run no other chat or owner holds. The writes and the deletes of a conversation are ordered by
--   a transaction advisory lock per conversation (shared for writes, which never wait on each other;
--   exclusive for a delete; never a row lock on the conversation, which its turns lock `nowait`): a
--   delete running at the same time waits for the write, then deletes what it wrote, or the write
--   waits for the delete and finds nothing to write to. So a late event of a deleted conversation
--   writes nothing, and a conversation id used again by another user starts a chat of theirs: it
--   never reaches the first owner's rows (a chat id stays derived from the conversation alone, so
--   existing chats keep their ids; ownership is checked instead).
--
-- Repair: chat rows of deleted conversations, or owned by someone other than their conversation's
-- owner (a deleted id used again), are deleted, as are messages and runs not owned by their chat's
-- owner; the conversations whose rows were another owner's are copied again from their events still
-- in the outbox (without the hook's agent and title, which the database does not know).

create function bastion.session_conversations(p_conversations uuid[])
  returns table (id uuid, owner_id uuid, tenant_id text)
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  perform pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtext('bastion.chat_tables'), pg_catalog.hashtext(x.id::text))
     from (select distinct u.id from unnest(p_conversations) u (id) order by u.id) x;
  -- A statement of its own, so it reads the conversations as they are once the locks are held.
  return query
    select c.id, c.owner_id, c.tenant_id from bastion.conversations c where c.id = any(p_conversations);
end
$$;

alter function bastion.apply_session_writes(bastion.session_write[]) rename to apply_session_writes_at_once;

create function bastion.apply_session_writes(p_writes bastion.session_write[]) returns void
  language plpgsql
  security invoker
  set search_path = ''
as $$
declare
  v_kept bastion.session_write[];
begin
  with w as (
    select u.*, u.ordinality as ord from unnest(p_writes) with ordinality u
  ),
  chats as (  -- each chat's conversation: named by its writes, else by its row
    select w.chat, coalesce((array_agg(w.conversation order by w.ord) filter (where w.conversation is not null))[1],
                            min(c.conversation_id::text)::uuid) as conversation,
           min(c.owner_id::text)::uuid as owner, min(c.tenant_id) as tenant, count(c.id) > 0 as has_row
      from w left join bastion.ai_chats c on c.id = w.chat
     group by w.chat
  ),
  live as (
    select * from bastion.session_conversations(array(select h.conversation from chats h))
  ),
  kept as (
    select w.*, h.conversation as chat_conversation
      from w
      join chats h on h.chat = w.chat
      join live o on o.id = h.conversation
     where o.owner_id = w.owner and o.tenant_id is not distinct from w.tenant
       and w.chat = bastion.chat_id_of(h.conversation)
       and (not h.has_row or (h.owner = w.owner and h.tenant is not distinct from w.tenant))
       and not exists (
         select 1 from bastion.ai_runs r
          where r.id = w.run and (r.chat_id <> w.chat or r.owner_id <> w.owner)
       )
  ),
  firsts as (  -- the first write kept of each chat names its conversation (its row is inserted first)
    select k.*, k.ord = min(k.ord) over (partition by k.chat) as first from kept k
  )
  select coalesce(array_agg(
           row(
             k.write, k.chat, k.owner, k.tenant, k.event, k.at,
             case when k.first then k.chat_conversation end, k.agent, k.title,
             k.run, k.status, k.message_status, k.usage,
             k.id, k.parent, k.role, k.parts, k.format, k.native, k.metadata
           )::bastion.session_write
           order by k.ord
         ), '{}')
    into v_kept
    from firsts k;
  if cardinality(v_kept) > 0 then
    perform bastion.apply_session_writes_at_once(v_kept);
  end if;
end
$$;

revoke execute on function bastion.session_conversations(uuid[]) from public, anon, authenticated;
grant execute on function bastion.session_conversations(uuid[]) to bastion_runtime;
revoke execute on function bastion.apply_session_writes(bastion.session_write[]) from public, anon, authenticated;
grant execute on function bastion.apply_session_writes(bastion.session_write[]) to bastion_runtime;

create function bastion.chat_forget_deleted_conversations() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  perform pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('bastion.chat_tables'), pg_catalog.hashtext(x.id::text))
     from (select distinct d.id from deleted_conversations d order by d.id) x;
  delete from bastion.ai_chats c using deleted_conversations d where c.conversation_id = d.id;
  return null;
end
$$;

create trigger chat_tables_conversations_deleted after delete on bastion.conversations
  referencing old table as deleted_conversations
  for each statement execute function bastion.chat_forget_deleted_conversations();

revoke execute on function bastion.chat_forget_deleted_conversations() from public;

-- Repair.
create temporary table repaired_conversations on commit drop as
  select c.conversation_id as id from bastion.ai_chats c
    join bastion.conversations v on v.id = c.conversation_id
   where v.owner_id <> c.owner_id or v.tenant_id is distinct from c.tenant_id;

delete from bastion.ai_chats c
 where not exists (
   select 1 from bastion.conversations v
    where v.id = c.conversation_id and v.owner_id = c.owner_id and v.tenant_id is not distinct from c.tenant_id
 );
delete from bastion.ai_messages m using bastion.ai_chats c
 where c.id = m.chat_id and (m.owner_id <> c.owner_id or m.tenant_id is distinct from c.tenant_id);
delete from bastion.ai_runs r using bastion.ai_chats c
 where c.id = r.chat_id and (r.owner_id <> c.owner_id or r.tenant_id is distinct from c.tenant_id);

select bastion.persist_session_outbox(
  array(
    select e.id from bastion.hook_events e
     where e.conversation_id in (select r.id from repaired_conversations r)
     order by e.tx, e.id
  ),
  null,
  ''
);
