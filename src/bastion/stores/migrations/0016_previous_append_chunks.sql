-- Expand: the previous release's `append_chunks(uuid, integer, boolean, jsonb, boolean)` (0010) is back,
-- so its workers keep writing their turns' stream logs while this release's serve the same database
-- (a rolling deploy). 0013 dropped it for the overload with `p_notify`; a worker of the previous
-- release then failed every turn it ran once this release had migrated the database.
--
-- It behaves as in 0010: a write that stores chunks notifies the run's followers (the previous release
-- follows runs by listening, without `follow_run`), and it is not fenced by the process running the
-- run (the previous release does not name it). Contract: drop it in the release after this one, once
-- no worker of the previous release is left.

create function bastion.append_chunks(
  p_run uuid, p_seq integer, p_reset boolean, p_chunks jsonb, p_durable boolean
)
  returns boolean
  language sql
  security invoker
  set search_path = ''
  as $$
    select bastion.append_chunks(
      p_run, p_seq, p_reset, p_chunks, p_durable, p_reset or pg_catalog.jsonb_array_length(p_chunks) > 0
    )
  $$;

revoke execute on function bastion.append_chunks(uuid, integer, boolean, jsonb, boolean) from public;
grant execute on function bastion.append_chunks(uuid, integer, boolean, jsonb, boolean) to authenticated;
