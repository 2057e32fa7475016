-- Conversations as the application's own entities: the agent a conversation belongs to and the
-- application's JSON state (seed 003's entity bridge). Both are written only by the application
-- server (a session whose login role is a member of `bastion_runtime`), never by a user connecting
-- directly with their token, so an application may trust what it keeps there. Users read them on
-- their own rows like every other column.
--
-- Upgrade path: a database whose conversations already carry a `state` column of type text (an
-- application that kept its state there before) has it converted to jsonb, after an audit: when any
-- row holds text that is not JSON, the migration lists those rows and refuses, and since every
-- migration runs in one transaction nothing of it is applied. Fix or clear those rows, then migrate
-- again. Existing rows keep their owner and tenant, so every conversation stays visible to its owner.

alter table bastion.conversations
  add column agent_name text check (agent_name is null or char_length(agent_name) between 1 and 200);

do $state$
declare
  v_type text;
  v_bad text;
  v_row record;
begin
  select format_type(a.atttypid, a.atttypmod) into v_type
    from pg_attribute a
   where a.attrelid = 'bastion.conversations'::regclass and a.attname = 'state' and not a.attisdropped;
  if v_type is null then
    alter table bastion.conversations add column state jsonb;
    return;
  end if;
  if v_type = 'jsonb' then
    return;
  end if;
  if v_type not in ('text', 'character varying', 'json') then
    raise exception 'bastion.conversations.state has type %, which cannot become jsonb', v_type;
  end if;
  -- The audit: rows whose text would not cast (blank text becomes null), each tried on its own.
  for v_row in select c.id, nullif(btrim(c.state::text), '') as state
                 from bastion.conversations c order by c.id loop
    if v_row.state is not null then
      begin
        perform v_row.state::jsonb;
      exception when others then
        v_bad := concat_ws(', ', v_bad, v_row.id::text);
      end;
    end if;
  end loop;
  if v_bad is not null then
    raise exception 'conversations whose state is not JSON: %', v_bad
      using hint = 'Fix or clear their state, then migrate again; nothing was changed.';
  end if;
  alter table bastion.conversations
    alter column state type jsonb using nullif(btrim(state::text), '')::jsonb;
end
$state$;

create index conversations_owner_agent_recent
  on bastion.conversations (owner_id, agent_name, updated_at desc);

-- Only the application server sets an agent name or state; a direct client may still create and
-- rename its conversations (the other columns keep their grants).
create function bastion.guard_conversation_entity() returns trigger
  language plpgsql
  set search_path = ''
  as $$
begin
  if (tg_op = 'INSERT' and (new.agent_name is not null or new.state is not null))
     or (tg_op = 'UPDATE' and (new.agent_name is distinct from old.agent_name
                               or new.state is distinct from old.state)) then
    if not pg_has_role(session_user, 'bastion_runtime', 'MEMBER') then
      raise exception 'only the application server may set a conversation''s agent or state'
        using errcode = 'BS403';
    end if;
  end if;
  return new;
end
$$;

create trigger conversations_guard_entity
  before insert or update of agent_name, state on bastion.conversations
  for each row execute function bastion.guard_conversation_entity();

grant insert (agent_name, state) on bastion.conversations to authenticated;
grant update (agent_name, state) on bastion.conversations to authenticated;
