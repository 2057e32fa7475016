-- A new conversation's first turn is claimed in the transaction that creates the conversation.
--
-- `claim_new_turn` claims the turn of a conversation created earlier in the same transaction (its row's
-- `xmin` is this transaction's id), as `claim_turn` (0006) claims it at the conversation's revision,
-- with no stored messages to reconcile. So the conversation's insert and the claim go out in one
-- pipelined transaction, one round trip, where creating it, loading its (empty) tail and claiming
-- were three. For a conversation this transaction did not create (its id was taken: by the caller's
-- own earlier request, or by anyone else's conversation, which the insert's `on conflict do nothing`
-- leaves alone) it answers `{"outcome": "taken"}` and writes nothing: the caller then claims the usual
-- way, which answers exactly as before (a conversation of someone else's is not found).
--
-- Expand only: no earlier function changes.

create function bastion.claim_new_turn(
  p_conversation uuid,
  p_run uuid,
  p_request_id text,
  p_worker bigint,
  p_lease_seconds double precision,
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
begin
  select * into v_conversation from bastion.conversations c
   where c.id = p_conversation
     and c.owner_id = v_user
     and c.xmin = pg_current_xact_id_if_assigned()::xid;
  if not found then
    return jsonb_build_object('outcome', 'taken');
  end if;
  return bastion.claim_turn(
    p_conversation, p_run, p_request_id, v_conversation.revision,
    to_jsonb(v_conversation.created_at) #>> '{}', '{}', p_worker, p_lease_seconds, null, p_writes, p_events
  );
end
$$;

revoke execute on function
  bastion.claim_new_turn(uuid, uuid, text, bigint, double precision, jsonb, jsonb)
  from public;
grant execute on function
  bastion.claim_new_turn(uuid, uuid, text, bigint, double precision, jsonb, jsonb)
  to authenticated;
