-- Durable runs: a turn run as a durable workflow outlives the process that claimed it.
--
-- A run is marked durable (`mark_run_durable`) once its workflow exists, so a durable run always
-- has a workflow to finish it. When its process dies, the durable engine's janitor hands the turn
-- to a live process within a second or two, which adopts the run (`adopt_run`, marking it durable
-- if the process died before it could) and finishes it. So a durable run is not
-- replaced by a newer turn merely because its process's worker lock is free: it stays live until
-- its lease runs out (renewed by whichever process runs it), which still frees a conversation
-- whose every worker died. A run that was settled or replaced meanwhile cannot be adopted.
--
-- Adopting a run settles the operations its dead process left in flight as failed without an
-- output: their outcome is unknown, so the claim answers `uncertain` for them (an idempotent tool's
-- is claimed again), exactly as for a replaced run.
--
-- A durable turn writes its finished operations' results before each model request
-- (`record_run_results`), so a model request replayed after a crash never saw a result the store
-- lacks. `prune_run_chunks` deletes the stream logs of runs that ended before a given age.

alter table bastion.runs add column durable boolean not null default false;

-- As in 0006, with a durable run live until its lease ends whatever its process's lock says.
create or replace function bastion.run_is_live(p_run bastion.runs) returns boolean
  language sql stable
  set search_path = ''
  as $$
    select p_run.id is not null
       and p_run.status = 'running'
       and p_run.lease_expires_at > now()
       and (p_run.durable or p_run.worker_key is null or bastion.worker_alive(p_run.worker_key))
  $$;

-- Mark the caller's running run durable, once its workflow exists (so a durable run always has a
-- workflow to take it over). False when no such run.
create function bastion.mark_run_durable(p_run uuid) returns boolean
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
begin
  update bastion.runs r set durable = true
   where r.id = p_run and r.owner_id = v_user and r.tenant_id is not distinct from bastion.tenant_id()
     and r.status = 'running';
  return found;
end
$$;

-- Move the caller's running run to the process `p_worker` (a live process running its workflow),
-- marking it durable, if its conversation still waits on it and its previous process is dead (or
-- is this one). Returns whether it was adopted.
create function bastion.adopt_run(p_run uuid, p_worker bigint, p_lease_seconds double precision)
  returns boolean
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_run bastion.runs;
  v_call text;
  v_name text;
begin
  select r.* into v_run from bastion.runs r
    join bastion.conversations c on c.id = r.conversation_id and c.active_run_id = r.id
   where r.id = p_run and r.owner_id = v_user and r.tenant_id is not distinct from bastion.tenant_id()
   for update of r;
  if not found or v_run.status <> 'running' then
    return false;
  end if;
  if v_run.worker_key is not null and v_run.worker_key <> p_worker
     and bastion.worker_alive(v_run.worker_key) then
    return false;
  end if;
  update bastion.runs
     set worker_key = p_worker, durable = true,
         lease_expires_at = now() + make_interval(secs => p_lease_seconds)
   where id = p_run;
  for v_call, v_name in
    update bastion.tool_executions t set status = 'failed', output = null, finished_at = now()
     where t.conversation_id = v_run.conversation_id and t.run_id = p_run and t.status = 'in_flight'
    returning t.tool_call_id, t.tool_name
  loop
    perform bastion.insert_events(
      v_run.conversation_id, p_run, v_user, v_run.tenant_id,
      jsonb_build_array(jsonb_build_object(
        'type', 'tool.failed', 'data', jsonb_build_object('toolCallId', v_call, 'toolName', v_name)
      ))
    );
  end loop;
  return true;
end
$$;

-- Record the results of the caller's running run's finished operations (`record_tool_results`).
create function bastion.record_run_results(p_conversation uuid, p_run uuid, p_results jsonb)
  returns void
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_run bastion.runs;
begin
  select * into v_run from bastion.runs r
   where r.id = p_run and r.conversation_id = p_conversation and r.owner_id = v_user
     and r.tenant_id is not distinct from bastion.tenant_id()
   for update;
  if not found or v_run.status <> 'running' then
    raise exception 'the run is no longer active' using errcode = 'BS410';
  end if;
  perform bastion.record_tool_results(p_conversation, p_run, v_user, v_run.tenant_id, p_results);
end
$$;

-- Delete the stream logs of runs that ended more than `p_age` ago; returns the rows deleted.
create function bastion.prune_run_chunks(p_age interval) returns bigint
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_count bigint;
begin
  perform bastion.require_runtime_session();
  delete from bastion.run_chunks k
   using bastion.runs r
   where r.id = k.run_id and r.status <> 'running' and r.finished_at < now() - p_age;
  get diagnostics v_count = row_count;
  return v_count;
end
$$;

revoke execute on function
  bastion.mark_run_durable(uuid),
  bastion.adopt_run(uuid, bigint, double precision),
  bastion.record_run_results(uuid, uuid, jsonb),
  bastion.prune_run_chunks(interval)
  from public;
grant execute on function
  bastion.mark_run_durable(uuid),
  bastion.adopt_run(uuid, bigint, double precision),
  bastion.record_run_results(uuid, uuid, jsonb)
  to authenticated;
grant execute on function bastion.prune_run_chunks(interval) to bastion_runtime;
