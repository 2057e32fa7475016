-- A durable turn marks its run durable with its stream log's next write (once its workflow exists)
-- instead of in a transaction of its own: `append_chunks` takes `p_durable`. A batch of no chunks
-- carries only the mark, and logs nothing.

drop function bastion.append_chunks(uuid, integer, boolean, jsonb);

create function bastion.append_chunks(
  p_run uuid, p_seq integer, p_reset boolean, p_chunks jsonb, p_durable boolean
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
    perform pg_notify('bastion_turns', 'chunk:' || p_run::text);
  end if;
  return v_run.stop_requested_at is not null;
end
$$;

revoke execute on function bastion.append_chunks(uuid, integer, boolean, jsonb, boolean) from public;
grant execute on function bastion.append_chunks(uuid, integer, boolean, jsonb, boolean) to authenticated;
