-- A later turn's claim in one round trip. The application keeps, per process, the stored tail the
-- previous claim or finish of a conversation left, with the revision it left; when the browser's
-- messages fall inside that tail it reconciles against it and sends its writes straight away, and
-- `claim_turn` checks under the conversation's row lock that the tail is still current. When it is
-- not (another process took a turn), nothing changes and the application loads afresh with
-- `load_turn`, so correctness never depends on what the application remembers.
--
-- `close_turn` is `finish_turn` reporting what the application needs to remember the result: the
-- new revision, the last position and the saved response as stored.
--
-- Same conventions and error codes as 0003: SECURITY DEFINER, fixed empty `search_path`, the
-- caller's `auth.uid()` and tenant must own the conversation and the login role must be a member of
-- `bastion_runtime`.

-- Claim a turn if the conversation is exactly as the caller last saw it: lock it without waiting,
-- then report `stale` (another incarnation of the id — deleted and created again — the revision
-- moved, or a message named in `p_uncached_ids` is stored after all), `busy` (a live run holds it) or
-- `repeated_request`, changing nothing; otherwise do exactly what `start_turn` does. A null
-- `p_incarnation` skips that check (the caller loaded the tail under this same lock). Returns
-- `{outcome, revision, last_seq, incarnation, rows}`, `rows` being the written positions onwards as
-- stored (`[[seq, message], ...]`) and `incarnation` the conversation's creation time as text.
create function bastion.claim_turn(
  p_conversation uuid,
  p_run uuid,
  p_request_id text,
  p_revision bigint,
  p_incarnation text,
  p_uncached_ids text[],
  p_lease_seconds double precision,
  p_truncate_after bigint,
  p_writes jsonb,
  p_events jsonb
) returns jsonb
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_user uuid := bastion.require_runtime();
  v_conversation bastion.conversations;
  v_revision bigint;
  v_from bigint;
begin
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.tenant_id is not distinct from bastion.tenant_id()
   for update nowait;
  if not found then
    raise exception 'conversation not found' using errcode = 'BS404';
  end if;
  if v_conversation.revision <> p_revision
     or (p_incarnation is not null and (to_jsonb(v_conversation.created_at) #>> '{}') <> p_incarnation)
     or exists (
    select 1 from bastion.messages m
     where m.conversation_id = p_conversation and m.id = any (coalesce(p_uncached_ids, '{}'))
  ) then
    return jsonb_build_object('outcome', 'stale');
  end if;
  if exists (
    select 1 from bastion.runs r
     where r.id = v_conversation.active_run_id and r.status = 'running' and r.lease_expires_at > now()
  ) then
    return jsonb_build_object('outcome', 'busy');
  end if;
  if exists (
    select 1 from bastion.runs r where r.conversation_id = p_conversation and r.request_id = p_request_id
  ) then
    return jsonb_build_object('outcome', 'repeated_request');
  end if;

  v_revision := bastion.start_turn(
    p_conversation, p_run, p_request_id, p_revision, p_lease_seconds, p_truncate_after, p_writes, p_events
  );
  select min((w.value ->> 'seq')::bigint) into v_from
    from jsonb_array_elements(coalesce(p_writes, '[]'::jsonb)) w;
  return jsonb_build_object(
    'outcome', 'claimed',
    'revision', v_revision,
    'incarnation', to_jsonb(v_conversation.created_at) #>> '{}',
    'last_seq', (select coalesce(max(m.seq), 0) from bastion.messages m where m.conversation_id = p_conversation),
    'rows', coalesce(
      (select jsonb_agg(jsonb_build_array(m.seq, m.message) order by m.seq)
         from bastion.messages m where m.conversation_id = p_conversation and m.seq >= v_from),
      '[]'::jsonb
    )
  );
end
$$;

-- `finish_turn`, then, when it saved the outcome, the conversation's revision, its last position
-- and the saved response as stored: `{saved, revision, last_seq, row}` (`row` null without one).
create function bastion.close_turn(
  p_conversation uuid,
  p_run uuid,
  p_status text,
  p_message jsonb,
  p_tool_results jsonb,
  p_events jsonb
) returns jsonb
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_last bastion.messages;
begin
  if not bastion.finish_turn(p_conversation, p_run, p_status, p_message, p_tool_results, p_events) then
    return jsonb_build_object('saved', false);
  end if;
  select * into v_last from bastion.messages m
   where m.conversation_id = p_conversation order by m.seq desc limit 1;
  return jsonb_build_object(
    'saved', true,
    'revision', (select c.revision from bastion.conversations c where c.id = p_conversation),
    'last_seq', coalesce(v_last.seq, 0),
    'row', case when p_message is null then null else jsonb_build_array(v_last.seq, v_last.message) end
  );
end
$$;

revoke execute on function
  bastion.claim_turn(uuid, uuid, text, bigint, text, text[], double precision, bigint, jsonb, jsonb),
  bastion.close_turn(uuid, uuid, text, jsonb, jsonb, jsonb)
  from public;
grant execute on function
  bastion.claim_turn(uuid, uuid, text, bigint, text, text[], double precision, bigint, jsonb, jsonb),
  bastion.close_turn(uuid, uuid, text, jsonb, jsonb, jsonb)
  to authenticated;
