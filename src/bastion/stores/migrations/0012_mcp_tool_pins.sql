-- Approved tool lists of MCP connections (`bastion.stores.tool_pins`): the rug-pull protection.
--
-- The first time an application discovers a connection's tools, each tool's fingerprint (the SHA-256 of
-- its name, description, input schema and annotations, computed by the application) is recorded as
-- approved. A later listing is checked against it: a tool whose fingerprint differs, or a new tool, is a
-- change (`bastion.mcp_tool_changes`, with the old and the new definition), held out of the agent's tools
-- until an administrator approves it, unless the application's policy accepts changes (recorded as
-- accepted) or refuses the whole connection while anything differs. A tool the server no longer lists is
-- dropped from the approved list at once (recorded as removed); listed again later, it is new.
--
-- These rows are the application's, not a user's: no policy lets `authenticated` read them, and they are
-- reached only through the functions below, which only the application server may execute.

create table bastion.mcp_tools (
  application text not null check (char_length(application) between 1 and 200),
  connection text not null check (char_length(connection) between 1 and 200),
  tool text not null check (char_length(tool) between 1 and 200),
  fingerprint text not null check (fingerprint ~ '^[0-9a-f]{64}$'),
  definition jsonb not null,
  approved_at timestamptz not null default now(),
  primary key (application, connection, tool)
);

create table bastion.mcp_tool_changes (
  id bigint generated always as identity primary key,
  application text not null,
  connection text not null,
  tool text not null,
  kind text not null check (kind in ('added', 'changed', 'removed')),
  old_fingerprint text,
  old_definition jsonb,
  new_fingerprint text,
  new_definition jsonb,
  status text not null check (status in ('pending', 'approved', 'refused', 'accepted')),
  detected_at timestamptz not null default now(),
  detected_by uuid,
  decided_at timestamptz,
  decided_by text check (char_length(decided_by) between 1 and 200)
);

-- One open (pending or refused) change per offered version of a tool: a listing seen again adds nothing.
create unique index mcp_tool_changes_open on bastion.mcp_tool_changes
  (application, connection, tool, new_fingerprint) where status in ('pending', 'refused');

revoke all on bastion.mcp_tools, bastion.mcp_tool_changes from public, anon, authenticated;
grant all on bastion.mcp_tools, bastion.mcp_tool_changes to service_role;
alter table bastion.mcp_tools enable row level security;
alter table bastion.mcp_tools force row level security;
alter table bastion.mcp_tool_changes enable row level security;
alter table bastion.mcp_tool_changes force row level security;

-- The tools of `p_tools` (`[{"tool", "fingerprint", "definition"}]`) the agent may be offered now, after
-- recording what changed. `p_policy`: 'hold', 'accept' or 'refuse'.
create function bastion.mcp_check_tools(
  p_application text, p_connection text, p_policy text, p_tools jsonb
) returns setof text
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := auth.uid();
  v_differs boolean;
