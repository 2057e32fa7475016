-- Two changes to the turn protocol.
--
-- 1. Operations are keyed by an operation key, not by the provider's tool call id. Providers reuse
--    ids (many local servers answer `call_0` every time), so a call is named by where it was made:
--    its run, step and position, or, for a call resumed after an approval, the approval's id. The
--    application derives the key (`bastion.tools.operation_key`); the database stores it, and keeps
--    the provider's id for events. Existing rows are upgraded: a call run after an approval gets
--    that approval's key, so a retried continuation still finds it; any other old row gets a
--    `legacy/` key that no new call can produce, so it is never replayed into a later turn.
--    An operation of a tool declared idempotent whose outcome is uncertain is claimed again.
--
-- 2. Runs record the process running them (`worker_key`), and a live process holds the session
--    advisory lock of that key for as long as it lives. A run whose process no longer holds its
--    lock is provably not running: a claim that meets it replaces it at once instead of waiting for
--    its lease. A lock that is still held proves nothing (a machine that vanished keeps its
--    connection open for a while), so the lease still bounds every run; live processes renew the
--    leases of their runs with `renew_runs`.

alter table bastion.tool_executions add column operation_key text;

update bastion.tool_executions t
   set operation_key = coalesce(
     (select 'approval/' || (p.part -> 'approval' ->> 'id')
        from bastion.messages m
        cross join lateral jsonb_array_elements(
          case when jsonb_typeof(m.message -> 'parts') = 'array' then m.message -> 'parts' else '[]'::jsonb end
        ) as p (part)
       where m.conversation_id = t.conversation_id
         and p.part ->> 'toolCallId' = t.tool_call_id
         and p.part -> 'approval' ->> 'approved' = 'true'
         and char_length(p.part -> 'approval' ->> 'id') between 1 and 80
       order by m.seq desc
       limit 1),
     'legacy/' || t.tool_call_id
   );

alter table bastion.tool_executions
  alter column operation_key set not null,
  add constraint tool_executions_operation_key_length check (char_length(operation_key) between 1 and 200),
  drop constraint tool_executions_pkey,
  add primary key (conversation_id, operation_key);

alter table bastion.runs add column worker_key bigint;

-- Whether the process holding `p_worker`'s advisory lock is alive: true while any session holds it.
create function bastion.worker_alive(p_worker bigint) returns boolean
  language sql stable
  set search_path = ''
  as $$
    select exists (
      select 1 from pg_catalog.pg_locks l
       where l.locktype = 'advisory' and l.granted and l.objsubid = 1
         and l.database = (select d.oid from pg_catalog.pg_database d where d.datname = current_database())
         and l.classid::bigint = (p_worker >> 32) & 4294967295
         and l.objid::bigint = p_worker & 4294967295
    )
  $$;

-- Whether a run still holds its conversation: running, within its lease, and its process (when
-- recorded) alive.
create function bastion.run_is_live(p_run bastion.runs) returns boolean
  language sql stable
  set search_path = ''
  as $$
    select p_run.id is not null
       and p_run.status = 'running'
       and p_run.lease_expires_at > now()
       and (p_run.worker_key is null or bastion.worker_alive(p_run.worker_key))
  $$;

-- Seconds until a live run's lease ends: what a busy answer tells the client to wait.
create function bastion.retry_after(p_run bastion.runs) returns double precision
  language sql stable
  set search_path = ''
  as $$ select greatest(extract(epoch from (p_run.lease_expires_at - now()))::double precision, 0) $$;

-- A live process extends the leases of the runs it is running; nothing else changes.
create function bastion.renew_runs(p_worker bigint, p_runs uuid[], p_lease_seconds double precision)
  returns integer
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_count integer;
begin
  perform bastion.require_runtime_session();
  update bastion.runs r
     set lease_expires_at = now() + make_interval(secs => p_lease_seconds)
   where r.id = any (coalesce(p_runs, '{}')) and r.worker_key = p_worker and r.status = 'running';
  get diagnostics v_count = row_count;
  return v_count;
end
$$;

-- As in 0003, with a live run judged by `run_is_live` and the seconds a busy caller should wait.
create or replace function bastion.load_turn(
  p_conversation uuid, p_request_id text, p_message_ids text[], p_window integer
) returns jsonb
  language plpgsql
  set search_path = ''
  as $$
declare
  v_conversation bastion.conversations;
  v_active bastion.runs;
  v_last bigint;
  v_from bigint;
