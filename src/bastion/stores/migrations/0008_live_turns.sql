-- Live turns: a running turn can be asked to stop, and its UI message stream is a durable log, so
-- a reload, another worker or the worker that takes a turn over can replay it and follow it.
--
-- `run_chunks` holds a run's stream in batches (one row per coalesced write, not per token). `seq`
-- is the turn position of the batch's first chunk. A batch with `reset` starts a new attempt at
-- `seq`: whatever an earlier attempt wrote from that position on is superseded (a durable step that
-- re-ran after its worker died). Readers see only their own runs' rows, under row-level security.
--
-- Same conventions as 0003: writes go through SECURITY DEFINER functions that check the caller's
-- `auth.uid()`, tenant and the `bastion_runtime` membership of the login role, with a fixed
-- `search_path`. Each write notifies channel `bastion_turns` (`chunk:<run>`, `stop:<run>`), so
-- followers wake without polling; they poll slowly as well, since a notification can be missed.

alter table bastion.runs add column stop_requested_at timestamptz;

create table bastion.run_chunks (
  id bigint generated always as identity primary key,
  run_id uuid not null references bastion.runs (id) on delete cascade,
  owner_id uuid not null,
  tenant_id text,
  seq integer not null check (seq >= 0),
  reset boolean not null default false,
  chunks jsonb not null check (jsonb_typeof(chunks) = 'array'),
  created_at timestamptz not null default now()
);
create index run_chunks_replay on bastion.run_chunks (run_id, id);

alter table bastion.run_chunks enable row level security;
alter table bastion.run_chunks force row level security;
grant select on bastion.run_chunks to authenticated;
grant all on bastion.run_chunks to service_role;
create policy run_chunks_owner on bastion.run_chunks for select to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()));

-- Append one batch of a run's stream. Returns whether the run was asked to stop, so a streaming
-- turn learns of a stop with the writes it makes anyway.
create function bastion.append_chunks(p_run uuid, p_seq integer, p_reset boolean, p_chunks jsonb)
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
   where r.id = p_run and r.owner_id = v_user and r.tenant_id is not distinct from bastion.tenant_id();
  if not found then
    raise exception 'run not found' using errcode = 'BS404';
  end if;
  insert into bastion.run_chunks (run_id, owner_id, tenant_id, seq, reset, chunks)
  values (p_run, v_user, v_run.tenant_id, p_seq, p_reset, p_chunks);
  perform pg_notify('bastion_turns', 'chunk:' || p_run::text);
  return v_run.stop_requested_at is not null;
end
$$;

-- Ask the conversation's running run to stop. Returns the run's id, or null when none runs.
create function bastion.stop_turn(p_conversation uuid) returns uuid
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_conversation bastion.conversations;
  v_run uuid;
begin
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.tenant_id is not distinct from bastion.tenant_id();
  if not found then
    raise exception 'conversation not found' using errcode = 'BS404';
  end if;
  update bastion.runs r set stop_requested_at = coalesce(r.stop_requested_at, now())
   where r.id = v_conversation.active_run_id and r.status = 'running'
  returning r.id into v_run;
  if v_run is not null then
    perform pg_notify('bastion_turns', 'stop:' || v_run::text);
  end if;
  return v_run;
end
$$;

revoke execute on function
  bastion.append_chunks(uuid, integer, boolean, jsonb),
  bastion.stop_turn(uuid)
  from public;
grant execute on function
  bastion.append_chunks(uuid, integer, boolean, jsonb),
  bastion.stop_turn(uuid)
  to authenticated;
