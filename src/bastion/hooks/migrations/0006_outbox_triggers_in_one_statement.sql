-- The outbox's triggers as in 0005, with fewer statements on the turn's path: they write the same
-- rows. Each statement a trigger runs pays the executor's setup again, which with many turns at once
-- cost more than the rows themselves: the sign-in is now read in the insert itself, once per
-- statement (it was a call of `hook_signed_in`, a function with its own `search_path`, so never
-- inlined), and whether a dispatcher wants a wake-up is read in the same statement as the insert.

create or replace function bastion.hook_record_run_events() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_notify boolean;
begin
  with written as (
    insert into bastion.hook_events
      (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data, run_event_id)
    select n.conversation_id, n.run_id, n.owner_id, n.tenant_id,
           (select coalesce(auth.jwt() ->> 'is_anonymous', 'false') <> 'true'), n.type, n.data, n.id
      from new_events n
     order by n.id
    returning 1
  )
  select w.wanted and exists (select 1 from written) into v_notify from bastion.hook_wakeups w;
  if v_notify then
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
declare
  v_notify boolean;
begin
  with written as (
    insert into bastion.hook_events (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data)
    select n.conversation_id, running.id, n.owner_id, n.tenant_id,
           (select coalesce(auth.jwt() ->> 'is_anonymous', 'false') <> 'true'),
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
      left join lateral (
        select r.id from bastion.runs r
         where r.conversation_id = n.conversation_id and r.status = 'running'
         order by r.started_at desc
         limit 1
      ) running on true
     order by n.seq
    returning 1
  )
  select w.wanted and exists (select 1 from written) into v_notify from bastion.hook_wakeups w;
  if v_notify then
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
declare
  v_notify boolean;
begin
  with written as (
    insert into bastion.hook_events (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data)
    select o.conversation_id, running.id, o.owner_id, o.tenant_id,
           (select coalesce(auth.jwt() ->> 'is_anonymous', 'false') <> 'true'), 'message.deleted',
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
      left join lateral (
        select r.id from bastion.runs r
         where r.conversation_id = o.conversation_id and r.status = 'running'
         order by r.started_at desc
         limit 1
      ) running on true
     where exists (select 1 from bastion.conversations c where c.id = o.conversation_id)
     order by o.conversation_id, o.seq desc
    returning 1
  )
  select w.wanted and exists (select 1 from written) into v_notify from bastion.hook_wakeups w;
  if v_notify then
    perform pg_notify('bastion_hooks', '');
  end if;
  return null;
end
$$;
