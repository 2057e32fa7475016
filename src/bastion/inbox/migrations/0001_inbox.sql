-- The inbox: contacts, their support conversations (answered by the bot or by staff) and the messages
-- in them, applied as the `inbox` component after bastion's migrations.
--
-- Two kinds of caller reach these rows, and nobody else reaches any:
-- - Staff: a signed-in user (`authenticated`, `auth.uid()` set) whose tenant claim is the row's tenant
--   sees the tenant's whole inbox, switches a conversation between `bot` and `human`, and replies.
-- - A contact: never a user. The application server, after verifying a contact token or a channel's
--   secret, switches to the `bastion_contact` role with claims naming one tenant, contact and
--   conversation (`inbox_contact`); that role reads only that conversation and writes only contact
--   messages into it. It has no privilege on any other table (memory, notes, credentials, chats).
--
-- What only the application server may do (a session whose login role is a member of
-- `bastion_runtime`) goes through the SECURITY DEFINER functions below: recording a channel's message,
-- opening a widget conversation, reading what a channel must deliver, posting the bot's reply, and the
-- agent's request for a human.
--
-- Routing: a contact message in a bot-mode conversation is answered once, by the reply job named after
-- it. Every change of `bot_mode` records the conversation's last message (`handoff_seq`), so a job for
-- a message from before the change is dropped even if the conversation is back in bot mode by then.
--
-- SQLSTATEs: BS403 forbidden, BS404 not found, BS409 conflict.

do $roles$
begin
  begin
    create role bastion_contact nologin noinherit;
  exception when duplicate_object then null;
  end;
end
$roles$;

-- The application server becomes the contact with SET LOCAL ROLE; it never inherits the role's rights.
grant bastion_contact to bastion_runtime;
grant usage on schema bastion to bastion_contact;
grant usage on schema auth to bastion_contact;

-- One claim of the contact the server acts as (`request.jwt.claims` -> `inbox_contact`).
create function bastion.inbox_contact_claim(p_name text) returns text
  language sql stable
  set search_path = ''
  as $$ select nullif(auth.jwt() -> 'inbox_contact' ->> p_name, '') $$;

-- The tenant whose inbox the caller staffs: a signed-in user's tenant, or null.
create function bastion.inbox_staff_tenant() returns text
  language sql stable
  set search_path = ''
  as $$ select case when auth.uid() is not null then bastion.tenant_id() end $$;

create table bastion.inbox_contacts (
  id uuid primary key default gen_random_uuid(),
  tenant_id text not null check (char_length(tenant_id) between 1 and 200),
  channel text not null check (char_length(channel) between 1 and 64),
  external_id text not null check (char_length(external_id) between 1 and 200),
  display_name text check (char_length(display_name) between 1 and 200),
  created_at timestamptz not null default now(),
  unique (tenant_id, channel, external_id),
  unique (id, tenant_id)
);

create table bastion.inbox_conversations (
  id uuid primary key default gen_random_uuid(),
  tenant_id text not null,
  contact_id uuid not null,
  channel text not null check (char_length(channel) between 1 and 64),
  thread_id text not null check (char_length(thread_id) between 1 and 200),
  bot_mode text not null default 'bot' check (bot_mode in ('bot', 'human')),
  handoff_reason text check (char_length(handoff_reason) <= 500),
  -- The reply job whose agent asked for a human: that one reply still posts.
  handoff_job text check (char_length(handoff_job) <= 200),
  handoff_seq bigint not null default 0,
  last_message_seq bigint not null default 0,
  last_message_at timestamptz,
  preview text,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  unique (tenant_id, channel, thread_id),
  unique (id, tenant_id),
  foreign key (contact_id, tenant_id) references bastion.inbox_contacts (id, tenant_id) on delete cascade
);
create index inbox_conversations_recent on bastion.inbox_conversations (tenant_id, last_message_at desc);

create table bastion.inbox_messages (
  id uuid primary key default gen_random_uuid(),
  seq bigint generated always as identity,
  conversation_id uuid not null,
  tenant_id text not null,
  author text not null check (author in ('contact', 'bot', 'staff')),
  staff_id uuid,
  body text not null check (char_length(body) between 1 and 8000),
  -- The channel's id of the message, or the widget's client id: a redelivery stores nothing new.
  external_id text check (char_length(external_id) between 1 and 200),
  -- The contact message a bot reply answers: one reply each, however often its job runs.
  reply_to uuid references bastion.inbox_messages (id) on delete cascade,
  created_at timestamptz not null default now(),
  constraint inbox_messages_staff check ((author = 'staff') = (staff_id is not null)),
  constraint inbox_messages_reply check ((author = 'bot') = (reply_to is not null)),
  constraint inbox_messages_external unique (conversation_id, external_id),
  constraint inbox_messages_one_reply unique (reply_to),
  foreign key (conversation_id, tenant_id)
    references bastion.inbox_conversations (id, tenant_id) on delete cascade
);
create index inbox_messages_order on bastion.inbox_messages (conversation_id, seq);