begin
  perform bastion.require_runtime_session();
  if p_policy is null or p_policy not in ('hold', 'accept', 'refuse') then
    raise exception 'a tool policy is hold, accept or refuse' using errcode = 'BS403';
  end if;
  -- Two turns checking one connection at once take turns, so the first listing is recorded once.
  perform pg_advisory_xact_lock(hashtextextended('bastion.mcp_tools:' || p_application || ':' || p_connection, 0));

  if not exists (select 1 from bastion.mcp_tools t
                  where t.application = p_application and t.connection = p_connection)
     and not exists (select 1 from bastion.mcp_tool_changes c
                      where c.application = p_application and c.connection = p_connection) then
    insert into bastion.mcp_tools (application, connection, tool, fingerprint, definition)
      select p_application, p_connection, o.tool, o.fingerprint, o.definition from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb);
    return query select o.tool from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb);
    return;
  end if;

  with gone as (
    delete from bastion.mcp_tools t
     where t.application = p_application and t.connection = p_connection
       and not exists (select 1 from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb) where o.tool = t.tool)
    returning t.tool, t.fingerprint, t.definition
  )
  insert into bastion.mcp_tool_changes
    (application, connection, tool, kind, old_fingerprint, old_definition, status, detected_by, decided_at)
    select p_application, p_connection, g.tool, 'removed', g.fingerprint, g.definition, 'accepted', v_user, now()
      from gone g;

  if p_policy = 'accept' then
    insert into bastion.mcp_tool_changes
      (application, connection, tool, kind, old_fingerprint, old_definition, new_fingerprint, new_definition,
       status, detected_by, decided_at)
      select p_application, p_connection, o.tool, case when t.tool is null then 'added' else 'changed' end,
             t.fingerprint, t.definition, o.fingerprint, o.definition, 'accepted', v_user, now()
        from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb)
        left join bastion.mcp_tools t
          on t.application = p_application and t.connection = p_connection and t.tool = o.tool
       where t.fingerprint is distinct from o.fingerprint;
    insert into bastion.mcp_tools (application, connection, tool, fingerprint, definition)
      select p_application, p_connection, o.tool, o.fingerprint, o.definition from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb)
      on conflict (application, connection, tool) do update
        set fingerprint = excluded.fingerprint, definition = excluded.definition, approved_at = now()
        where bastion.mcp_tools.fingerprint <> excluded.fingerprint;
    return query select o.tool from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb);
    return;
  end if;

  insert into bastion.mcp_tool_changes
    (application, connection, tool, kind, old_fingerprint, old_definition, new_fingerprint, new_definition,
     status, detected_by)
    select p_application, p_connection, o.tool, case when t.tool is null then 'added' else 'changed' end,
           t.fingerprint, t.definition, o.fingerprint, o.definition, 'pending', v_user
      from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb)
      left join bastion.mcp_tools t
        on t.application = p_application and t.connection = p_connection and t.tool = o.tool
     where t.fingerprint is distinct from o.fingerprint
    on conflict (application, connection, tool, new_fingerprint) where status in ('pending', 'refused')
      do nothing;

  select exists (
    select 1 from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb)
      left join bastion.mcp_tools t
        on t.application = p_application and t.connection = p_connection and t.tool = o.tool
     where t.fingerprint is distinct from o.fingerprint
  ) into v_differs;
  if p_policy = 'refuse' and v_differs then
    return;
  end if;
  return query
    select o.tool from jsonb_to_recordset(p_tools) as o(tool text, fingerprint text, definition jsonb)
      join bastion.mcp_tools t
        on t.application = p_application and t.connection = p_connection and t.tool = o.tool
     where t.fingerprint = o.fingerprint;
end
$$;

-- The application's changes, newest first; `p_status` null lists every status.
create function bastion.mcp_tool_changes(p_application text, p_status text)
  returns setof bastion.mcp_tool_changes
  language plpgsql stable
  security definer
  set search_path = ''
  as $$
begin
  perform bastion.require_runtime_session();
  return query
    select * from bastion.mcp_tool_changes c
     where c.application = p_application and (p_status is null or c.status = p_status)
     order by c.id desc;
end
$$;

-- Approve or refuse a pending change (a refused one may still be approved later). Approving puts the new
-- definition on the approved list. False when there is no such open change.
create function bastion.mcp_decide_tool_change(
  p_application text, p_id bigint, p_approve boolean, p_by text
) returns boolean
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_change bastion.mcp_tool_changes;
begin
  perform bastion.require_runtime_session();
  select * into v_change from bastion.mcp_tool_changes c
   where c.id = p_id and c.application = p_application and c.status in ('pending', 'refused')
   for update;
  if not found or (not p_approve and v_change.status = 'refused') then
    return false;
  end if;
  update bastion.mcp_tool_changes
     set status = case when p_approve then 'approved' else 'refused' end, decided_at = now(), decided_by = p_by
   where id = p_id;
  if p_approve then
    insert into bastion.mcp_tools (application, connection, tool, fingerprint, definition)
      values (v_change.application, v_change.connection, v_change.tool, v_change.new_fingerprint,
              v_change.new_definition)
      on conflict (application, connection, tool) do update
        set fingerprint = excluded.fingerprint, definition = excluded.definition, approved_at = now();
  end if;
  return true;
end
$$;

revoke execute on function bastion.mcp_check_tools(text, text, text, jsonb) from public;
revoke execute on function bastion.mcp_tool_changes(text, text) from public;
revoke execute on function bastion.mcp_decide_tool_change(text, bigint, boolean, text) from public;
grant execute on function bastion.mcp_check_tools(text, text, text, jsonb) to bastion_runtime;
grant execute on function bastion.mcp_tool_changes(text, text) to bastion_runtime;
grant execute on function bastion.mcp_decide_tool_change(text, bigint, boolean, text) to bastion_runtime;
