-- Credentials for connections (`bastion.stores.credentials`): secrets the application encrypts with
-- AES-256-GCM before they reach the database (the key never does), bound by associated data to their
-- provider, name, scope, owner and tenant, so a row copied anywhere else does not decrypt.
--
-- A user's credential is reachable only by its owner, in their tenant, and only from the application
-- server: row-level security also requires the session's login role to be a member of
-- `bastion_runtime`, so a user with a valid token connecting directly (a Data API) sees nothing, not
-- even their own ciphertext. An app credential is not reachable by the `authenticated` role at all:
-- no policy covers it, and it is read and written only through the SECURITY DEFINER functions below,
-- which only `bastion_runtime` may execute (the application server switches to it with SET LOCAL ROLE
-- for that one transaction) and which check the login role again. The application keeps connecting
-- as one role without BYPASSRLS; no second, privileged connection is needed.
--
-- Where Supabase Vault exists, the `vault_*` functions keep credentials in it instead. Vault has no
-- owner of its own, so the database derives each secret's name from the caller's verified identity
-- (`auth.uid()` and tenant): the application cannot even name another user's secret. They reference
-- `vault` only when called, so this migration also runs where Vault is absent.
--
-- SQLSTATE BS403: the caller may not do this.

grant usage on schema bastion to bastion_runtime;

create table bastion.credentials (
  id bigint generated always as identity primary key,
  scope text not null check (scope in ('app', 'user')),
  provider text not null check (char_length(provider) between 1 and 200),
  secret text not null check (char_length(secret) between 1 and 200),
  owner_id uuid default auth.uid(),
  tenant_id text default bastion.tenant_id(),
  key_id text not null check (char_length(key_id) between 1 and 64),
  nonce bytea not null check (octet_length(nonce) = 12),
  ciphertext bytea not null check (octet_length(ciphertext) between 17 and 65552),
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now(),
  constraint credentials_owner check ((scope = 'user') = (owner_id is not null)),
  constraint credentials_app_has_no_tenant check (scope = 'user' or tenant_id is null),
  constraint credentials_identity unique nulls not distinct (scope, provider, secret, owner_id, tenant_id)
);

-- Owner and tenant are not writable columns: their defaults inject the caller's identity.
revoke all on bastion.credentials from public, anon, authenticated;
grant select, delete on bastion.credentials to authenticated;
grant insert (scope, provider, secret, key_id, nonce, ciphertext) on bastion.credentials to authenticated;
grant update (key_id, nonce, ciphertext, updated_at) on bastion.credentials to authenticated;
grant all on bastion.credentials to service_role;

alter table bastion.credentials enable row level security;
alter table bastion.credentials force row level security;

create policy credentials_owner on bastion.credentials for all to authenticated
  using (
    scope = 'user'
    and owner_id = (select auth.uid())
    and tenant_id is not distinct from (select bastion.tenant_id())
    and (select pg_has_role(session_user, 'bastion_runtime', 'MEMBER'))
  )
  with check (
    scope = 'user'
    and owner_id = (select auth.uid())
    and tenant_id is not distinct from (select bastion.tenant_id())
    and (select pg_has_role(session_user, 'bastion_runtime', 'MEMBER'))
  );

create function bastion.require_runtime_session() returns void
  language plpgsql stable
  set search_path = ''
  as $$
begin
  if not pg_has_role(session_user, 'bastion_runtime', 'MEMBER') then
    raise exception 'only the application server may use this credential' using errcode = 'BS403';
  end if;
end
$$;

-- App credentials: one per (provider, secret), shared by every turn, without owner or tenant.

create function bastion.get_app_credential(p_provider text, p_secret text)
  returns table (key_id text, nonce bytea, ciphertext bytea)
  language plpgsql stable
  security definer
  set search_path = ''
  as $$
begin
  perform bastion.require_runtime_session();
  return query
    select c.key_id, c.nonce, c.ciphertext from bastion.credentials c
     where c.scope = 'app' and c.provider = p_provider and c.secret = p_secret
       and c.owner_id is null and c.tenant_id is null;
end
$$;