revoke all on bastion.inbox_contacts, bastion.inbox_conversations, bastion.inbox_messages
  from public, anon, authenticated;
grant all on bastion.inbox_contacts, bastion.inbox_conversations, bastion.inbox_messages to service_role;

-- Staff.
grant select on bastion.inbox_contacts, bastion.inbox_conversations, bastion.inbox_messages to authenticated;
grant update (bot_mode, handoff_reason) on bastion.inbox_conversations to authenticated;
grant insert (conversation_id, tenant_id, author, staff_id, body, external_id)
  on bastion.inbox_messages to authenticated;

-- The contact: its own conversation, without staff-only columns.
grant select (id, display_name) on bastion.inbox_contacts to bastion_contact;
grant select (id, tenant_id, contact_id, bot_mode, handoff_seq, handoff_job, created_at)
  on bastion.inbox_conversations to bastion_contact;
grant select (id, seq, conversation_id, author, body, external_id, reply_to, created_at)
  on bastion.inbox_messages to bastion_contact;
grant insert (conversation_id, tenant_id, author, body, external_id) on bastion.inbox_messages
  to bastion_contact;

alter table bastion.inbox_contacts enable row level security;
alter table bastion.inbox_contacts force row level security;
alter table bastion.inbox_conversations enable row level security;
alter table bastion.inbox_conversations force row level security;
alter table bastion.inbox_messages enable row level security;
alter table bastion.inbox_messages force row level security;

create policy inbox_contacts_staff on bastion.inbox_contacts for select to authenticated
  using (tenant_id = (select bastion.inbox_staff_tenant()));
create policy inbox_conversations_staff_read on bastion.inbox_conversations for select to authenticated
  using (tenant_id = (select bastion.inbox_staff_tenant()));
create policy inbox_conversations_staff_mode on bastion.inbox_conversations for update to authenticated
  using (tenant_id = (select bastion.inbox_staff_tenant()))
  with check (tenant_id = (select bastion.inbox_staff_tenant()));
create policy inbox_messages_staff_read on bastion.inbox_messages for select to authenticated
  using (tenant_id = (select bastion.inbox_staff_tenant()));
create policy inbox_messages_staff_reply on bastion.inbox_messages for insert to authenticated
  with check (
    tenant_id = (select bastion.inbox_staff_tenant())
    and author = 'staff'
    and staff_id = (select auth.uid())
  );

create policy inbox_contacts_self on bastion.inbox_contacts for select to bastion_contact
  using (
    id = (select bastion.inbox_contact_claim('contact_id'))::uuid
    and tenant_id = (select bastion.inbox_contact_claim('tenant_id'))
  );
create policy inbox_conversations_contact on bastion.inbox_conversations for select to bastion_contact
  using (
    id = (select bastion.inbox_contact_claim('conversation_id'))::uuid
    and contact_id = (select bastion.inbox_contact_claim('contact_id'))::uuid
    and tenant_id = (select bastion.inbox_contact_claim('tenant_id'))
  );
create policy inbox_messages_contact_read on bastion.inbox_messages for select to bastion_contact
  using (
    conversation_id = (select bastion.inbox_contact_claim('conversation_id'))::uuid
    and tenant_id = (select bastion.inbox_contact_claim('tenant_id'))
  );
create policy inbox_messages_contact_write on bastion.inbox_messages for insert to bastion_contact
  with check (
    conversation_id = (select bastion.inbox_contact_claim('conversation_id'))::uuid
    and tenant_id = (select bastion.inbox_contact_claim('tenant_id'))
    and author = 'contact'
    and exists (
      select 1 from bastion.inbox_conversations c
       where c.id = conversation_id
         and c.contact_id = (select bastion.inbox_contact_claim('contact_id'))::uuid
    )
  );

