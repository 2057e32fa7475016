-- A channel's message id is the channel's, not a thread's: delivered again on another thread (an
-- adapter that retries with a new thread id, or a forged one), it stores nothing new and answers with
-- the message first stored, as a redelivery on the same thread always did. Before, idempotency was per
-- conversation (`inbox_messages_external`), so the same id on another thread was stored, and answered,
-- again.
--
-- `inbox_inbound_ids` claims each (tenant, channel, message id) once, before the contact, the thread's
-- conversation or the message are written, so a duplicate writes none of them; two deliveries racing
-- with one id wait on the claim, and the second finds the first's message. Widget messages (a client's
-- own ids, per conversation) keep their per-conversation rule. The claims of channel messages already
-- stored are filled in from them, the earliest message of each id first.

create table bastion.inbox_inbound_ids (
  tenant_id text not null,
  channel text not null check (char_length(channel) between 1 and 64),
  external_id text not null check (char_length(external_id) between 1 and 200),
  message_id uuid not null
    references bastion.inbox_messages (id) on delete cascade deferrable initially deferred,
  primary key (tenant_id, channel, external_id)
);
create index inbox_inbound_ids_message on bastion.inbox_inbound_ids (message_id);

revoke all on bastion.inbox_inbound_ids from public, anon, authenticated;
grant all on bastion.inbox_inbound_ids to service_role;
alter table bastion.inbox_inbound_ids enable row level security;
alter table bastion.inbox_inbound_ids force row level security;

insert into bastion.inbox_inbound_ids (tenant_id, channel, external_id, message_id)
select distinct on (c.tenant_id, c.channel, m.external_id) c.tenant_id, c.channel, m.external_id, m.id
  from bastion.inbox_messages m
  join bastion.inbox_conversations c on c.id = m.conversation_id
 where m.author = 'contact' and m.external_id is not null and c.channel <> 'widget'
 order by c.tenant_id, c.channel, m.external_id, m.seq;

create or replace function bastion.inbox_record_inbound(
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
  v_message uuid := gen_random_uuid();
  v_claimed boolean;
  v_seq bigint;
begin
  perform bastion.inbox_require_runtime();
  insert into bastion.inbox_inbound_ids (tenant_id, channel, external_id, message_id)
  values (p_tenant, p_channel, p_external_id, v_message)
  on conflict (tenant_id, channel, external_id) do nothing;
  get diagnostics v_claimed = row_count;
  if not v_claimed then
    return query
      select m.conversation_id, c.contact_id, m.id, m.seq, c.bot_mode, true
        from bastion.inbox_inbound_ids i
        join bastion.inbox_messages m on m.id = i.message_id
        join bastion.inbox_conversations c on c.id = m.conversation_id
       where i.tenant_id = p_tenant and i.channel = p_channel and i.external_id = p_external_id;
    return;
  end if;
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
  insert into bastion.inbox_messages as m (id, conversation_id, tenant_id, author, body, external_id)
  values (v_message, v_conversation, p_tenant, 'contact', p_body, p_external_id)
  on conflict on constraint inbox_messages_external do nothing
  returning m.seq into v_seq;
  if v_seq is null then
    -- Stored on this thread before any claim existed: the claim names that message.
    select m.id, m.seq into v_message, v_seq from bastion.inbox_messages m
     where m.conversation_id = v_conversation and m.external_id = p_external_id;
    update bastion.inbox_inbound_ids i set message_id = v_message
     where i.tenant_id = p_tenant and i.channel = p_channel and i.external_id = p_external_id;
    return query select v_conversation, v_contact, v_message, v_seq, v_mode, true;
    return;
  end if;
  return query select v_conversation, v_contact, v_message, v_seq, v_mode, false;
end
$$;