create function bastion.put_app_credential(
  p_provider text, p_secret text, p_key_id text, p_nonce bytea, p_ciphertext bytea
) returns void
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  perform bastion.require_runtime_session();
  insert into bastion.credentials (scope, provider, secret, owner_id, tenant_id, key_id, nonce, ciphertext)
  values ('app', p_provider, p_secret, null, null, p_key_id, p_nonce, p_ciphertext)
  on conflict on constraint credentials_identity do update
    set key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext,
        updated_at = now();
end
$$;

create function bastion.delete_app_credential(p_provider text, p_secret text) returns void
  language plpgsql
  security definer
  set search_path = ''
  as $$
begin
  perform bastion.require_runtime_session();
  delete from bastion.credentials c
   where c.scope = 'app' and c.provider = p_provider and c.secret = p_secret
     and c.owner_id is null and c.tenant_id is null;
end
$$;

-- Supabase Vault. A secret's name is a JSON array the caller cannot choose the owner part of:
-- `["bastion", scope, provider, secret, owner, tenant]`, owner and tenant null for app credentials.

create function bastion.vault_credential_name(p_scope text, p_provider text, p_secret text) returns text
  language plpgsql stable
  set search_path = ''
  as $$
declare
  v_user uuid := auth.uid();
begin
  perform bastion.require_runtime_session();
  if p_scope is null or p_scope not in ('app', 'user') then
    raise exception 'a credential scope is app or user' using errcode = 'BS403';
  end if;
  if p_scope = 'user' and v_user is null then
    raise exception 'a user credential needs the signed-in user' using errcode = 'BS403';
  end if;
  if char_length(coalesce(p_provider, '')) not between 1 and 200
     or char_length(coalesce(p_secret, '')) not between 1 and 200 then
    raise exception 'invalid credential name' using errcode = 'BS403';
  end if;
  return jsonb_build_array(
    'bastion', p_scope, p_provider, p_secret,
    case when p_scope = 'user' then v_user::text end,
    case when p_scope = 'user' then bastion.tenant_id() end
  )::text;
end
$$;

create function bastion.vault_get_credential(p_scope text, p_provider text, p_secret text) returns text
  language plpgsql stable
  security definer
  set search_path = ''
  as $$
declare
  v_name text := bastion.vault_credential_name(p_scope, p_provider, p_secret);
  v_value text;
begin
  select s.decrypted_secret into v_value from vault.decrypted_secrets s where s.name = v_name;
  return v_value;
end
$$;

create function bastion.vault_put_credential(p_scope text, p_provider text, p_secret text, p_value text)
  returns void
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_name text := bastion.vault_credential_name(p_scope, p_provider, p_secret);
  v_id uuid;
begin
  -- Two first writes of one name at once would otherwise both create it.
  perform pg_advisory_xact_lock(hashtextextended(v_name, 0));
  select s.id into v_id from vault.secrets s where s.name = v_name;
  if v_id is null then
    perform vault.create_secret(p_value, v_name, 'bastion credential');
  else
    perform vault.update_secret(v_id, p_value);
  end if;
end
$$;

create function bastion.vault_delete_credential(p_scope text, p_provider text, p_secret text) returns void
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_name text := bastion.vault_credential_name(p_scope, p_provider, p_secret);
begin
  delete from vault.secrets s where s.name = v_name;
end
$$;

-- Functions are executable by PUBLIC unless revoked.
revoke execute on function
  bastion.require_runtime_session(),
  bastion.get_app_credential(text, text),
  bastion.put_app_credential(text, text, text, bytea, bytea),
  bastion.delete_app_credential(text, text),
  bastion.vault_credential_name(text, text, text),
  bastion.vault_get_credential(text, text, text),
  bastion.vault_put_credential(text, text, text, text),
  bastion.vault_delete_credential(text, text, text)
  from public;
grant execute on function
  bastion.get_app_credential(text, text),
  bastion.put_app_credential(text, text, text, bytea, bytea),
  bastion.delete_app_credential(text, text),
  bastion.vault_get_credential(text, text, text),
  bastion.vault_put_credential(text, text, text, text),
  bastion.vault_delete_credential(text, text, text)
  to bastion_runtime;
