-- A turn's own writes carry its stream log, and lock its run row without blocking the log's inserts.
--
-- `claim_tool` and `close_turn` gain overloads that take the stream log batches the run has not
-- written yet (`p_chunks`: `[{seq, reset, chunks, durable, notify}]`, as `append_chunks` takes them
-- one by one) and, for a durable turn, the process running the run and its pending checkpoints
-- (`p_worker`, `p_steps`, as `record_run_steps`, which fences the write the same way). So a tool's
-- claim and a turn's close, with the log written up to them and a durable turn's fence, are one
-- statement in one round trip, where they were two or three transactions.
--
-- Both lock the run row `for no key update` rather than `for update`: they change none of its keys,
-- and the weaker lock does not conflict with the `for key share` lock the foreign key check of every
-- insert referencing the run takes (the log's rows, tool executions, events), so a claim or a close
-- no longer waits for another transaction's log write. They still exclude each other, as before. The
-- close locks the conversation row the same way, for the same reason.
--
-- Answers as the earlier overloads do, with `stop`: whether the run was asked to stop.
--
-- Expand only: the earlier functions keep their signatures and behaviour.

-- Store a run's log batches `p_batches`, as `append_chunks` (0013) does each. Internal: callers have
-- checked the run (locked) is the caller's.
create function bastion.put_run_chunks(p_run bastion.runs, p_batches jsonb) returns void
  language plpgsql
  set search_path = ''
  as $$
declare
  v_batch jsonb;
  v_notify boolean := false;
begin
  for v_batch in select value from jsonb_array_elements(coalesce(p_batches, '[]'::jsonb)) loop
    if (v_batch ->> 'durable')::boolean and p_run.status = 'running' and not p_run.durable then
      update bastion.runs set durable = true where id = p_run.id;
      p_run.durable := true;
    end if;
    if (v_batch ->> 'reset')::boolean or jsonb_array_length(v_batch -> 'chunks') > 0 then
      insert into bastion.run_chunks (run_id, owner_id, tenant_id, seq, reset, chunks)
      values (
        p_run.id, p_run.owner_id, p_run.tenant_id, (v_batch ->> 'seq')::integer,
        (v_batch ->> 'reset')::boolean, v_batch -> 'chunks'
      );
    end if;
    v_notify := v_notify or coalesce((v_batch ->> 'notify')::boolean, false);
  end loop;
  if v_notify then
    perform pg_notify('bastion_turns', 'chunk:' || p_run.id::text);
  end if;
end
$$;

-- Lock the conversation's run `p_run` (`for no key update`), fence it by the process running it when
-- `p_worker` is given (else the write is not a durable turn's), then store what the write carries: a
-- durable turn's checkpoints `p_steps` and the log batches `p_chunks`. The run, or a row of nulls when
-- there is none. Internal: callers have locked the caller's conversation.
create function bastion.write_locked_run(
  p_conversation uuid, p_run uuid, p_worker bigint, p_steps jsonb, p_chunks jsonb
) returns bastion.runs
  language plpgsql
  set search_path = ''
  as $$
declare
  v_run bastion.runs;
  v_found boolean;
begin
  select * into v_run from bastion.runs r
   where r.id = p_run and r.conversation_id = p_conversation
   for no key update;
  v_found := found;
  if p_worker is not null
     and (not v_found or v_run.status <> 'running' or v_run.worker_key is distinct from p_worker) then
    raise exception 'the run is no longer run by this process' using errcode = 'BS410';
  end if;
  if v_found then
    if p_worker is not null then
      perform bastion.put_run_steps(v_run, p_steps);
    end if;
    perform bastion.put_run_chunks(v_run, p_chunks);
  end if;
  return v_run;
end
$$;

-- `claim_tool` (0006), with the run's log batches, and for a durable turn (`p_worker`) fenced by the
-- process running the run and storing its checkpoints `p_steps`.
create function bastion.claim_tool(
  p_conversation uuid,
  p_run uuid,
  p_operation_key text,
  p_tool_call_id text,
  p_tool_name text,
  p_input jsonb,
  p_idempotent boolean,
  p_lease_seconds double precision,
  p_tool_results jsonb,
  p_worker bigint,
  p_steps jsonb,
  p_chunks jsonb
) returns jsonb
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_conversation bastion.conversations;
  v_run bastion.runs;
  v_found boolean;
  v_existing bastion.tool_executions;
  v_holder bastion.runs;
  v_outcome jsonb;
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
    if p_worker is not null then
      raise exception 'the run is no longer run by this process' using errcode = 'BS410';
    end if;
    raise exception 'conversation not found' using errcode = 'BS404';
  end if;
  v_run := bastion.write_locked_run(p_conversation, p_run, p_worker, p_steps, p_chunks);
  v_found := v_run.id is not null;
  if not v_found or v_run.status <> 'running' or v_conversation.active_run_id is distinct from p_run then
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
    v_outcome := jsonb_build_object('outcome', 'claimed');
  else
    select * into v_existing from bastion.tool_executions t
     where t.conversation_id = p_conversation and t.operation_key = p_operation_key
     for update;
    if v_existing.tool_name <> p_tool_name or v_existing.input is distinct from p_input then
      v_outcome := jsonb_build_object('outcome', 'mismatch');
    elsif v_existing.status = 'completed' then
      v_outcome := jsonb_build_object('outcome', 'completed', 'output', v_existing.output);
    else
      if v_existing.status = 'in_flight' then
        select * into v_holder from bastion.runs r where r.id = v_existing.run_id;
        if bastion.run_is_live(v_holder) then
          v_outcome := jsonb_build_object('outcome', 'in_flight');
        end if;
      end if;
      if v_outcome is null and p_idempotent then
        update bastion.tool_executions t
           set run_id = p_run, tool_call_id = p_tool_call_id, status = 'in_flight', output = null,
               started_at = now(), finished_at = null
         where t.conversation_id = p_conversation and t.operation_key = p_operation_key;
        perform bastion.insert_events(p_conversation, p_run, v_user, v_conversation.tenant_id, v_started);
        v_outcome := jsonb_build_object('outcome', 'claimed');
      end if;
      v_outcome := coalesce(v_outcome, jsonb_build_object('outcome', 'uncertain'));
    end if;
  end if;
  return v_outcome || jsonb_build_object('stop', v_run.stop_requested_at is not null);
end
$$;

-- `close_turn` (0005, saving as `finish_turn` in 0003), with the run's log batches, and for a durable
-- turn (`p_worker`) fenced by the process running the run and storing its checkpoints `p_steps`.
create function bastion.close_turn(
  p_conversation uuid,
  p_run uuid,
  p_status text,
  p_message jsonb,
  p_tool_results jsonb,
  p_events jsonb,
  p_worker bigint,
  p_steps jsonb,
  p_chunks jsonb
) returns jsonb
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_conversation bastion.conversations;
  v_run bastion.runs;
  v_found boolean;
  v_last bastion.messages;
begin
  if p_status not in ('completed', 'failed', 'cancelled', 'waiting_for_approval') then
    raise exception 'invalid status' using errcode = 'BS403';
  end if;
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.tenant_id is not distinct from bastion.tenant_id()
   for no key update;
  if not found then
    if p_worker is not null then
      raise exception 'the run is no longer run by this process' using errcode = 'BS410';
    end if;
    return jsonb_build_object('saved', false, 'stop', false);
  end if;
  v_run := bastion.write_locked_run(p_conversation, p_run, p_worker, p_steps, p_chunks);
  v_found := v_run.id is not null;
  perform bastion.record_tool_results(p_conversation, p_run, v_user, v_conversation.tenant_id, p_tool_results);
  if not v_found or v_run.status <> 'running' or v_conversation.active_run_id is distinct from p_run then
    return jsonb_build_object('saved', false, 'stop', coalesce(v_run.stop_requested_at is not null, false));
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
   where id = p_conversation
  returning revision into v_conversation.revision;
  select * into v_last from bastion.messages m
   where m.conversation_id = p_conversation order by m.seq desc limit 1;
  return jsonb_build_object(
    'saved', true,
    'revision', v_conversation.revision,
    'last_seq', coalesce(v_last.seq, 0),
    'row', case when p_message is null then null else jsonb_build_array(v_last.seq, v_last.message) end,
    'stop', v_run.stop_requested_at is not null
  );
end
$$;

revoke execute on function
  bastion.put_run_chunks(bastion.runs, jsonb),
  bastion.write_locked_run(uuid, uuid, bigint, jsonb, jsonb),
  bastion.claim_tool(
    uuid, uuid, text, text, text, jsonb, boolean, double precision, jsonb, bigint, jsonb, jsonb
  ),
  bastion.close_turn(uuid, uuid, text, jsonb, jsonb, jsonb, bigint, jsonb, jsonb)
  from public;
grant execute on function
  bastion.claim_tool(
    uuid, uuid, text, text, text, jsonb, boolean, double precision, jsonb, bigint, jsonb, jsonb
  ),
  bastion.close_turn(uuid, uuid, text, jsonb, jsonb, jsonb, bigint, jsonb, jsonb)
  to authenticated;