-- Every message moves its conversation's position forward (and takes its row lock, so a message and
-- a change of mode are ordered).
create function bastion.inbox_message_added() returns trigger
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  update bastion.inbox_conversations c
     set last_message_seq = greatest(c.last_message_seq, new.seq), last_message_at = new.created_at,
         preview = left(new.body, 200), updated_at = now()
   where c.id = new.conversation_id;
  return new;
end
$$;
create trigger inbox_message_added after insert on bastion.inbox_messages
  for each row execute function bastion.inbox_message_added();

-- A change of mode drops every reply job of the messages before it; back in bot mode, the reason goes.
create function bastion.inbox_mode_changed() returns trigger
  language plpgsql
  set search_path = ''
  as $$
begin
  if new.bot_mode is distinct from old.bot_mode then
    new.handoff_seq := old.last_message_seq;
    new.updated_at := now();
    if new.bot_mode = 'bot' then
      new.handoff_reason := null;
      new.handoff_job := null;
    end if;
  end if;
  return new;
end
$$;
create trigger inbox_mode_changed before update on bastion.inbox_conversations
  for each row execute function bastion.inbox_mode_changed();

create function bastion.inbox_require_runtime() returns void
  language plpgsql stable
  set search_path = ''
  as $$
begin
  if not pg_has_role(session_user, 'bastion_runtime', 'MEMBER') then
    raise exception 'only the application server may do this' using errcode = 'BS403';
  end if;
end
$$;

-- A message a channel adapter delivered, in the tenant the channel's secret belongs to: the contact
-- and the thread's conversation are found or created; a message id seen before stores nothing new.
create function bastion.inbox_record_inbound(
  p_tenant text,
  p_channel text,
  p_thread text,
  p_contact text,
  p_contact_name text,
  p_external_id text,
  p_body text
) returns table (
  conversation_id uuid, contact_id uuid, message_id uuid, seq bigint, bot_mode text, duplicate boolean
)
  language plpgsql
  security definer
  set search_path = ''
  as $$
#variable_conflict use_column
declare
  v_contact uuid;
  v_conversation uuid;
  v_owner uuid;
  v_mode text;
  v_message uuid;
  v_seq bigint;
begin
  perform bastion.inbox_require_runtime();
  insert into bastion.inbox_contacts as k (tenant_id, channel, external_id, display_name)
  values (p_tenant, p_channel, p_contact, p_contact_name)
  on conflict (tenant_id, channel, external_id)
    do update set display_name = coalesce(excluded.display_name, k.display_name)
  returning k.id into v_contact;
  insert into bastion.inbox_conversations as c (tenant_id, contact_id, channel, thread_id)
  values (p_tenant, v_contact, p_channel, p_thread)
  on conflict (tenant_id, channel, thread_id) do nothing;
  select c.id, c.contact_id, c.bot_mode into v_conversation, v_owner, v_mode
    from bastion.inbox_conversations c
   where c.tenant_id = p_tenant and c.channel = p_channel and c.thread_id = p_thread;
  if v_owner <> v_contact then
    raise exception 'the thread belongs to another contact' using errcode = 'BS409';
  end if;
  insert into bastion.inbox_messages as m (conversation_id, tenant_id, author, body, external_id)
  values (v_conversation, p_tenant, 'contact', p_body, p_external_id)
  on conflict on constraint inbox_messages_external do nothing
  returning m.id, m.seq into v_message, v_seq;
  if v_message is null then
    select m.id, m.seq into v_message, v_seq from bastion.inbox_messages m
     where m.conversation_id = v_conversation and m.external_id = p_external_id;
    return query select v_conversation, v_contact, v_message, v_seq, v_mode, true;
    return;
  end if;
  return query select v_conversation, v_contact, v_message, v_seq, v_mode, false;
end
$$;

-- A new conversation on the web widget for a contact the application knows by `p_contact`.
create function bastion.inbox_open_widget_conversation(p_tenant text, p_contact text, p_contact_name text)
  returns table (conversation_id uuid, contact_id uuid)
  language plpgsql
  security definer
  set search_path = ''
  as $$
#variable_conflict use_column
declare
  v_contact uuid;
  v_conversation uuid;
begin
  perform bastion.inbox_require_runtime();
  insert into bastion.inbox_contacts as k (tenant_id, channel, external_id, display_name)
  values (p_tenant, 'widget', p_contact, p_contact_name)
  on conflict (tenant_id, channel, external_id)
    do update set display_name = coalesce(excluded.display_name, k.display_name)
  returning k.id into v_contact;
  insert into bastion.inbox_conversations (tenant_id, contact_id, channel, thread_id)
  values (p_tenant, v_contact, 'widget', gen_random_uuid()::text)
  returning id into v_conversation;
  return query select v_conversation, v_contact;
