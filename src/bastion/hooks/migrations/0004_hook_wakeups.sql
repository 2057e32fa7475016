-- Wake-ups only while a dispatcher waits for them. A transaction that notifies takes, at commit, a
-- lock that every other notifying transaction's commit waits for, so at a busy system's rate every
-- turn's commit would queue behind the others'; a dispatcher with a batch in flight, or one due
-- soon, looks at the outbox again by itself. Dispatchers say when they wait (`wanted`); the outbox's
-- triggers notify only then. `wanted` starts true, so processes of an earlier version, which rely on
-- the notifications, are woken until a dispatcher of this version first says it needs none.

create table bastion.hook_wakeups (
  singleton boolean primary key default true check (singleton),
  wanted boolean not null default true
);
insert into bastion.hook_wakeups default values;

revoke all on bastion.hook_wakeups from public, anon, authenticated;
grant select, update on bastion.hook_wakeups to bastion_runtime;
grant all on bastion.hook_wakeups to service_role;
alter table bastion.hook_wakeups enable row level security;
alter table bastion.hook_wakeups force row level security;
create policy hook_wakeups_runtime on bastion.hook_wakeups for all to bastion_runtime
  using (true) with check (true);

-- The outbox's triggers as in 0001, notifying only while a dispatcher waits.

create or replace function bastion.hook_record_run_events() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  insert into bastion.hook_events
    (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data, run_event_id)
  select n.conversation_id, n.run_id, n.owner_id, n.tenant_id, bastion.hook_signed_in(), n.type, n.data, n.id
    from new_events n
   order by n.id;
  if found and (select w.wanted from bastion.hook_wakeups w) then
    perform pg_notify('bastion_hooks', '');
  end if;
  return null;
end
$$;

create or replace function bastion.hook_record_messages() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  insert into bastion.hook_events (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data)
  select n.conversation_id, bastion.hook_running_run(n.conversation_id), n.owner_id, n.tenant_id,
         bastion.hook_signed_in(),
         case n.role when 'user' then 'message.received' else 'message.completed' end,
         jsonb_build_object(
           'messageId', n.id,
           'seq', n.seq,
           'role', n.role,
           'parentId', (
             select p.id from bastion.messages p
              where p.conversation_id = n.conversation_id and p.seq < n.seq
              order by p.seq desc
              limit 1
           ),
           'message', n.message
         )
    from new_messages n
   order by n.seq;
  if found and (select w.wanted from bastion.hook_wakeups w) then
    perform pg_notify('bastion_hooks', '');
  end if;
  return null;
end
$$;

-- Rows dropped with their conversation report nothing: the conversation is gone with its events.
create or replace function bastion.hook_record_deleted_messages() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  insert into bastion.hook_events (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data)
  select o.conversation_id, bastion.hook_running_run(o.conversation_id), o.owner_id, o.tenant_id,
         bastion.hook_signed_in(), 'message.deleted',
         jsonb_build_object(
           'messageId', o.id,
           'seq', o.seq,
           'role', o.role,
           'parentId', (
             select p.id from (
               select m.seq, m.id from bastion.messages m
                where m.conversation_id = o.conversation_id and m.seq < o.seq
               union all
               select d.seq, d.id from old_messages d
                where d.conversation_id = o.conversation_id and d.seq < o.seq
             ) p
              order by p.seq desc
              limit 1
           )
         )
    from old_messages o
   where exists (select 1 from bastion.conversations c where c.id = o.conversation_id)
   order by o.conversation_id, o.seq desc;
  if found and (select w.wanted from bastion.hook_wakeups w) then
    perform pg_notify('bastion_hooks', '');
  end if;
  return null;
end
$$;