begin
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
   for update nowait;
  if not found then
    return null;
  end if;
  select * into v_active from bastion.runs r where r.id = v_conversation.active_run_id;
  select coalesce(max(m.seq), 0) into v_last from bastion.messages m where m.conversation_id = p_conversation;
  select min(m.seq) into v_from from bastion.messages m
   where m.conversation_id = p_conversation and m.id = any (p_message_ids);
  v_from := least(coalesce(v_from, v_last + 1), v_last - p_window + 1);
  return jsonb_build_object(
    'revision', v_conversation.revision,
    'busy', bastion.run_is_live(v_active),
    'retry_after', bastion.retry_after(v_active),
    'repeated_request', exists (
      select 1 from bastion.runs r where r.conversation_id = p_conversation and r.request_id = p_request_id
    ),
    'last_seq', v_last,
    'messages', coalesce(
      (select jsonb_agg(jsonb_build_array(m.seq, m.message) order by m.seq)
         from bastion.messages m where m.conversation_id = p_conversation and m.seq >= v_from),
      '[]'::jsonb
    )
  );
end
$$;

-- `start_turn` of 0003, recording the claiming process; a held run that is not live is replaced
-- and recorded as interrupted.
drop function bastion.claim_turn(uuid, uuid, text, bigint, text, text[], double precision, bigint, jsonb, jsonb);
drop function bastion.start_turn(uuid, uuid, text, bigint, double precision, bigint, jsonb, jsonb);

create function bastion.start_turn(
  p_conversation uuid,
  p_run uuid,
  p_request_id text,
  p_revision bigint,
  p_worker bigint,
  p_lease_seconds double precision,
  p_truncate_after bigint,
  p_writes jsonb,
  p_events jsonb
) returns bigint
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_conversation bastion.conversations;
  v_active bastion.runs;
  v_write jsonb;
  v_message jsonb;
begin
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.tenant_id is not distinct from bastion.tenant_id()
   for update;
  if not found then
    raise exception 'conversation not found' using errcode = 'BS404';
  end if;
  if v_conversation.revision <> p_revision then
    raise exception 'the conversation changed' using errcode = 'BS409';
  end if;
  if exists (
    select 1 from bastion.runs r where r.conversation_id = p_conversation and r.request_id = p_request_id
  ) then
    raise exception 'repeated request' using errcode = 'BS409';
  end if;
  select * into v_active from bastion.runs r where r.id = v_conversation.active_run_id for update;
  if found and v_active.status = 'running' then
    if bastion.run_is_live(v_active) then
      raise exception 'a turn is in progress' using errcode = 'BS409';
    end if;
    update bastion.runs set status = 'interrupted', finished_at = now() where id = v_active.id;
    perform bastion.insert_events(
      p_conversation, v_active.id, v_user, v_conversation.tenant_id,
      jsonb_build_array(jsonb_build_object(
        'type', 'run.interrupted', 'data', jsonb_build_object('runId', v_active.id, 'status', 'interrupted')
      ))
    );
  end if;

  insert into bastion.runs
    (id, conversation_id, owner_id, tenant_id, request_id, status, lease_expires_at, worker_key)
  values (
    p_run, p_conversation, v_user, v_conversation.tenant_id, p_request_id, 'running',
    now() + make_interval(secs => p_lease_seconds), p_worker
  );

  if p_truncate_after is not null then
    delete from bastion.messages m where m.conversation_id = p_conversation and m.seq > p_truncate_after;
  end if;
  for v_write in select value from jsonb_array_elements(coalesce(p_writes, '[]'::jsonb)) loop
    v_message := v_write -> 'message';
    if (v_write ->> 'replace')::boolean then
      update bastion.messages m set message = v_message
       where m.conversation_id = p_conversation
         and m.seq = (v_write ->> 'seq')::bigint
         and m.id = v_message ->> 'id'
         and m.role = v_message ->> 'role';
      if not found then
        raise exception 'a replaced message must keep its id and role' using errcode = 'BS403';
      end if;
    else
      if v_message ->> 'role' is distinct from 'user' then
        raise exception 'only a user message may be added when a turn starts' using errcode = 'BS403';
      end if;
      insert into bastion.messages (conversation_id, seq, id, role, message, owner_id, tenant_id)
      values (
        p_conversation, (v_write ->> 'seq')::bigint, v_message ->> 'id', 'user', v_message,
        v_user, v_conversation.tenant_id
      );
    end if;
  end loop;

  perform bastion.insert_events(p_conversation, p_run, v_user, v_conversation.tenant_id, p_events);
  update bastion.conversations
     set revision = revision + 1, active_run_id = p_run, updated_at = now()
   where id = p_conversation;
  return v_conversation.revision + 1;
