-- A turn's stream log is written at its step boundaries, and live only while a reader follows it:
-- a resume asks the running worker to (`follow_run`, `follow:<run>` on channel `bastion_turns`),
-- and that worker's writes then notify (`append_chunks`'s `p_notify`). A write nobody follows does
-- not notify: a notifying commit waits for every other notifying commit in the cluster. A write of
-- no chunks that notifies answers a follower that found nothing new, so it reads again.

drop function bastion.append_chunks(uuid, integer, boolean, jsonb, boolean);

create function bastion.append_chunks(
  p_run uuid, p_seq integer, p_reset boolean, p_chunks jsonb, p_durable boolean, p_notify boolean
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
   where r.id = p_run and r.owner_id = v_user and r.tenant_id is not distinct from bastion.tenant_id();
  if not found then
    raise exception 'run not found' using errcode = 'BS404';
  end if;
  if p_durable and v_run.status = 'running' and not v_run.durable then
    update bastion.runs set durable = true where id = p_run;
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

-- Ask whichever worker runs the caller's run to write its stream log now and live from then on.
-- Returns whether the run is the caller's (a foreign or unknown run asks nothing of anyone).
create function bastion.follow_run(p_run uuid) returns boolean
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
begin
  perform 1 from bastion.runs r
   where r.id = p_run and r.owner_id = v_user and r.tenant_id is not distinct from bastion.tenant_id();
  if not found then
    return false;
  end if;
  perform pg_notify('bastion_turns', 'follow:' || p_run::text);
  return true;
end
$$;

revoke execute on function
  bastion.append_chunks(uuid, integer, boolean, jsonb, boolean, boolean),
  bastion.follow_run(uuid)
  from public;
grant execute on function
  bastion.append_chunks(uuid, integer, boolean, jsonb, boolean, boolean),
  bastion.follow_run(uuid)
  to authenticated;
