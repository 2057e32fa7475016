-- Pending OAuth authorizations of MCP connections (`bastion.stores.oauth_states`): one row per sign-in a
-- user started and has not finished. The row is found by the SHA-256 of the `state` sent to the
-- authorization server (the state itself is never stored), belongs to the user who started it, in their
-- tenant, and is deleted when its callback arrives (single use) or once it expired. What the callback
-- needs to finish (the PKCE verifier, the client and the server's metadata) is encrypted by the
-- application under the credentials key and bound to the row's state, owner, tenant and connection.
--
-- Row-level security as for `bastion.credentials`: only the owner, in their tenant, and only from the
-- application server (the session's login role is a member of `bastion_runtime`), so a callback for
-- another user's state finds nothing.

create table bastion.mcp_oauth_authorizations (
  state_hash bytea primary key check (octet_length(state_hash) = 32),
  owner_id uuid not null default auth.uid(),
  tenant_id text default bastion.tenant_id(),
  connection text not null check (char_length(connection) between 1 and 200),
  conversation_id text check (char_length(conversation_id) between 1 and 200),
  tool_call_id text check (char_length(tool_call_id) between 1 and 200),
  key_id text not null check (char_length(key_id) between 1 and 64),
  nonce bytea not null check (octet_length(nonce) = 12),
  ciphertext bytea not null check (octet_length(ciphertext) between 17 and 65552),
  created_at timestamptz not null default now(),
  expires_at timestamptz not null
);

create index mcp_oauth_authorizations_owner on bastion.mcp_oauth_authorizations (owner_id, expires_at);

-- Owner and tenant are not writable columns: their defaults inject the caller's identity.
revoke all on bastion.mcp_oauth_authorizations from public, anon, authenticated;
grant select, delete on bastion.mcp_oauth_authorizations to authenticated;
grant insert (
  state_hash, connection, conversation_id, tool_call_id, key_id, nonce, ciphertext, expires_at
) on bastion.mcp_oauth_authorizations to authenticated;
grant all on bastion.mcp_oauth_authorizations to service_role;

alter table bastion.mcp_oauth_authorizations enable row level security;
alter table bastion.mcp_oauth_authorizations force row level security;

create policy mcp_oauth_authorizations_owner on bastion.mcp_oauth_authorizations for all to authenticated
  using (
    owner_id = (select auth.uid())
    and tenant_id is not distinct from (select bastion.tenant_id())
    and (select pg_has_role(session_user, 'bastion_runtime', 'MEMBER'))
  )
  with check (
    owner_id = (select auth.uid())
    and tenant_id is not distinct from (select bastion.tenant_id())
    and (select pg_has_role(session_user, 'bastion_runtime', 'MEMBER'))
  );
