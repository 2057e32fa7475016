-- `persist_sessions` takes its batches as outbox ids: `bastion.persist_session_outbox` reads the
-- events from `bastion.hook_events` and does all the per-event work here, so delivery loads no event
-- into the application. It writes exactly what 0002's function writes for the parameters the hook
-- built in Python from the same events: the conversion of an event into its write (the hook's
-- `_write` and `_batch` before), the canonical parts (`bastion.hooks.canonical_parts`, kept in
-- Python for applications, and tested equal to this one) and the chat id (`chat_id_of`) move here.
--
-- The write statements stay in one place: `bastion.apply_session_writes` applies a batch of events'
-- parameters (those documented in 0002, as `bastion.session_write` rows) in order, and both entry
-- points build their batch and call it once. `persist_session_events(jsonb)` is redefined on it and
-- keeps working, unchanged, for processes of the previous version during a rolling upgrade.

-- The chat id of a conversation: the first 16 bytes of the SHA-256 of 'bastion-conversation:' and
-- the conversation id, marked as a UUID of version 8 (RFC variant), as `chat_id_of` in Python.
create function bastion.chat_id_of(p_conversation uuid) returns uuid
  language sql
  immutable strict parallel safe
  set search_path = ''
as $$
  select encode(set_byte(set_byte(d, 6, (get_byte(d, 6) & 15) | 128), 8, (get_byte(d, 8) & 63) | 128), 'hex')::uuid
    from (select substr(sha256(convert_to('bastion-conversation:' || p_conversation::text, 'UTF8')), 1, 16)) h (d)
$$;

-- The canonical parts of an AI SDK UI message, as `canonical_parts` in Python, branch by branch: a
-- part that is not an object with a string `type` is `unknown` data; text, reasoning, file and
-- sources keep their fields (optional ones only when strings) and their provider metadata (the
-- `providerMetadata` key when present, whatever its value, else `callProviderMetadata`, kept only
-- when an object); a tool part becomes its call (when it has an `input` key), its approval (when an
-- object with a string id: requested while `approved` is missing or null, approved only when true)
-- and its result (`output-available`, `output-error`); a part with no counterpart becomes a `data`
-- part named after its type. Missing values the Python reads with `.get` are JSON null. (PL/pgSQL
-- rather than one SQL query: its simple expressions cost a few times less per part.)
create function bastion.canonical_parts(p_message jsonb) returns jsonb
  language plpgsql
  immutable parallel safe
  set search_path = ''
as $$
declare
  v_parts constant jsonb := p_message -> 'parts';
  v_converted jsonb[] := '{}';
  v_part jsonb;
  v_kind text;
  v_metadata jsonb;
  v_extra jsonb;
  v_name jsonb;
  v_call jsonb;
  v_approval jsonb;
