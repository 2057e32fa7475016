-- A batch's writes at once: each chat, message and run the batch touches is written once with its
-- final state (and a settled run's message once more, for its status), in a few statements per batch
-- instead of one to three per event (a statement costs Postgres far more than a row). The effect is exactly that of
-- the writes applied one by one, in order, as 0003's `apply_session_writes` does (renamed here
-- `apply_session_writes_in_order`, its statements unchanged): a test applies generated batches both
-- ways and compares the tables.
--
-- What makes the final states computable from the state before the batch: within a chat, a batch's
-- writes come in rising event order (the outbox's order within a conversation), so a write newer
-- than its row before the batch is newer than every earlier write of the batch too, and "only newer
-- events win" reduces to a comparison with the row as it was. A batch out of that order (put
-- together by hand: delivery never builds one) is applied one write at a time instead.
--
-- Computed from the rows before the batch:
--   * a message: its writes newer than its row apply; the last gives its content, the first its
--     insert-only columns (owner, role, format, created_at), and its run is the last one named;
--   * a run: it exists from before the batch, or from its first event's write on; each final event
--     newer than the run's row settles it (all of them, for a run the batch creates); the last
--     settling one gives its status, usage and end; its message is the last assistant message
--     written naming it while it exists;
--   * a settled run's message takes the run's message status, the run's message being the one named
--     at that moment; the last such update wins, written after the messages;
--   * a chat: its active run and leaf are folded over its events in order in memory (the leaf of a
--     deletion depends on the leaf before it), then written once.

alter function bastion.apply_session_writes(bastion.session_write[]) rename to apply_session_writes_in_order;

create function bastion.apply_session_writes(p_writes bastion.session_write[]) returns void
  language plpgsql
  security invoker
  set search_path = ''
as $$
declare
  op record;
  v_chat uuid;
  v_leaf text; v_leaf_event bigint; v_active uuid; v_last_at timestamptz; v_touched boolean := false;
  f_chat uuid[] := '{}'; f_leaf text[] := '{}'; f_leaf_event bigint[] := '{}'; f_active uuid[] := '{}';
  f_last_at timestamptz[] := '{}';
  s_chat uuid[]; s_id text[]; s_status text[];
