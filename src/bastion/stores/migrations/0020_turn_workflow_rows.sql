-- A durable turn's workflow row, written and ended in the store's own transactions.
--
-- A durable chat turn is one DBOS workflow (`bastion.turn:{conversation}:{run}`, schema `dbos`), which
-- DBOS hands to a live process when the one running it dies. The process running the turn never
-- asks DBOS to execute it: the row only has to exist (PENDING, on this process's executor) while the
-- turn streams, and to end with the turn. DBOS wrote it through its own engine in four round trips
-- (BEGIN, the status row, the input row, COMMIT) and ended it in a fifth. Now `begin_turn_workflow`
-- writes it in one statement, through DBOS's own SQL (`dbos.enqueue_workflow`, portable JSON input),
-- then moves it off the queue onto the executor, as a workflow started directly is; and the turn's
-- close ends it in the same transaction (`end_turn_workflow`), with no round trip of its own.
--
-- `begin_turn_workflow` writes only for the caller's own run that is still the conversation's running
-- turn, claimed by this process, and locks that run until it commits: a close that comes first leaves
-- no row behind, a close that comes after ends it. `end_turn_workflow` ends only a row its process
-- began and nobody took over: a taken-over workflow is on DBOS's recovery queue (`queue_name` is set)
-- and DBOS ends it when the process that took it over finishes its turn.
--
-- Where DBOS's schema is missing or this function's owner may not use it, both fail and the turn runs
-- without durability, as when DBOS could not start the workflow before. Expand only: new functions.

create function bastion.begin_turn_workflow(
  p_conversation uuid,
  p_run uuid,
  p_worker bigint,
  p_input json,
  p_executor text,
  p_version text,
  p_application text
) returns boolean
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_id text := 'bastion.turn:' || p_conversation::text || ':' || p_run::text;
begin
  perform 1 from bastion.conversations c join bastion.runs r on r.id = c.active_run_id
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.tenant_id is not distinct from bastion.tenant_id()
     and r.id = p_run
     and r.status = 'running'
     and r.worker_key = p_worker
   for share of r;
  if not found then
    return false;
  end if;
  perform dbos.enqueue_workflow(
    'bastion.turn', 'bastion.turn', array[p_input], '{}'::json,
    workflow_id => v_id, app_version => p_version, application_name => p_application
  );
  update dbos.workflow_status w
     set status = 'PENDING', executor_id = p_executor, queue_name = null, recovery_attempts = 1
   where w.workflow_uuid = v_id and w.status = 'ENQUEUED' and w.queue_name = 'bastion.turn';
  return found;
end
$$;

create function bastion.end_turn_workflow(p_conversation uuid, p_run uuid, p_executor text) returns boolean
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_now bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
begin
  if not exists (
    select 1 from bastion.conversations c
     where c.id = p_conversation
       and c.owner_id = v_user
       and c.tenant_id is not distinct from bastion.tenant_id()
  ) then
    return false;
  end if;
  update dbos.workflow_status w
     set status = 'SUCCESS', owner_xid = null, updated_at = v_now, completed_at = v_now
   where w.workflow_uuid = 'bastion.turn:' || p_conversation::text || ':' || p_run::text
     and w.status = 'PENDING'
     and w.executor_id = p_executor
     and w.queue_name is null;
  return found;
end
$$;

revoke execute on function bastion.begin_turn_workflow(uuid, uuid, bigint, json, text, text, text) from public;
revoke execute on function bastion.end_turn_workflow(uuid, uuid, text) from public;
grant execute on function bastion.begin_turn_workflow(uuid, uuid, bigint, json, text, text, text) to authenticated;
grant execute on function bastion.end_turn_workflow(uuid, uuid, text) to authenticated;
