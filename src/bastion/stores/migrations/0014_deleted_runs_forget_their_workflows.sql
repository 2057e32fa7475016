-- A deleted run takes its durable workflow with it. A turn's workflow (`bastion.turn:{conversation}:
-- {run}`, see `bastion.durable.turns`) keeps the conversation in DBOS's tables: the messages in its
-- input, the model's responses in its steps' outputs. Runs go only with their conversation, so when a
-- user deletes a conversation (through the routes or through the Data API) this trigger deletes its
-- turns' workflows in the same transaction, by their exact ids.
--
-- DBOS's tables (schema `dbos`) are created after these migrations, by `migrate_durable`, and an
-- application without durable turns has none: the function looks them up when it fires, every table
-- of schema `dbos` keyed by `workflow_uuid` (status, inputs, outputs, steps, events, streams), the
-- status last. A turn still running when its conversation is deleted finds its workflow gone: DBOS
-- records nothing more for it (its outcome is refused as no longer owned), and the client sees the turn
-- end with an error. `forget_orphan_turn_workflows` deletes whatever rows of a turn workflow no run is
-- left for; it repairs, below, the workflows of conversations deleted before this migration.

-- DBOS's tables keyed by workflow, the status last (others may refer to it).
create function bastion.turn_workflow_tables() returns setof regclass
  language sql stable
  set search_path = ''
  as $$
    select c.oid::regclass
      from pg_catalog.pg_class c
      join pg_catalog.pg_namespace n on n.oid = c.relnamespace
      join pg_catalog.pg_attribute a on a.attrelid = c.oid
     where n.nspname = 'dbos' and c.relkind in ('r', 'p') and a.attname = 'workflow_uuid'
       and not a.attisdropped
     order by c.relname = 'workflow_status', c.relname
  $$;

-- Delete the named workflows from every table; returns how many workflows were found.
create function bastion.forget_turn_workflows(p_ids text[]) returns bigint
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_table regclass;
  v_deleted bigint := 0;
begin
  if cardinality(p_ids) = 0 then
    return 0;
  end if;
  for v_table in select bastion.turn_workflow_tables() loop
    execute format('delete from %s where workflow_uuid = any($1)', v_table) using p_ids;
    get diagnostics v_deleted = row_count;
  end loop;
  return v_deleted;
end
$$;

create function bastion.forget_deleted_runs_workflows() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  perform bastion.forget_turn_workflows(array(
    select 'bastion.turn:' || d.conversation_id || ':' || d.id from deleted_runs d
  ));
  return null;
end
$$;

create trigger runs_forget_workflows after delete on bastion.runs
  referencing old table as deleted_runs
  for each statement execute function bastion.forget_deleted_runs_workflows();

-- The rows of turn workflows whose run is gone, in every table. Returns how many rows went.
create function bastion.forget_orphan_turn_workflows() returns bigint
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_table regclass;
  v_rows bigint;
  v_count bigint := 0;
begin
  for v_table in select bastion.turn_workflow_tables() loop
    execute format(
      'delete from %s w where starts_with(w.workflow_uuid, %L) and not exists ('
      ' select 1 from bastion.runs r where %L || r.conversation_id || %L || r.id = w.workflow_uuid)',
      v_table, 'bastion.turn:', 'bastion.turn:', ':'
    );
    get diagnostics v_rows = row_count;
    v_count := v_count + v_rows;
  end loop;
  return v_count;
end
$$;

revoke execute on function
  bastion.turn_workflow_tables(),
  bastion.forget_turn_workflows(text[]),
  bastion.forget_deleted_runs_workflows(),
  bastion.forget_orphan_turn_workflows()
  from public;
grant execute on function bastion.forget_orphan_turn_workflows() to bastion_runtime;

select bastion.forget_orphan_turn_workflows();
