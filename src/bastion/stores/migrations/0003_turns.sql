-- The turn protocol as server-side functions: one statement per step, so a turn costs two round
-- trips to start (load under a lock, then write) plus one to finish and one per tool operation.
--
-- Users have no write privilege on messages, runs, events or tool executions. These tables change
-- only through the SECURITY DEFINER functions below, which bypass row-level security and therefore
-- re-check everything themselves: the caller's `auth.uid()` and tenant must own the conversation,
-- and the session's login role must be a member of `bastion_runtime` (the application server), so
-- a user holding a valid token but connecting directly (for example through a Data API) cannot
-- append an assistant message of their choosing. Every function fixes `search_path`.
--
-- Error codes (SQLSTATE): BS403 forbidden write, BS404 not found, BS409 turn conflict,
-- BS410 run no longer active.

create function bastion.require_runtime() returns uuid
  language plpgsql stable
  set search_path = ''
  as $$
declare
  v_user uuid := auth.uid();
begin
  if v_user is null or not pg_has_role(session_user, 'bastion_runtime', 'MEMBER') then
    raise exception 'only the application server may write a turn' using errcode = 'BS403';
  end if;
  return v_user;
end
$$;

create function bastion.insert_events(
  p_conversation uuid, p_run uuid, p_owner uuid, p_tenant text, p_events jsonb
) returns void
  language sql
  set search_path = ''
  as $$
    insert into bastion.run_events (conversation_id, run_id, owner_id, tenant_id, type, data)
    select p_conversation, p_run, p_owner, p_tenant, event ->> 'type', coalesce(event -> 'data', '{}')
    from jsonb_array_elements(coalesce(p_events, '[]'::jsonb)) with ordinality as e (event, position)
    order by position
  $$;

-- Settle tool calls this run claimed earlier: `[{toolCallId, status: completed|failed, output}]`.
create function bastion.record_tool_results(
  p_conversation uuid, p_run uuid, p_owner uuid, p_tenant text, p_results jsonb
) returns void
  language plpgsql
  set search_path = ''
  as $$
declare
  v_result jsonb;
  v_name text;
begin
  for v_result in select value from jsonb_array_elements(coalesce(p_results, '[]'::jsonb)) loop
    if coalesce(v_result ->> 'status', '') not in ('completed', 'failed') then
      raise exception 'invalid tool result' using errcode = 'BS403';
    end if;
    update bastion.tool_executions t
       set status = v_result ->> 'status', output = v_result -> 'output', finished_at = now()
     where t.conversation_id = p_conversation
       and t.tool_call_id = v_result ->> 'toolCallId'
       and t.run_id = p_run
       and t.status = 'in_flight'
    returning t.tool_name into v_name;
    if found then
      perform bastion.insert_events(
        p_conversation, p_run, p_owner, p_tenant,
        jsonb_build_array(jsonb_build_object(
          'type', case v_result ->> 'status' when 'completed' then 'tool.completed' else 'tool.failed' end,
          'data', jsonb_build_object('toolCallId', v_result ->> 'toolCallId', 'toolName', v_name)
        ))
      );
    end if;
  end loop;
end
$$;

-- Step one of a turn, as the caller (row-level security applies): lock the conversation without
-- waiting (a concurrent turn is a conflict, not a queue) and return what reconciliation needs: the
-- stored messages from the earliest one the browser names, and at least the last `p_window`.
create function bastion.load_turn(
  p_conversation uuid, p_request_id text, p_message_ids text[], p_window integer
) returns jsonb
  language plpgsql
  set search_path = ''
  as $$
declare
  v_conversation bastion.conversations;
  v_last bigint;
  v_from bigint;
