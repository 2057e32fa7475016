-- Durable turns checkpoint in bastion's own writes, not in DBOS steps: each finished model request of
-- a durable turn (its response and the chunks it streamed) is stored in `run_steps`, keyed by (run,
-- step), by the run's next write that happens anyway — a tool's claim, a stream log batch, or the
-- turn's close — in the same transaction. Log batches carry the run's finished tool results as well
-- (claims and closes already do), so a stored request never saw a result the store lacks. A turn taken over from a dead
-- process reads them back when it adopts the run (`adopt_turn`) and replays them instead of asking
-- the model again.
--
-- Every such write is fenced by the process running the run (`runs.worker_key`, which adoption
-- changes), checked in the same transaction under the run's row lock: a process that lost its run
-- to a successor (a zombie) can no longer claim, checkpoint, close or log for it. Its log writes
-- store nothing and answer "stop", so its turn ends.
--
-- A finished run's checkpoints are pruned with its stream log (`prune_run_chunks`, same signature).
--
-- Expand only: the earlier functions keep their signatures and behaviour.

create table bastion.run_steps (
  run_id uuid not null references bastion.runs (id) on delete cascade,
  step integer not null check (step >= 0),
  owner_id uuid not null,
  tenant_id text,
  record jsonb not null check (jsonb_typeof(record) = 'object'),
  created_at timestamptz not null default now(),
  primary key (run_id, step)
);

alter table bastion.run_steps enable row level security;
alter table bastion.run_steps force row level security;
grant all on bastion.run_steps to service_role;

-- Store a run's checkpoints: `[{step, record}]`. A step already stored is kept as it was. Internal:
-- callers have checked the run.
create function bastion.put_run_steps(p_run bastion.runs, p_steps jsonb) returns void
  language plpgsql
  set search_path = ''
  as $$
declare
  v_step jsonb;
begin
  for v_step in select value from jsonb_array_elements(coalesce(p_steps, '[]'::jsonb)) loop
    insert into bastion.run_steps (run_id, step, owner_id, tenant_id, record)
    values (p_run.id, (v_step ->> 'step')::integer, p_run.owner_id, p_run.tenant_id, v_step -> 'record')
    on conflict (run_id, step) do nothing;
  end loop;
end
$$;

-- The caller's run, locked, if process `p_worker` still runs it; else `BS410`. Pipelined before a
-- durable turn's claim or close in the same transaction, it fences that write and stores the
-- checkpoints `p_steps` with it.
create function bastion.record_run_steps(p_run uuid, p_worker bigint, p_steps jsonb) returns void
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_run bastion.runs;
begin
  select * into v_run from bastion.runs r
   where r.id = p_run and r.owner_id = v_user and r.tenant_id is not distinct from bastion.tenant_id()
   for update;
  if not found or v_run.status <> 'running' or v_run.worker_key is distinct from p_worker then
    raise exception 'the run is no longer run by this process' using errcode = 'BS410';
  end if;
  perform bastion.put_run_steps(v_run, p_steps);
end
$$;

-- `append_chunks` (0013, which it overloads: that one keeps its signature), carrying checkpoints and
-- finished tool results (as `record_tool_results`) and, given `p_worker`, fenced by the process
-- running the run: a batch from a process that no longer runs it stores nothing and answers true
-- ("stop"). As in 0013, it notifies the run's followers only when `p_notify`.
create function bastion.append_chunks(
  p_run uuid, p_seq integer, p_reset boolean, p_chunks jsonb, p_durable boolean, p_notify boolean,
  p_worker bigint, p_steps jsonb, p_tool_results jsonb
)
  returns boolean
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_run bastion.runs;
begin
  select * into v_run from bastion.runs r
   where r.id = p_run and r.owner_id = v_user and r.tenant_id is not distinct from bastion.tenant_id()
   for no key update;
  if not found then
    raise exception 'run not found' using errcode = 'BS404';
  end if;
  if p_worker is not null and v_run.status = 'running' and v_run.worker_key is distinct from p_worker then
    return true;
  end if;
  if v_run.status = 'running' then
    if p_durable and not v_run.durable then
      update bastion.runs set durable = true where id = p_run;
    end if;
    perform bastion.record_tool_results(
      v_run.conversation_id, p_run, v_run.owner_id, v_run.tenant_id, p_tool_results
    );
    perform bastion.put_run_steps(v_run, p_steps);
  end if;
  if p_reset or jsonb_array_length(p_chunks) > 0 then
    insert into bastion.run_chunks (run_id, owner_id, tenant_id, seq, reset, chunks)
    values (p_run, v_user, v_run.tenant_id, p_seq, p_reset, p_chunks);
  end if;
  if p_notify then
    perform pg_notify('bastion_turns', 'chunk:' || p_run::text);
  end if;
  return v_run.stop_requested_at is not null;
end
$$;

-- `adopt_run` (0009), answering with the run's checkpoints when adopted: `{adopted, steps: [record]}`
-- in step order, so a take-over costs one round trip.
create function bastion.adopt_turn(p_run uuid, p_worker bigint, p_lease_seconds double precision)
  returns jsonb
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  if not bastion.adopt_run(p_run, p_worker, p_lease_seconds) then
    return jsonb_build_object('adopted', false, 'steps', '[]'::jsonb);
  end if;
  return jsonb_build_object(
    'adopted', true,
    'steps', coalesce(
      (select jsonb_agg(s.record || jsonb_build_object('step', s.step) order by s.step)
         from bastion.run_steps s where s.run_id = p_run),
      '[]'::jsonb
    )
  );
end
$$;

-- As in 0009, deleting the finished runs' checkpoints too; the rows deleted, of both.
create or replace function bastion.prune_run_chunks(p_age interval) returns bigint
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_chunks bigint;
  v_steps bigint;
begin
  perform bastion.require_runtime_session();
  delete from bastion.run_chunks k
   using bastion.runs r
   where r.id = k.run_id and r.status <> 'running' and r.finished_at < now() - p_age;
  get diagnostics v_chunks = row_count;
  delete from bastion.run_steps s
   using bastion.runs r
   where r.id = s.run_id and r.status <> 'running' and r.finished_at < now() - p_age;
  get diagnostics v_steps = row_count;
  return v_chunks + v_steps;
end
$$;

revoke execute on function
  bastion.put_run_steps(bastion.runs, jsonb),
  bastion.record_run_steps(uuid, bigint, jsonb),
  bastion.append_chunks(uuid, integer, boolean, jsonb, boolean, boolean, bigint, jsonb, jsonb),
  bastion.adopt_turn(uuid, bigint, double precision)
  from public;
grant execute on function
  bastion.record_run_steps(uuid, bigint, jsonb),
  bastion.append_chunks(uuid, integer, boolean, jsonb, boolean, boolean, bigint, jsonb, jsonb),
  bastion.adopt_turn(uuid, bigint, double precision)
  to authenticated;