begin
  if jsonb_typeof(v_parts) is distinct from 'array' then
    return '[]'::jsonb;
  end if;
  for i in 0 .. jsonb_array_length(v_parts) - 1 loop
    v_part := v_parts -> i;
    if jsonb_typeof(v_part) <> 'object' or jsonb_typeof(v_part -> 'type') is distinct from 'string' then
      v_converted := v_converted || jsonb_build_object('type', 'data', 'name', 'unknown', 'data', v_part);
      continue;
    end if;
    v_kind := v_part ->> 'type';
    v_metadata := case when v_part ? 'providerMetadata' then v_part -> 'providerMetadata'
                       else v_part -> 'callProviderMetadata' end;
    v_extra := case when jsonb_typeof(v_metadata) = 'object'
                    then jsonb_build_object('providerMetadata', v_metadata) else '{}'::jsonb end;

    if v_kind in ('text', 'reasoning') and jsonb_typeof(v_part -> 'text') = 'string' then
      v_converted := v_converted || (
        jsonb_build_object('type', v_kind, 'text', v_part -> 'text')
        || case when v_part -> 'state' in ('"streaming"', '"done"')
                then jsonb_build_object('state', v_part -> 'state') else '{}'::jsonb end
        || v_extra
      );

    elsif v_kind = 'file' and jsonb_typeof(v_part -> 'url') = 'string'
          and jsonb_typeof(v_part -> 'mediaType') = 'string' then
      v_converted := v_converted || (
        jsonb_build_object('type', 'file', 'mediaType', v_part -> 'mediaType', 'url', v_part -> 'url')
        || case when jsonb_typeof(v_part -> 'filename') = 'string'
                then jsonb_build_object('filename', v_part -> 'filename') else '{}'::jsonb end
        || v_extra
      );

    elsif v_kind in ('source-url', 'source-document') and jsonb_typeof(v_part -> 'sourceId') = 'string' then
      v_converted := v_converted || (
        jsonb_build_object(
          'type', 'source',
          'sourceType', case v_kind when 'source-url' then 'url' else 'document' end,
          'id', v_part -> 'sourceId'
        )
        || case when jsonb_typeof(v_part -> 'url') = 'string'
                then jsonb_build_object('url', v_part -> 'url') else '{}'::jsonb end
        || case when jsonb_typeof(v_part -> 'title') = 'string'
                then jsonb_build_object('title', v_part -> 'title') else '{}'::jsonb end
        || case when jsonb_typeof(v_part -> 'mediaType') = 'string'
                then jsonb_build_object('mediaType', v_part -> 'mediaType') else '{}'::jsonb end
        || v_extra
      );

    elsif v_kind = 'step-start' then
      v_converted := v_converted || '{"type": "step", "boundary": "start"}'::jsonb;

    elsif v_kind = 'dynamic-tool' or left(v_kind, 5) = 'tool-' then
      v_name := case when v_kind = 'dynamic-tool' then v_part -> 'toolName' else to_jsonb(substr(v_kind, 6)) end;
      v_call := v_part -> 'toolCallId';
      if jsonb_typeof(v_name) is distinct from 'string' or jsonb_typeof(v_call) is distinct from 'string' then
        v_converted := v_converted || jsonb_build_object('type', 'data', 'name', v_kind, 'data', v_part);
        continue;
      end if;
      if v_part ? 'input' then
        v_converted := v_converted || (
          jsonb_build_object(
            'type', 'tool-call', 'toolCallId', v_call, 'toolName', v_name, 'input', v_part -> 'input'
          )
          || case when v_part -> 'providerExecuted' = 'true'::jsonb
                  then '{"providerExecuted": true}'::jsonb else '{}'::jsonb end
          || v_extra
        );
      end if;
      v_approval := v_part -> 'approval';
      if jsonb_typeof(v_approval) = 'object' and jsonb_typeof(v_approval -> 'id') = 'string' then
        v_converted := v_converted || (
          jsonb_build_object(
            'type', 'tool-approval',
            'toolCallId', v_call,
            'approvalId', v_approval -> 'id',
            'state', case when coalesce(v_approval -> 'approved', 'null'::jsonb) = 'null'::jsonb then 'requested'
                          when v_approval -> 'approved' = 'true'::jsonb then 'approved'
                          else 'denied' end
          )
          || case when jsonb_typeof(v_approval -> 'reason') = 'string'
                  then jsonb_build_object('reason', v_approval -> 'reason') else '{}'::jsonb end
        );
      end if;
      if v_part -> 'state' = '"output-available"'::jsonb then
        v_converted := v_converted || jsonb_build_object(
          'type', 'tool-result', 'toolCallId', v_call, 'toolName', v_name, 'output', v_part -> 'output'
        );
      elsif v_part -> 'state' = '"output-error"'::jsonb then
        v_converted := v_converted || jsonb_build_object(
          'type', 'tool-result', 'toolCallId', v_call, 'toolName', v_name, 'output', v_part -> 'errorText',
          'isError', true
        );
      end if;

    elsif left(v_kind, 5) = 'data-' and length(v_kind) > 5 then
      v_converted := v_converted || (
        jsonb_build_object('type', 'data', 'name', substr(v_kind, 6))
        || case when jsonb_typeof(v_part -> 'id') = 'string'
                then jsonb_build_object('id', v_part -> 'id') else '{}'::jsonb end
        || jsonb_build_object('data', v_part -> 'data')
      );

    else
      v_converted := v_converted || jsonb_build_object('type', 'data', 'name', v_kind, 'data', v_part);
    end if;
  end loop;
  return to_jsonb(v_converted);
end
$$;

-- One event's write: the parameters 0002 documents, as a row.
create type bastion.session_write as (
  write text, chat uuid, owner uuid, tenant text, event bigint, at timestamptz,
  conversation uuid, agent text, title text,
  run uuid, status text, message_status text, usage jsonb,
  id text, parent text, role text, parts jsonb, format text, native jsonb, metadata jsonb
);

-- The writes of a batch, applied one by one in order with 0002's statements, unchanged (the first
-- write of each chat carries `conversation`: its `ai_chats` row is inserted, if new, before it).
create function bastion.apply_session_writes(p_writes bastion.session_write[]) returns void
  language plpgsql
  security invoker
  set search_path = ''
as $$
declare
  ev bastion.session_write;
begin
  foreach ev in array p_writes loop
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

