-- A deleted run takes its memory extraction jobs with it. With the durable engine, a chat turn's
-- extraction is a DBOS workflow (`bastion.memory.extract:{memory}:{run}`, see
-- `bastion.memory.extraction_jobs`) whose input holds the turn's messages. Runs go only with their
-- conversation, so deleting a conversation deletes its turns' extraction jobs in the same transaction,
-- from every table of schema `dbos` (`bastion.forget_turn_workflows`, as turn workflows go). The facts a
-- job already stored are the user's memories and stay, as the `remember` tool's do.
--
-- DBOS's tables may not exist (an application without the durable engine): the function looks for them
-- when it fires. The jobs are found among the workflows created since the oldest deleted run started
-- (DBOS indexes `created_at`), by their name and the run id that ends their id.

create function bastion.memory_forget_deleted_runs_jobs() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_runs text[];
  v_since bigint;
  v_ids text[];
begin
  if pg_catalog.to_regclass('dbos.workflow_status') is null then
    return null;
  end if;
  select array_agg(r.id::text), (extract(epoch from min(r.started_at)) * 1000)::bigint
    into v_runs, v_since
    from deleted_runs r;
  if v_runs is null then
    return null;
  end if;
  execute 'select coalesce(array_agg(w.workflow_uuid), ''{}'') from dbos.workflow_status w'
    ' where w.created_at >= $1 and w.name = ''bastion.memory.extract'''
    ' and substring(w.workflow_uuid from ''[^:]+$'') = any($2)'
    into v_ids using v_since, v_runs;
  perform bastion.forget_turn_workflows(v_ids);
  return null;
end
$$;

create trigger memory_runs_deleted_jobs after delete on bastion.runs
  referencing old table as deleted_runs
  for each statement execute function bastion.memory_forget_deleted_runs_jobs();

revoke execute on function bastion.memory_forget_deleted_runs_jobs() from public;