begin
  if exists (
    select 1 from (
      select w.event <= lag(w.event) over (partition by w.chat order by w.ordinality) as back
        from unnest(p_writes) with ordinality w
    ) x
     where x.back
  ) then
    perform bastion.apply_session_writes_in_order(p_writes);
    return;
  end if;

  insert into bastion.ai_chats (id, conversation_id, owner_id, tenant_id, agent_id, title, last_message_at)
  select distinct on (w.chat) w.chat, w.conversation, w.owner, w.tenant, w.agent, w.title, w.at
    from unnest(p_writes) with ordinality w
   where w.conversation is not null
   order by w.chat, w.ordinality
  on conflict (id) do nothing;

  -- Each chat's state, folded over its events in order (no statement per event).
  for op in
    select w.chat, w.write, w.run, w.event, w.at, w.id, w.parent,
           c.current_leaf_id, c.leaf_event_id, c.active_run_id, c.last_message_at,
           w.write in ('run_started', 'run_finished') and pr.id is null
             and w.ordinality = min(w.ordinality) filter (where w.write in ('run_started', 'run_finished'))
                                  over (partition by w.run) as creates,
           w.write = 'run_finished' and (pr.id is null or w.event > pr.event_id) as settles
      from unnest(p_writes) with ordinality w
      join bastion.ai_chats c on c.id = w.chat
      left join bastion.ai_runs pr on pr.id = w.run and w.write in ('run_started', 'run_finished')
     where w.write in ('run_started', 'run_finished', 'message', 'deleted')
     order by w.chat, w.ordinality
  loop
    if v_chat is distinct from op.chat then
      if v_touched then
        f_chat := f_chat || v_chat; f_leaf := f_leaf || v_leaf; f_leaf_event := f_leaf_event || v_leaf_event;
        f_active := f_active || v_active; f_last_at := f_last_at || v_last_at;
      end if;
      v_chat := op.chat; v_leaf := op.current_leaf_id; v_leaf_event := op.leaf_event_id;
      v_active := op.active_run_id; v_last_at := op.last_message_at; v_touched := false;
    end if;
    if op.write = 'run_started' then
      if op.creates then v_active := op.run; v_touched := true; end if;
    elsif op.write = 'run_finished' then
      if op.settles and v_active = op.run then v_active := null; v_touched := true; end if;
    elsif op.write = 'message' then
      if v_leaf_event < op.event then
        v_leaf := op.id; v_leaf_event := op.event; v_last_at := op.at; v_touched := true;
      end if;
    elsif op.write = 'deleted' then
      if v_leaf = op.id and v_leaf_event < op.event then
        v_leaf := op.parent; v_leaf_event := op.event; v_touched := true;
      end if;
    end if;
  end loop;
  if v_touched then
    f_chat := f_chat || v_chat; f_leaf := f_leaf || v_leaf; f_leaf_event := f_leaf_event || v_leaf_event;
    f_active := f_active || v_active; f_last_at := f_last_at || v_last_at;
  end if;

  -- Messages and runs, each row written once with its final state, from the state before the batch.
  with w as (select u.*, u.ordinality as ord from unnest(p_writes) with ordinality u),
  prior_runs as (
    select r.id, r.event_id, r.assistant_message_id from bastion.ai_runs r
     where r.id in (select w.run from w where w.write in ('run_started', 'run_finished', 'message'))
  ),
  run_events as (
    select w.*, p.id is not null as existed, p.event_id as event0,
           min(w.ord) over (partition by w.run) as first_ord
      from w left join prior_runs p on p.id = w.run
     where w.write in ('run_started', 'run_finished')
  ),
  -- when each run exists from: before the batch (0) or its first event's write
  run_from as (
    select p.id as run, 0::bigint as from_ord from prior_runs p
    union all
    select distinct e.run, e.first_ord from run_events e where not e.existed
  ),
  prior_messages as (
    select m.chat_id, m.id, m.event_id from bastion.ai_messages m
     where (m.chat_id, m.id) in (select w.chat, w.id from w where w.write = 'message')
  ),
  written as (  -- the message writes that apply: newer than the row (a chat's events come in order)
    select w.* from w left join prior_messages p on p.chat_id = w.chat and p.id = w.id
     where w.write = 'message' and (p.id is null or w.event > p.event_id)
  ),
  assistant_writes as (  -- an assistant message written while its run exists names the run's message
    select x.run, x.chat, x.id, x.ord from written x join run_from f on f.run = x.run
     where x.role = 'assistant' and f.from_ord < x.ord
  ),
  settled as (
    select e.* from run_events e
     where e.write = 'run_finished' and (not e.existed or e.event > e.event0)
  ),
  timeline as (  -- each run's assistant messages and settling events, in order
    select a.run, a.ord, a.chat, a.id as named, null::text as message_status, false as settles
      from assistant_writes a
    union all
    select e.run, e.ord, e.chat, null, e.message_status, true from settled e
  ),
  status_updates as (  -- each settled run's message at that moment (a message named by a run exists)
    select t.chat, coalesce(t.named_so_far[cardinality(t.named_so_far)], p.assistant_message_id) as id,
           t.message_status, t.ord
      from (
        select t.*, array_agg(t.named) filter (where t.named is not null)
                      over (partition by t.run order by t.ord) as named_so_far
          from timeline t
      ) t
      left join prior_runs p on p.id = t.run
     where t.settles
  ),
  final_status as (
    select distinct on (u.chat, u.id) u.chat, u.id, u.message_status from status_updates u
     where u.id is not null
     order by u.chat, u.id, u.ord desc
  ),
  messages as (
    select x.chat, x.id,
           (array_agg(x.parent order by x.ord desc))[1] as parent,
           (array_agg(x.owner order by x.ord))[1] as owner,
           (array_agg(x.tenant order by x.ord))[1] as tenant,
           (array_agg(x.role order by x.ord))[1] as role,
           (array_agg(x.parts order by x.ord desc))[1] as parts,
           (array_agg(x.format order by x.ord))[1] as format,
           (array_agg(x.native order by x.ord desc))[1] as native,
           (array_agg(x.metadata order by x.ord desc))[1] as metadata,
           (array_agg(x.run order by x.ord desc) filter (where x.run is not null))[1] as run,
           max(x.event) as event,
           (array_agg(x.at order by x.ord))[1] as at
      from written x group by x.chat, x.id
  ),
  message_writes as (
    insert into bastion.ai_messages as m
      (chat_id, id, parent_id, owner_id, tenant_id, role, parts, format, native, metadata, run_id,
       event_id, created_at)
    select g.chat, g.id, g.parent, g.owner, g.tenant, g.role, g.parts, g.format, g.native, g.metadata,
           g.run, g.event, g.at
      from messages g
    on conflict (chat_id, id) do update
       set parent_id = excluded.parent_id, parts = excluded.parts, native = excluded.native,
           metadata = excluded.metadata, run_id = coalesce(excluded.run_id, m.run_id),
           event_id = excluded.event_id, updated_at = now()
  ),
  runs as (
    select e.run,
           (array_agg(e.chat order by e.ord))[1] as chat,
           (array_agg(e.owner order by e.ord))[1] as owner,
           (array_agg(e.tenant order by e.ord))[1] as tenant,
           bool_or(e.existed) as existed,
           (array_agg(e.at order by e.ord))[1] as started_at,
           (array_agg(e.event order by e.ord))[1] as first_event,
           (array_agg(e.status order by e.ord desc) filter (where s.ord is not null))[1] as status,
           (array_agg(e.usage order by e.ord desc) filter (where s.ord is not null))[1] as usage,
           max(e.event) filter (where s.ord is not null) as settled_event,
           (array_agg(e.at order by e.ord desc) filter (where s.ord is not null))[1] as ended_at
      from run_events e left join settled s on s.run = e.run and s.ord = e.ord
     where not e.existed or s.ord is not null
     group by e.run
  ),
  final_runs as (
    select coalesce(r.run, a.run) as run, r.chat, r.owner, r.tenant, r.existed, r.started_at, r.first_event,
           r.status, r.usage, r.settled_event, r.ended_at, a.id as assistant_id
      from runs r
      full join (
        select distinct on (a.run) a.run, a.id from assistant_writes a order by a.run, a.ord desc
      ) a on a.run = r.run
  ),
  run_writes as (
    insert into bastion.ai_runs as r
      (id, chat_id, owner_id, tenant_id, status, usage, event_id, started_at, ended_at, assistant_message_id)
    select f.run, f.chat, f.owner, f.tenant, coalesce(f.status, 'running'), coalesce(f.usage, '{}'),
           coalesce(f.settled_event, f.first_event), f.started_at, f.ended_at, f.assistant_id
      from final_runs f
     where f.existed is false
    on conflict (id) do nothing
  ),
  run_updates as (
    update bastion.ai_runs r
       set status = coalesce(f.status, r.status), usage = coalesce(f.usage, r.usage),
           event_id = coalesce(f.settled_event, r.event_id), ended_at = coalesce(f.ended_at, r.ended_at),
           assistant_message_id = coalesce(f.assistant_id, r.assistant_message_id)
      from final_runs f
     where r.id = f.run and f.existed is not false
  )
  select coalesce(array_agg(s.chat), '{}'), coalesce(array_agg(s.id), '{}'), coalesce(array_agg(s.message_status), '{}')
    into s_chat, s_id, s_status
    from final_status s;

  -- The settled runs' messages, written or not by the batch (a message keeps its status otherwise).
  update bastion.ai_messages m set status = s.status, updated_at = now()
    from unnest(s_chat, s_id, s_status) as s (chat, id, status)
   where m.chat_id = s.chat and m.id = s.id;

  update bastion.ai_chats c
     set current_leaf_id = f.leaf, leaf_event_id = f.leaf_event, active_run_id = f.active,
         last_message_at = f.last_at, updated_at = now()
    from unnest(f_chat, f_leaf, f_leaf_event, f_active, f_last_at) as f (chat, leaf, leaf_event, active, last_at)
   where c.id = f.chat;
end
$$;

revoke execute on function bastion.apply_session_writes(bastion.session_write[]) from public, anon, authenticated;
grant execute on function bastion.apply_session_writes(bastion.session_write[]) to bastion_runtime;