-- 0002's entry point on the one copy of the statements: the batch the previous version's hook built
-- (an element's keys are the fields of `session_write`), applied in the order given.
create or replace function bastion.persist_session_events(p_events jsonb) returns void
  language sql
  security invoker
  set search_path = ''
as $$
  select bastion.apply_session_writes(array(
    select w
      from jsonb_array_elements(p_events) with ordinality as e (value, ord)
     cross join lateral jsonb_populate_record(null::bastion.session_write, e.value) as w
     order by e.ord
  ))
$$;

-- The outbox events of `p_event_ids`, in the order given (an id repeated is applied again; one no
-- longer in the outbox is skipped), each turned into its write: `run.started` opens its run (when
-- it names one); a final run event settles the run of its `runId` or else the event's (a `runId`
-- that is truthy but not a string, as Python reads it, settles nothing); `message.deleted` moves the
-- leaf; any other event with a `message` object writes that message. Events of anonymous users are
-- skipped; the first event of each chat carries its `ai_chats` row (agent `p_agent`, title
-- `p_title`). A chat id is computed once per conversation of the batch.
create function bastion.persist_session_outbox(p_event_ids bigint[], p_agent text, p_title text)
  returns void
  language sql
  security invoker
  set search_path = ''
as $$
  with taken as materialized (
    select u.ord, e.*
      from unnest(p_event_ids) with ordinality as u (id, ord)
      join bastion.hook_events e on e.id = u.id
     where e.signed_in
  ),
  chats as (
    select c.conversation_id, bastion.chat_id_of(c.conversation_id) as chat, min(c.ord) as first
      from taken c
     group by c.conversation_id
  )
  select bastion.apply_session_writes(array(
    select row(
             w.write, c.chat, e.owner_id, e.tenant_id, e.id, e.created_at,
             case when e.ord = c.first then e.conversation_id end, p_agent, p_title,
             case w.write when 'run_started' then e.run_id when 'run_finished' then w.final_run
                          when 'message' then e.run_id end,
             f.status, f.message_status,
             case when w.write = 'run_finished' then
               case jsonb_typeof(e.data -> 'usage') when 'object' then e.data -> 'usage' else '{}'::jsonb end
             end,
             case when w.write in ('message', 'deleted') then e.data ->> 'messageId' end,
             case when w.write in ('message', 'deleted') then e.data ->> 'parentId' end,
             case when w.write = 'message' then case when w.assistant then 'assistant' else 'user' end end,
             case when w.write = 'message' then bastion.canonical_parts(e.data -> 'message') end,
             case when w.write = 'message' then case when w.assistant then 'ai-sdk' else 'canonical' end end,
             case when w.write = 'message' and w.assistant then e.data -> 'message' end,
             case when w.write = 'message' then
               case jsonb_typeof(e.data -> 'message' -> 'metadata')
                 when 'object' then e.data -> 'message' -> 'metadata' else '{}'::jsonb end
             end
           )::bastion.session_write
      from taken e
      join chats c on c.conversation_id = e.conversation_id
      left join (
        values ('run.waiting_for_approval', 'waiting_for_approval', 'complete'),
               ('run.completed', 'completed', 'complete'),
               ('run.failed', 'failed', 'error'),
               ('run.cancelled', 'cancelled', 'aborted'),
               ('run.interrupted', 'interrupted', 'aborted')
      ) f (type, status, message_status) on f.type = e.type
      cross join lateral (
        select case when f.type is null then null
                    when e.data -> 'runId' is null
                         or e.data -> 'runId' in ('null', 'false', '""', '0', '[]', '{}') then e.run_id
                    when jsonb_typeof(e.data -> 'runId') = 'string' then (e.data ->> 'runId')::uuid
               end as final_run
        offset 0
      ) r
      cross join lateral (
        select r.final_run,
               e.data -> 'role' = '"assistant"'::jsonb as assistant,
               case when e.type = 'run.started' then case when e.run_id is not null then 'run_started' end
                    when f.type is not null then case when r.final_run is not null then 'run_finished' end
                    when e.type = 'message.deleted' then 'deleted'
                    when jsonb_typeof(e.data -> 'message') = 'object' then 'message'
               end as write
        offset 0
      ) w
     order by e.ord
  ))
$$;

revoke execute on function bastion.chat_id_of(uuid), bastion.canonical_parts(jsonb) from public, anon;
grant execute on function bastion.chat_id_of(uuid), bastion.canonical_parts(jsonb)
  to bastion_runtime, authenticated;
revoke execute on function
  bastion.apply_session_writes(bastion.session_write[]),
  bastion.persist_session_outbox(bigint[], text, text)
  from public, anon, authenticated;
grant execute on function
  bastion.apply_session_writes(bastion.session_write[]),
  bastion.persist_session_outbox(bigint[], text, text)
  to bastion_runtime;
