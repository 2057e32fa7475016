-- A durable run is known by its workflow, not by a mark its process writes.
--
-- A run whose process died is live (not replaced by a newer turn, `run_is_live`) while its durable
-- workflow waits to be taken over. Until now the process marked the run durable (`runs.durable`)
-- with a stream log write of its own once the workflow existed: a round trip per turn, and a window
-- (from the workflow's row to that write) in which a dead process's run was replaced at once though
-- its workflow was about to take it over. Now the run is also live while DBOS's row for the run's
-- turn workflow (`bastion.turn:{conversation}:{run}`, schema `dbos`) is pending or queued for
-- recovery: exactly while a take-over can still come, with no write. A process that died before its
-- workflow's row existed still leaves a run a newer turn replaces at once; a workflow that ended
-- (whatever became of its turn) no longer holds the conversation.
--
-- `runs.durable` stays: adoption sets it, and a worker of the previous release still marks its runs.
-- Without DBOS's schema (durable turns never set up), or where this function's owner may not read it,
-- nothing changes: no run is live by its workflow.
--
-- Expand only: `run_is_live` keeps its signature and only counts more runs live.

create function bastion.turn_workflow_waits(p_run bastion.runs) returns boolean
  language plpgsql stable
  set search_path = ''
  as $$
declare
  v_table regclass;
begin
  -- Run as its caller: a user's own read (`load_turn`) may not see DBOS's schema; the claims, run as
  -- their owner, do.
  if not exists (select 1 from pg_catalog.pg_namespace n where n.nspname = 'dbos')
     or not pg_catalog.has_schema_privilege('dbos', 'usage') then
    return false;
  end if;
  v_table := pg_catalog.to_regclass('dbos.workflow_status');
  if v_table is null or not pg_catalog.has_table_privilege(v_table, 'select') then
    return false;
  end if;
  return exists (
    select 1 from dbos.workflow_status w
     where w.workflow_uuid = 'bastion.turn:' || p_run.conversation_id::text || ':' || p_run.id::text
       and w.status in ('PENDING', 'ENQUEUED')
  );
end
$$;

-- As in 0009, with a run live while its turn workflow waits (checked last: only for a dead process).
create or replace function bastion.run_is_live(p_run bastion.runs) returns boolean
  language sql stable
  set search_path = ''
  as $$
    select p_run.id is not null
       and p_run.status = 'running'
       and p_run.lease_expires_at > now()
       and (p_run.durable or p_run.worker_key is null or bastion.worker_alive(p_run.worker_key)
            or bastion.turn_workflow_waits(p_run))
  $$;

revoke execute on function bastion.turn_workflow_waits(bastion.runs) from public;
grant execute on function bastion.turn_workflow_waits(bastion.runs) to authenticated;
