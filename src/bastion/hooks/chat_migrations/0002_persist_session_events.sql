-- `persist_sessions` writes a whole batch of events in one statement: this function applies them one
-- by one, in the order given, exactly as the statements it replaces did (one round trip instead of
-- one or two per event). Each element of `p_events` is one event's parameters, built by the hook:
--
--   write        what the event writes: `run_started`, `run_finished`, `message`, `deleted`, or null
--                (nothing but the chat row)
--   chat, owner, tenant, event, at   the chat's id, its owner and tenant, the event's id and time
--   conversation, agent, title       on the first event of each chat only: its `ai_chats` row, inserted
--                                    (if new) before that event's write
--   run, status, message_status, usage                          a run's
--   id, parent, role, parts, format, native, metadata           a message's (`id`, `parent`: deleted's)
--
-- Every write takes only newer events than the row's last (`event_id`), so a redelivered event
-- stores nothing new. The function runs as its caller (security invoker): the tables' grants and
-- row-level security apply as to the statements themselves, so only `bastion_runtime` may call it.

create function bastion.persist_session_events(p_events jsonb) returns void
  language plpgsql
  security invoker
  set search_path = ''
as $$
declare
  ev record;
begin
  for ev in
    select * from rows from (
      jsonb_to_recordset(p_events) as (
        write text, chat uuid, owner uuid, tenant text, event bigint, at timestamptz,
        conversation uuid, agent text, title text,
        run uuid, status text, message_status text, usage jsonb,
        id text, parent text, role text, parts jsonb, format text, native jsonb, metadata jsonb
      )
    ) with ordinality as x (
      write, chat, owner, tenant, event, at, conversation, agent, title, run, status, message_status,
      usage, id, parent, role, parts, format, native, metadata, ordinal
    )
    order by x.ordinal
  loop
    if ev.conversation is not null then
      insert into bastion.ai_chats (id, conversation_id, owner_id, tenant_id, agent_id, title, last_message_at)
      values (ev.chat, ev.conversation, ev.owner, ev.tenant, ev.agent, ev.title, ev.at)
      on conflict (id) do nothing;
    end if;

    if ev.write = 'run_started' then
      with opened as (
        insert into bastion.ai_runs (id, chat_id, owner_id, tenant_id, event_id, started_at)
        values (ev.run, ev.chat, ev.owner, ev.tenant, ev.event, ev.at)
        on conflict (id) do nothing
        returning id
      )
      update bastion.ai_chats c set active_run_id = o.id, updated_at = now()
        from opened o
       where c.id = ev.chat;

    elsif ev.write = 'run_finished' then
      with settled as (
        insert into bastion.ai_runs
          (id, chat_id, owner_id, tenant_id, status, usage, event_id, started_at, ended_at)
        values (ev.run, ev.chat, ev.owner, ev.tenant, ev.status, ev.usage, ev.event, ev.at, ev.at)
        on conflict (id) do update
           set status = excluded.status, usage = excluded.usage, event_id = excluded.event_id,
               ended_at = excluded.ended_at
         where bastion.ai_runs.event_id < excluded.event_id
        returning id, assistant_message_id
      ),
      message as (
        update bastion.ai_messages m set status = ev.message_status, updated_at = now()
          from settled s
         where m.chat_id = ev.chat and m.id = s.assistant_message_id
      )
      update bastion.ai_chats c set active_run_id = null, updated_at = now()
        from settled s
       where c.id = ev.chat and c.active_run_id = s.id;

    elsif ev.write = 'message' then
      with written as (
        insert into bastion.ai_messages
          (chat_id, id, parent_id, owner_id, tenant_id, role, parts, format, native, metadata, run_id,
           event_id, created_at)
        values (ev.chat, ev.id, ev.parent, ev.owner, ev.tenant, ev.role, ev.parts, ev.format, ev.native,
                ev.metadata, ev.run, ev.event, ev.at)
        on conflict (chat_id, id) do update
           set parent_id = excluded.parent_id, parts = excluded.parts, native = excluded.native,
               metadata = excluded.metadata, run_id = coalesce(excluded.run_id, bastion.ai_messages.run_id),
               event_id = excluded.event_id, updated_at = now()
         where bastion.ai_messages.event_id < excluded.event_id
        returning id
      ),
      run as (
        update bastion.ai_runs r set assistant_message_id = w.id
          from written w
         where ev.role = 'assistant' and r.id = ev.run
      )
      update bastion.ai_chats c
         set current_leaf_id = ev.id, leaf_event_id = ev.event, last_message_at = ev.at, updated_at = now()
       where c.id = ev.chat and c.leaf_event_id < ev.event;

    elsif ev.write = 'deleted' then
      update bastion.ai_chats c set current_leaf_id = ev.parent, leaf_event_id = ev.event, updated_at = now()
       where c.id = ev.chat and c.current_leaf_id = ev.id and c.leaf_event_id < ev.event;
    end if;
  end loop;
end
$$;

revoke execute on function bastion.persist_session_events(jsonb) from public, anon, authenticated;
grant execute on function bastion.persist_session_events(jsonb) to bastion_runtime;
