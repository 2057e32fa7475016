-- Event hooks: a durable outbox of every conversation's events, and each hook's position in it.
-- Applied as the `hooks` component, after bastion's migrations.
--
-- The outbox is written by triggers on the tables the turn protocol writes, so an event enters it in
-- the same transaction as the change it reports, whichever function made that change:
--   * every run event (`bastion.run_events`), under its own type and data;
--   * `message.received` / `message.completed`: a user / assistant message stored or changed, with
--     the message as stored, its position and the id of the message before it (`parentId`);
--   * `message.deleted`: a message an edit or a regeneration dropped, deepest first.
-- Message events name the conversation's running run, when there is one (the turn writing them).
-- `signed_in` is false for an event written for an anonymous user (`is_anonymous` in the token).
--
-- Order. `id` is assigned when the row is written, not when its transaction commits, so ids alone
-- can commit out of order across conversations. Readers therefore take only rows of transactions
-- older than every transaction still running (`tx < pg_snapshot_xmin(...)`), ordered by (tx, id):
-- a row that becomes visible later always sorts after every row taken before it. Within one
-- conversation the turn protocol holds the conversation's row lock, so its rows also follow `id`.
--
-- Nothing here is visible to `authenticated` or `anon`: the outbox holds every user's events. The
-- application's role reads and advances it as a member of `bastion_runtime`.

create table bastion.hook_events (
  id bigint generated always as identity primary key,
  tx xid8 not null default pg_current_xact_id(),
  conversation_id uuid not null,
  run_id uuid,
  owner_id uuid not null,
  tenant_id text,
  signed_in boolean not null,
  type text not null check (char_length(type) between 1 and 100),
  data jsonb not null default '{}'::jsonb,
  run_event_id bigint,
  created_at timestamptz not null default now()
);
create index hook_events_order on bastion.hook_events (tx, id);

-- One row per registered hook: the event types it takes and how far delivery has handed events to
-- the engine. `generation` grows with each replay, so a replayed event is delivered afresh.
create table bastion.hook_subscriptions (
  hook text primary key check (hook ~ '^[a-z][a-z0-9_.-]{0,99}$'),
  events text[] not null,
  position_tx xid8 not null default '0',
  position_id bigint not null default 0,
  generation integer not null default 0,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);

-- Deliveries that failed: retrying (`gave_up_at` null) or given up after the hook's last attempt.
-- A later success of the same delivery records `delivered_at`.
create table bastion.hook_failures (
  hook text not null references bastion.hook_subscriptions (hook) on delete cascade,
  event_id bigint not null,
  generation integer not null,
  conversation_id uuid not null,
  attempts integer not null check (attempts > 0),
  error text not null check (char_length(error) <= 1000),
  first_failed_at timestamptz not null default now(),
  last_failed_at timestamptz not null default now(),
  gave_up_at timestamptz,
  delivered_at timestamptz,
  primary key (hook, event_id, generation)
);

revoke all on bastion.hook_events, bastion.hook_subscriptions, bastion.hook_failures
  from public, anon, authenticated;
grant select on bastion.hook_events to bastion_runtime;
grant select, insert, update, delete on bastion.hook_subscriptions, bastion.hook_failures to bastion_runtime;
grant all on bastion.hook_events, bastion.hook_subscriptions, bastion.hook_failures to service_role;

alter table bastion.hook_events enable row level security;
alter table bastion.hook_events force row level security;
alter table bastion.hook_subscriptions enable row level security;
alter table bastion.hook_subscriptions force row level security;
alter table bastion.hook_failures enable row level security;
alter table bastion.hook_failures force row level security;
create policy hook_events_runtime on bastion.hook_events for select to bastion_runtime using (true);
create policy hook_subscriptions_runtime on bastion.hook_subscriptions for all to bastion_runtime
  using (true) with check (true);
create policy hook_failures_runtime on bastion.hook_failures for all to bastion_runtime
  using (true) with check (true);

-- Whether the caller of the writing transaction is a signed-in user (not an anonymous one).
create function bastion.hook_signed_in() returns boolean
  language sql stable
  set search_path = ''
  as $$ select coalesce(auth.jwt() ->> 'is_anonymous', 'false') <> 'true' $$;

-- The conversation's running run: the turn that is writing its messages, if any.
create function bastion.hook_running_run(p_conversation uuid) returns uuid
  language sql stable
  set search_path = ''
  as $$
    select r.id from bastion.runs r
     where r.conversation_id = p_conversation and r.status = 'running'
     order by r.started_at desc
     limit 1
  $$;

create function bastion.hook_record_run_events() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  insert into bastion.hook_events
    (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data, run_event_id)
  select n.conversation_id, n.run_id, n.owner_id, n.tenant_id, bastion.hook_signed_in(), n.type, n.data, n.id
    from new_events n
   order by n.id;
  if found then
    perform pg_notify('bastion_hooks', '');
  end if;
  return null;
end
$$;

create function bastion.hook_record_messages() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  insert into bastion.hook_events (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data)
  select n.conversation_id, bastion.hook_running_run(n.conversation_id), n.owner_id, n.tenant_id,
         bastion.hook_signed_in(),
         case n.role when 'user' then 'message.received' else 'message.completed' end,
         jsonb_build_object(
           'messageId', n.id,
           'seq', n.seq,
           'role', n.role,
           'parentId', (
             select p.id from bastion.messages p
              where p.conversation_id = n.conversation_id and p.seq < n.seq
              order by p.seq desc
              limit 1
           ),
           'message', n.message
         )
    from new_messages n
   order by n.seq;
  if found then
    perform pg_notify('bastion_hooks', '');
  end if;
  return null;
end
$$;

-- Rows dropped with their conversation report nothing: the conversation is gone with its events.
create function bastion.hook_record_deleted_messages() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  insert into bastion.hook_events (conversation_id, run_id, owner_id, tenant_id, signed_in, type, data)
  select o.conversation_id, bastion.hook_running_run(o.conversation_id), o.owner_id, o.tenant_id,
         bastion.hook_signed_in(), 'message.deleted',
         jsonb_build_object(
           'messageId', o.id,
           'seq', o.seq,
           'role', o.role,
           'parentId', (
             select p.id from (
               select m.seq, m.id from bastion.messages m
                where m.conversation_id = o.conversation_id and m.seq < o.seq
               union all
               select d.seq, d.id from old_messages d
                where d.conversation_id = o.conversation_id and d.seq < o.seq
             ) p
              order by p.seq desc
              limit 1
           )
         )
    from old_messages o
   where exists (select 1 from bastion.conversations c where c.id = o.conversation_id)
   order by o.conversation_id, o.seq desc;
  if found then
    perform pg_notify('bastion_hooks', '');
  end if;
  return null;
end
$$;

create trigger hook_outbox_run_events after insert on bastion.run_events
  referencing new table as new_events
  for each statement execute function bastion.hook_record_run_events();
create trigger hook_outbox_messages_inserted after insert on bastion.messages
  referencing new table as new_messages
  for each statement execute function bastion.hook_record_messages();
create trigger hook_outbox_messages_updated after update on bastion.messages
  referencing new table as new_messages
  for each statement execute function bastion.hook_record_messages();
create trigger hook_outbox_messages_deleted after delete on bastion.messages
  referencing old table as old_messages
  for each statement execute function bastion.hook_record_deleted_messages();

revoke execute on function
  bastion.hook_signed_in(),
  bastion.hook_running_run(uuid),
  bastion.hook_record_run_events(),
  bastion.hook_record_messages(),
  bastion.hook_record_deleted_messages()
  from public;