begin
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
   for update nowait;
  if not found then
    return null;
  end if;
  select coalesce(max(m.seq), 0) into v_last from bastion.messages m where m.conversation_id = p_conversation;
  select min(m.seq) into v_from from bastion.messages m
   where m.conversation_id = p_conversation and m.id = any (p_message_ids);
  v_from := least(coalesce(v_from, v_last + 1), v_last - p_window + 1);
  return jsonb_build_object(
    'revision', v_conversation.revision,
    'busy', exists (
      select 1 from bastion.runs r
       where r.id = v_conversation.active_run_id and r.status = 'running' and r.lease_expires_at > now()
    ),
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

-- Step two, in the same transaction: claim the turn (replacing a run whose lease expired, recorded
-- as interrupted), apply the reconciled history and record the events. `p_writes` is
-- `[{seq, message, replace}]`: a replaced row keeps its id and role; an added row must be a user
-- message. Returns the new revision.
create function bastion.start_turn(
  p_conversation uuid,
  p_run uuid,
  p_request_id text,
  p_revision bigint,
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
    if v_active.lease_expires_at > now() then
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

  insert into bastion.runs (id, conversation_id, owner_id, tenant_id, request_id, status, lease_expires_at)
  values (
    p_run, p_conversation, v_user, v_conversation.tenant_id, p_request_id, 'running',
    now() + make_interval(secs => p_lease_seconds)
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

-- Claim one tool call before its side effect, settling this run's earlier calls in the same trip.
-- Returns `{outcome}`: claimed, completed (with `output`), in_flight, uncertain or mismatch.
create function bastion.claim_tool(
  p_conversation uuid,
  p_run uuid,
  p_tool_call_id text,
  p_tool_name text,
  p_input jsonb,
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
    (conversation_id, tool_call_id, run_id, owner_id, tenant_id, tool_name, input, status)
  values
    (p_conversation, p_tool_call_id, p_run, v_user, v_conversation.tenant_id, p_tool_name, p_input, 'in_flight')
  on conflict (conversation_id, tool_call_id) do nothing;
  if found then
    perform bastion.insert_events(
      p_conversation, p_run, v_user, v_conversation.tenant_id,
      jsonb_build_array(jsonb_build_object(
        'type', 'tool.started', 'data', jsonb_build_object('toolCallId', p_tool_call_id, 'toolName', p_tool_name)
      ))
    );
    return jsonb_build_object('outcome', 'claimed');
  end if;

  select * into v_existing from bastion.tool_executions t
   where t.conversation_id = p_conversation and t.tool_call_id = p_tool_call_id;
  if v_existing.tool_name <> p_tool_name or v_existing.input is distinct from p_input then
    return jsonb_build_object('outcome', 'mismatch');
  end if;
  if v_existing.status = 'completed' then
    return jsonb_build_object('outcome', 'completed', 'output', v_existing.output);
  end if;
  if v_existing.status = 'in_flight' and exists (
    select 1 from bastion.runs r
     where r.id = v_existing.run_id and r.status = 'running' and r.lease_expires_at > now()
  ) then
    return jsonb_build_object('outcome', 'in_flight');
  end if;
  return jsonb_build_object('outcome', 'uncertain');
end
$$;

-- The last step: fenced by run id (a replaced or finished run changes nothing), idempotent, and
-- appending only the response message (or replacing the latest one it continues). Returns whether
-- the outcome was saved.
create function bastion.finish_turn(
  p_conversation uuid,
  p_run uuid,
  p_status text,
  p_message jsonb,
  p_tool_results jsonb,
  p_events jsonb
) returns boolean
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_conversation bastion.conversations;
  v_run bastion.runs;
  v_last bastion.messages;
begin
  if p_status not in ('completed', 'failed', 'cancelled', 'waiting_for_approval') then
    raise exception 'invalid status' using errcode = 'BS403';
  end if;
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.tenant_id is not distinct from bastion.tenant_id()
   for update;
  if not found then
    return false;
  end if;
  perform bastion.record_tool_results(p_conversation, p_run, v_user, v_conversation.tenant_id, p_tool_results);
  select * into v_run from bastion.runs r where r.id = p_run and r.conversation_id = p_conversation for update;
  if not found or v_run.status <> 'running' or v_conversation.active_run_id is distinct from p_run then
    return false;
  end if;

  if p_message is not null then
    if p_message ->> 'role' is distinct from 'assistant' then
      raise exception 'a response must be an assistant message' using errcode = 'BS403';
    end if;
    select * into v_last from bastion.messages m
     where m.conversation_id = p_conversation order by m.seq desc limit 1;
    if v_last.id = p_message ->> 'id' then
      if v_last.role <> 'assistant' then
        raise exception 'a response may only continue an assistant message' using errcode = 'BS403';
      end if;
      update bastion.messages m set message = p_message
       where m.conversation_id = p_conversation and m.seq = v_last.seq;
    else
      insert into bastion.messages (conversation_id, seq, id, role, message, owner_id, tenant_id)
      values (
        p_conversation, coalesce(v_last.seq, 0) + 1, p_message ->> 'id', 'assistant', p_message,
        v_user, v_conversation.tenant_id
      );
    end if;
  end if;

  update bastion.runs set status = p_status, finished_at = now() where id = p_run;
  perform bastion.insert_events(p_conversation, p_run, v_user, v_conversation.tenant_id, p_events);
  update bastion.conversations
     set active_run_id = null, revision = revision + 1, updated_at = now()
   where id = p_conversation;
  return true;
end
$$;

revoke execute on all functions in schema bastion from public;
grant execute on function bastion.tenant_id() to authenticated, service_role;
grant execute on function
  bastion.load_turn(uuid, text, text[], integer),
  bastion.start_turn(uuid, uuid, text, bigint, double precision, bigint, jsonb, jsonb),
  bastion.claim_tool(uuid, uuid, text, text, jsonb, double precision, jsonb),
  bastion.finish_turn(uuid, uuid, text, jsonb, jsonb, jsonb)
  to authenticated;