end
$$;

-- `claim_turn` of 0005, recording the claiming process, judging the held run with `run_is_live`
-- and answering `busy` with `retry_after`.
create function bastion.claim_turn(
  p_conversation uuid,
  p_run uuid,
  p_request_id text,
  p_revision bigint,
  p_incarnation text,
  p_uncached_ids text[],
  p_worker bigint,
  p_lease_seconds double precision,
  p_truncate_after bigint,
  p_writes jsonb,
  p_events jsonb
) returns jsonb
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_conversation bastion.conversations;
  v_active bastion.runs;
  v_revision bigint;
  v_from bigint;
begin
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.tenant_id is not distinct from bastion.tenant_id()
   for update nowait;
  if not found then
    raise exception 'conversation not found' using errcode = 'BS404';
  end if;
  if v_conversation.revision <> p_revision
     or (p_incarnation is not null and (to_jsonb(v_conversation.created_at) #>> '{}') <> p_incarnation)
     or exists (
    select 1 from bastion.messages m
     where m.conversation_id = p_conversation and m.id = any (coalesce(p_uncached_ids, '{}'))
  ) then
    return jsonb_build_object('outcome', 'stale');
  end if;
  select * into v_active from bastion.runs r where r.id = v_conversation.active_run_id;
  if bastion.run_is_live(v_active) then
    return jsonb_build_object('outcome', 'busy', 'retry_after', bastion.retry_after(v_active));
  end if;
  if exists (
    select 1 from bastion.runs r where r.conversation_id = p_conversation and r.request_id = p_request_id
  ) then
    return jsonb_build_object('outcome', 'repeated_request');
  end if;

  v_revision := bastion.start_turn(
    p_conversation, p_run, p_request_id, p_revision, p_worker, p_lease_seconds, p_truncate_after,
    p_writes, p_events
  );
  select min((w.value ->> 'seq')::bigint) into v_from
    from jsonb_array_elements(coalesce(p_writes, '[]'::jsonb)) w;
  return jsonb_build_object(
    'outcome', 'claimed',
    'revision', v_revision,
    'incarnation', to_jsonb(v_conversation.created_at) #>> '{}',
    'last_seq', (select coalesce(max(m.seq), 0) from bastion.messages m where m.conversation_id = p_conversation),
    'rows', coalesce(
      (select jsonb_agg(jsonb_build_array(m.seq, m.message) order by m.seq)
         from bastion.messages m where m.conversation_id = p_conversation and m.seq >= v_from),
      '[]'::jsonb
    )
  );
end
$$;

-- Settle operations this run claimed earlier: `[{operationKey, status: completed|failed, output}]`.
create or replace function bastion.record_tool_results(
  p_conversation uuid, p_run uuid, p_owner uuid, p_tenant text, p_results jsonb
) returns void
  language plpgsql
  set search_path = ''
  as $$
declare
  v_result jsonb;
  v_name text;
  v_call text;
begin
  for v_result in select value from jsonb_array_elements(coalesce(p_results, '[]'::jsonb)) loop
    if coalesce(v_result ->> 'status', '') not in ('completed', 'failed') then
      raise exception 'invalid tool result' using errcode = 'BS403';
    end if;
    update bastion.tool_executions t
       set status = v_result ->> 'status', output = v_result -> 'output', finished_at = now()
     where t.conversation_id = p_conversation
       and t.operation_key = v_result ->> 'operationKey'
       and t.run_id = p_run
       and t.status = 'in_flight'
    returning t.tool_name, t.tool_call_id into v_name, v_call;
    if found then
      perform bastion.insert_events(
        p_conversation, p_run, p_owner, p_tenant,
        jsonb_build_array(jsonb_build_object(
          'type', case v_result ->> 'status' when 'completed' then 'tool.completed' else 'tool.failed' end,
          'data', jsonb_build_object('toolCallId', v_call, 'toolName', v_name)
        ))
      );
    end if;
  end loop;
end
$$;

-- Claim one operation before its side effect, settling this run's earlier ones in the same trip.
-- Returns `{outcome}`: claimed, completed (with `output`), in_flight, uncertain or mismatch. An
-- uncertain operation of an idempotent tool (`p_idempotent`) is claimed again by this run.
drop function bastion.claim_tool(uuid, uuid, text, text, jsonb, double precision, jsonb);

create function bastion.claim_tool(
  p_conversation uuid,
  p_run uuid,
  p_operation_key text,
  p_tool_call_id text,
  p_tool_name text,
  p_input jsonb,
  p_idempotent boolean,
  p_lease_seconds double precision,
  p_tool_results jsonb
) returns jsonb
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_conversation bastion.conversations;
  v_run bastion.runs;
  v_existing bastion.tool_executions;
  v_holder bastion.runs;
  v_started jsonb := jsonb_build_array(jsonb_build_object(
    'type', 'tool.started', 'data', jsonb_build_object('toolCallId', p_tool_call_id, 'toolName', p_tool_name)
  ));
begin
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.tenant_id is not distinct from bastion.tenant_id()
   for share;
  if not found then
    raise exception 'conversation not found' using errcode = 'BS404';
  end if;
  -- The run row lock serializes this run's claims before any event is written, so event ids
  -- commit in order for a conversation (start and finish hold its row exclusively).
  select * into v_run from bastion.runs r where r.id = p_run and r.conversation_id = p_conversation for update;
  if not found or v_run.status <> 'running' or v_conversation.active_run_id is distinct from p_run then
    raise exception 'the run is no longer active' using errcode = 'BS410';
  end if;
  perform bastion.record_tool_results(p_conversation, p_run, v_user, v_conversation.tenant_id, p_tool_results);
  update bastion.runs set lease_expires_at = now() + make_interval(secs => p_lease_seconds) where id = p_run;

  insert into bastion.tool_executions
    (conversation_id, operation_key, tool_call_id, run_id, owner_id, tenant_id, tool_name, input, status)
  values
    (p_conversation, p_operation_key, p_tool_call_id, p_run, v_user, v_conversation.tenant_id, p_tool_name,
     p_input, 'in_flight')
  on conflict (conversation_id, operation_key) do nothing;
  if found then
    perform bastion.insert_events(p_conversation, p_run, v_user, v_conversation.tenant_id, v_started);
    return jsonb_build_object('outcome', 'claimed');
  end if;

  select * into v_existing from bastion.tool_executions t
   where t.conversation_id = p_conversation and t.operation_key = p_operation_key
   for update;
  if v_existing.tool_name <> p_tool_name or v_existing.input is distinct from p_input then
    return jsonb_build_object('outcome', 'mismatch');
  end if;
  if v_existing.status = 'completed' then
    return jsonb_build_object('outcome', 'completed', 'output', v_existing.output);
  end if;
  if v_existing.status = 'in_flight' then
    select * into v_holder from bastion.runs r where r.id = v_existing.run_id;
    if bastion.run_is_live(v_holder) then
      return jsonb_build_object('outcome', 'in_flight');
    end if;
  end if;
  if p_idempotent then
    update bastion.tool_executions t
       set run_id = p_run, tool_call_id = p_tool_call_id, status = 'in_flight', output = null,
           started_at = now(), finished_at = null
     where t.conversation_id = p_conversation and t.operation_key = p_operation_key;
    perform bastion.insert_events(p_conversation, p_run, v_user, v_conversation.tenant_id, v_started);
    return jsonb_build_object('outcome', 'claimed');
  end if;
  return jsonb_build_object('outcome', 'uncertain');
end
$$;

revoke execute on function
  bastion.worker_alive(bigint),
  bastion.run_is_live(bastion.runs),
  bastion.retry_after(bastion.runs),
  bastion.renew_runs(bigint, uuid[], double precision),
  bastion.start_turn(uuid, uuid, text, bigint, bigint, double precision, bigint, jsonb, jsonb),
  bastion.claim_turn(uuid, uuid, text, bigint, text, text[], bigint, double precision, bigint, jsonb, jsonb),
  bastion.claim_tool(uuid, uuid, text, text, text, jsonb, boolean, double precision, jsonb)
  from public;
grant execute on function
  bastion.worker_alive(bigint),
  bastion.run_is_live(bastion.runs),
  bastion.retry_after(bastion.runs)
  to authenticated;
grant execute on function bastion.renew_runs(bigint, uuid[], double precision) to bastion_runtime;
grant execute on function
  bastion.start_turn(uuid, uuid, text, bigint, bigint, double precision, bigint, jsonb, jsonb),
  bastion.claim_turn(uuid, uuid, text, bigint, text, text[], bigint, double precision, bigint, jsonb, jsonb),
  bastion.claim_tool(uuid, uuid, text, text, text, jsonb, boolean, double precision, jsonb)
  to authenticated;