end
$$;

-- The bot's reply to one contact message of the caller's conversation (the server acting as that
-- contact). 'posted' once; 'duplicate' when it was posted before (a retried job); 'dropped' when the
-- conversation is with a human, or changed mode after the message, unless this job's own agent asked
-- for the human.
create function bastion.inbox_post_bot_reply(p_reply_to uuid, p_body text, p_job text) returns text
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_conversation uuid := bastion.inbox_contact_claim('conversation_id')::uuid;
  v_tenant text := bastion.inbox_contact_claim('tenant_id');
  v_seq bigint;
  v_mode text;
  v_handoff_seq bigint;
  v_handoff_job text;
  v_id uuid;
begin
  perform bastion.inbox_require_runtime();
  select c.bot_mode, c.handoff_seq, c.handoff_job into v_mode, v_handoff_seq, v_handoff_job
    from bastion.inbox_conversations c
   where c.id = v_conversation and c.tenant_id = v_tenant
     and c.contact_id = bastion.inbox_contact_claim('contact_id')::uuid
   for update;
  select m.seq into v_seq from bastion.inbox_messages m
   where m.id = p_reply_to and m.conversation_id = v_conversation and m.author = 'contact';
  if v_mode is null or v_seq is null then
    raise exception 'no such message in the conversation' using errcode = 'BS404';
  end if;
  if exists (select 1 from bastion.inbox_messages m where m.reply_to = p_reply_to) then
    return 'duplicate';
  end if;
  if v_handoff_job is distinct from p_job and (v_mode <> 'bot' or v_seq <= v_handoff_seq) then
    return 'dropped';
  end if;
  insert into bastion.inbox_messages (conversation_id, tenant_id, author, body, reply_to)
  values (v_conversation, v_tenant, 'bot', p_body, p_reply_to)
  on conflict on constraint inbox_messages_one_reply do nothing
  returning id into v_id;
  return case when v_id is null then 'duplicate' else 'posted' end;
end
$$;

-- The agent, acting for the contact, asks for a human: the conversation leaves bot mode.
create function bastion.inbox_request_handoff(p_reason text, p_job text) returns void
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  perform bastion.inbox_require_runtime();
  update bastion.inbox_conversations c
     set bot_mode = 'human', handoff_reason = left(p_reason, 500), handoff_job = p_job
   where c.id = bastion.inbox_contact_claim('conversation_id')::uuid
     and c.tenant_id = bastion.inbox_contact_claim('tenant_id')
     and c.contact_id = bastion.inbox_contact_claim('contact_id')::uuid
     and c.bot_mode = 'bot';
end
$$;

-- What the bot and staff wrote in a channel's conversations after position `p_after`, oldest first, for
-- the channel's adapter to deliver: the thread and contact it goes to, and the position to continue from.
create function bastion.inbox_outbound(p_tenant text, p_channel text, p_after bigint, p_limit integer)
  returns table (seq bigint, message_id uuid, thread_id text, contact text, author text, body text)
  language plpgsql stable
  security definer
  set search_path = ''
  as $$
begin
  perform bastion.inbox_require_runtime();
  return query
    select m.seq, m.id, c.thread_id, k.external_id, m.author, m.body
      from bastion.inbox_messages m
      join bastion.inbox_conversations c on c.id = m.conversation_id
      join bastion.inbox_contacts k on k.id = c.contact_id
     where m.tenant_id = p_tenant and c.channel = p_channel and m.author <> 'contact' and m.seq > p_after
     order by m.seq
     limit p_limit;
end
$$;

revoke execute on function
  bastion.inbox_outbound(text, text, bigint, integer),
  bastion.inbox_record_inbound(text, text, text, text, text, text, text),
  bastion.inbox_open_widget_conversation(text, text, text),
  bastion.inbox_post_bot_reply(uuid, text, text),
  bastion.inbox_request_handoff(text, text),
  bastion.inbox_message_added(),
  bastion.inbox_require_runtime()
  from public;
grant execute on function
  bastion.inbox_outbound(text, text, bigint, integer),
  bastion.inbox_record_inbound(text, text, text, text, text, text, text),
  bastion.inbox_open_widget_conversation(text, text, text)
  to bastion_runtime;
grant execute on function
  bastion.inbox_post_bot_reply(uuid, text, text),
  bastion.inbox_request_handoff(text, text)
  to bastion_contact;
