-- Conversations as the application's own entities: the agent a conversation belongs to and the
-- application's state, JSON text checked with `json_valid` (the jsonb column of the Postgres store).
-- Existing conversations keep their owner and tenant and have no agent name or state until the
-- application sets them.

alter table bastion_conversations
  add column agent_name text check (agent_name is null or length(agent_name) between 1 and 200);
alter table bastion_conversations
  add column state text check (state is null or json_valid(state));
create index bastion_conversations_owner_agent_recent
  on bastion_conversations (owner_id, tenant_id, agent_name, updated_at desc);
