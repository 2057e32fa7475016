"""Credentials in Postgres: encrypted at rest, owner-scoped under row-level security, app credentials
reachable only by the application server, and Supabase Vault through bastion's database functions.

Supabase Vault cannot be installed here, so the Vault tests run against a stand-in `vault` schema
with Vault's names (`vault.secrets`, `vault.create_secret`, `vault.update_secret`,
`vault.decrypted_secrets`); it encodes rather than encrypts. It checks bastion's side, not Vault's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from bastion.credentials import (
    ConnectionAuthorizationFailedError,
    ConnectionAuthorizationRequiredError,
    CredentialForbiddenError,
    CredentialInvalidError,
    CredentialProvider,
    CredentialRef,
    CredentialStorageError,
    credential_auth,
)
from bastion.mcp import McpConnectionDefinition, McpConnectionError, McpTransport, create_mcp_connections
from bastion.stores import StoreIdentity, apply_migrations
from bastion.stores.credentials import CredentialKeyring, PostgresCredentialProvider, VaultCredentialProvider
from bastion.tools import ToolCall
from tests.conftest import MigratedDatabase
from tests.mcp_servers import Behavior, RunningServer, serve_mcp
from tests.pg import PostgresCluster

USER_REF = CredentialRef(provider="postgres", secret="linear", scope="user")
APP_REF = CredentialRef(provider="postgres", secret="linear", scope="app")
VAULT_USER_REF = CredentialRef(provider="vault", secret="linear", scope="user")
VAULT_APP_REF = CredentialRef(provider="vault", secret="linear", scope="app")
SECRET_VALUE = "lin_secret_5f3a9c"
MCP_TOKEN = "mcp-token-from-postgres-41d8"
COPY_COLUMNS = "scope, provider, secret, owner_id, tenant_id, key_id, nonce, ciphertext"

STAND_IN_VAULT = """
create schema vault;
create table vault.secrets (
  id uuid primary key default gen_random_uuid(),
  name text,
  description text not null default '',
  secret text not null,
  key_id uuid,
  nonce bytea,
  created_at timestamptz not null default now(),
  updated_at timestamptz not null default now()
);
create unique index secrets_name_idx on vault.secrets (name) where name is not null;
create function vault.create_secret(
  new_secret text, new_name text default null, new_description text default '', new_key_id uuid default null
) returns uuid language sql as $$
  insert into vault.secrets (secret, name, description, key_id)
  values (encode(convert_to(new_secret, 'UTF8'), 'base64'), new_name, new_description, new_key_id)
  returning id
$$;
create function vault.update_secret(
  secret_id uuid, new_secret text default null, new_name text default null,
  new_description text default null, new_key_id uuid default null
) returns void language sql as $$
  update vault.secrets set
    secret = coalesce(encode(convert_to(new_secret, 'UTF8'), 'base64'), secret),
    name = coalesce(new_name, name),
    description = coalesce(new_description, description),
    key_id = coalesce(new_key_id, key_id),
    updated_at = now()
  where id = secret_id
$$;
create view vault.decrypted_secrets as
  select id, name, description, secret, convert_from(decode(secret, 'base64'), 'UTF8') as decrypted_secret,
         key_id, nonce, created_at, updated_at
  from vault.secrets;
revoke all on schema vault from public;
revoke execute on all functions in schema vault from public;
"""


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def keyring(value: str) -> CredentialKeyring:
    return CredentialKeyring.from_environment(environ={"BASTION_CREDENTIALS_KEY": value})


def new_user() -> str:
    return str(uuid.uuid4())


async def open_pool(dsn: str) -> AsyncConnectionPool[Any]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    return pool


@pytest.fixture
async def pool(migrated_database: MigratedDatabase) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """Connected as the application role: no BYPASSRLS, member of authenticated and bastion_runtime."""
    pool = await open_pool(migrated_database.app_dsn)
    yield pool
    await pool.close()


@pytest.fixture
def keys() -> CredentialKeyring:
    return keyring(f"k1:{new_key()}")


@pytest.fixture
def provider(pool: AsyncConnectionPool[Any], keys: CredentialKeyring) -> PostgresCredentialProvider:
    return PostgresCredentialProvider(pool, keys=keys)


@pytest.fixture
async def admin(migrated_database: MigratedDatabase) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(migrated_database.admin_dsn, autocommit=True) as conn:
        yield conn


async def as_user(dsn: str, user_id: str, sql: str, params: tuple[Any, ...] = ()) -> tuple[int, list[Any]]:
    """Run `sql` in one transaction as `user_id` under the authenticated role: (row count, rows)."""
    claims = StoreIdentity(user_id=user_id).database_claims()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute(
            "select set_config('role', 'authenticated', true), set_config('request.jwt.claims', %s, true)",
            (claims,),
        )
        cursor = await conn.execute(sql, params)
        rows = await cursor.fetchall() if cursor.description else []
        return cursor.rowcount, rows


async def stored_rows(admin: psycopg.AsyncConnection[Any], owner_id: str | None) -> list[tuple[Any, ...]]:
    cursor = await admin.execute(
        "select c::text, nonce, ciphertext, key_id from bastion.credentials c "
        "where provider = 'postgres' and secret = 'linear' and owner_id is not distinct from %s",
        (owner_id,),
    )
    return await cursor.fetchall()


# Round trips


async def test_a_user_credential_round_trips(provider: PostgresCredentialProvider) -> None:
    alice = new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    assert await provider.get(USER_REF, owner_id=alice) == SECRET_VALUE


async def test_an_app_credential_round_trips(provider: PostgresCredentialProvider) -> None:
    ref = CredentialRef(provider="postgres", secret=f"app-{uuid.uuid4()}", scope="app")
    await provider.put(ref, SECRET_VALUE)
    assert await provider.get(ref) == SECRET_VALUE


async def test_the_provider_satisfies_the_credential_provider_protocol(
    provider: PostgresCredentialProvider,
) -> None:
    assert isinstance(provider, CredentialProvider)
    assert provider.scopes == frozenset({"app", "user"})


async def test_a_missing_credential_is_none(provider: PostgresCredentialProvider) -> None:
    missing_app = CredentialRef(provider="postgres", secret=f"none-{uuid.uuid4()}", scope="app")
    assert await provider.get(USER_REF, owner_id=new_user()) is None
    assert await provider.get(missing_app) is None


async def test_putting_again_replaces_the_value(provider: PostgresCredentialProvider) -> None:
    alice = new_user()
    await provider.put(USER_REF, "first", owner_id=alice)
    await provider.put(USER_REF, "second", owner_id=alice)
    assert await provider.get(USER_REF, owner_id=alice) == "second"


async def test_delete_forgets_the_credential_and_a_missing_one_is_no_error(
    provider: PostgresCredentialProvider,
) -> None:
    alice = new_user()
    ref = CredentialRef(provider="postgres", secret=f"app-{uuid.uuid4()}", scope="app")
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    await provider.put(ref, SECRET_VALUE)
    await provider.delete(USER_REF, owner_id=alice)
    await provider.delete(ref)
    await provider.delete(ref)
    assert await provider.get(USER_REF, owner_id=alice) is None
    assert await provider.get(ref) is None


async def test_user_and_app_credentials_of_the_same_name_are_separate(
    provider: PostgresCredentialProvider,
) -> None:
    alice = new_user()
    secret = f"shared-{uuid.uuid4()}"
    user_ref = CredentialRef(provider="postgres", secret=secret, scope="user")
    app_ref = CredentialRef(provider="postgres", secret=secret, scope="app")
    await provider.put(user_ref, "for-alice", owner_id=alice)
    await provider.put(app_ref, "for-the-app")
    assert await provider.get(user_ref, owner_id=alice) == "for-alice"
    assert await provider.get(app_ref) == "for-the-app"


# Encryption at rest


async def test_the_stored_row_never_holds_the_plaintext(
    provider: PostgresCredentialProvider, admin: psycopg.AsyncConnection[Any]
) -> None:
    alice = new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    [(row_text, nonce, ciphertext, key_id)] = await stored_rows(admin, alice)
    assert key_id == "k1"
    assert SECRET_VALUE not in row_text
    assert SECRET_VALUE.encode() not in bytes(ciphertext)
    assert SECRET_VALUE.encode().hex() not in row_text
    assert len(bytes(nonce)) == 12


async def test_every_write_uses_a_fresh_nonce(
    provider: PostgresCredentialProvider, admin: psycopg.AsyncConnection[Any]
) -> None:
    alice = new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    [(_, first_nonce, first, _)] = await stored_rows(admin, alice)
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    [(_, second_nonce, second, _)] = await stored_rows(admin, alice)
    assert bytes(first_nonce) != bytes(second_nonce)
    assert bytes(first) != bytes(second)


async def test_a_wrong_key_is_an_invalid_credential(
    pool: AsyncConnectionPool[Any], provider: PostgresCredentialProvider
) -> None:
    alice = new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    other = PostgresCredentialProvider(pool, keys=keyring(f"k1:{new_key()}"))
    with pytest.raises(CredentialInvalidError):
        await other.get(USER_REF, owner_id=alice)


async def test_a_credential_under_an_unknown_key_id_is_invalid(
    pool: AsyncConnectionPool[Any], provider: PostgresCredentialProvider
) -> None:
    alice = new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    other = PostgresCredentialProvider(pool, keys=keyring(f"k2:{new_key()}"))
    with pytest.raises(CredentialInvalidError):
        await other.get(USER_REF, owner_id=alice)


async def test_a_row_copied_to_another_owner_does_not_decrypt(
    provider: PostgresCredentialProvider, admin: psycopg.AsyncConnection[Any]
) -> None:
    alice, mallory = new_user(), new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    await admin.execute(
        f"insert into bastion.credentials ({COPY_COLUMNS}) "
        "select scope, provider, secret, %s, tenant_id, key_id, nonce, ciphertext from bastion.credentials "
        "where provider = 'postgres' and secret = 'linear' and owner_id = %s",
        (mallory, alice),
    )
    with pytest.raises(CredentialInvalidError):
        await provider.get(USER_REF, owner_id=mallory)


async def test_a_user_row_copied_into_an_app_credential_does_not_decrypt(
    provider: PostgresCredentialProvider, admin: psycopg.AsyncConnection[Any]
) -> None:
    alice = new_user()
    secret = f"copied-{uuid.uuid4()}"
    await provider.put(CredentialRef(provider="postgres", secret=secret, scope="user"), "x", owner_id=alice)
    await admin.execute(
        f"insert into bastion.credentials ({COPY_COLUMNS}) "
        "select 'app', provider, secret, null, null, key_id, nonce, ciphertext from bastion.credentials "
        "where secret = %s and owner_id = %s",
        (secret, alice),
    )
    with pytest.raises(CredentialInvalidError):
        await provider.get(CredentialRef(provider="postgres", secret=secret, scope="app"))


async def test_rotated_keys_still_decrypt_and_new_writes_use_the_current_key(
    pool: AsyncConnectionPool[Any], admin: psycopg.AsyncConnection[Any]
) -> None:
    alice = new_user()
    old_key = new_key()
    before = PostgresCredentialProvider(pool, keys=keyring(f"k1:{old_key}"))
    await before.put(USER_REF, SECRET_VALUE, owner_id=alice)
    after = PostgresCredentialProvider(pool, keys=keyring(f"k2:{new_key()},k1:{old_key}"))
    assert await after.get(USER_REF, owner_id=alice) == SECRET_VALUE
    await after.put(USER_REF, "rotated", owner_id=alice)
    [(_, _, _, key_id)] = await stored_rows(admin, alice)
    assert key_id == "k2"
    assert await after.get(USER_REF, owner_id=alice) == "rotated"


# Owners, tenants and roles


async def test_another_user_gets_none_for_the_same_reference(provider: PostgresCredentialProvider) -> None:
    alice, bob = new_user(), new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    assert await provider.get(USER_REF, owner_id=bob) is None


async def test_another_users_put_and_delete_leave_the_owners_credential_alone(
    provider: PostgresCredentialProvider,
) -> None:
    alice, bob = new_user(), new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    await provider.put(USER_REF, "bobs-own", owner_id=bob)
    await provider.delete(USER_REF, owner_id=bob)
    assert await provider.get(USER_REF, owner_id=alice) == SECRET_VALUE


async def test_another_user_cannot_see_update_or_delete_the_row_in_sql(
    provider: PostgresCredentialProvider, migrated_database: MigratedDatabase
) -> None:
    alice, bob = new_user(), new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    dsn = migrated_database.app_dsn
    where = "where owner_id = %s"
    assert await as_user(dsn, bob, f"select id from bastion.credentials {where}", (alice,)) == (0, [])
    updated = await as_user(dsn, bob, f"update bastion.credentials set key_id = 'x' {where}", (alice,))
    deleted = await as_user(dsn, bob, f"delete from bastion.credentials {where}", (alice,))
    assert (updated[0], deleted[0]) == (0, 0)
    assert await provider.get(USER_REF, owner_id=alice) == SECRET_VALUE


async def test_a_user_cannot_write_a_row_owned_by_someone_else(migrated_database: MigratedDatabase) -> None:
    alice, bob = new_user(), new_user()
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_user(
            migrated_database.app_dsn,
            bob,
            "insert into bastion.credentials (scope, provider, secret, owner_id, key_id, nonce, ciphertext) "
            "values ('user', 'postgres', 'linear', %s, 'k1', %s, %s)",
            (alice, bytes(12), bytes(32)),
        )


async def test_a_user_cannot_write_an_app_credential_row(migrated_database: MigratedDatabase) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_user(
            migrated_database.app_dsn,
            new_user(),
            "insert into bastion.credentials (scope, provider, secret, key_id, nonce, ciphertext) "
            "values ('app', 'postgres', 'linear', 'k1', %s, %s)",
            (bytes(12), bytes(32)),
        )


async def test_app_credentials_are_invisible_to_the_authenticated_role(
    provider: PostgresCredentialProvider, migrated_database: MigratedDatabase
) -> None:
    ref = CredentialRef(provider="postgres", secret=f"app-{uuid.uuid4()}", scope="app")
    await provider.put(ref, SECRET_VALUE)
    dsn = migrated_database.app_dsn
    rows = await as_user(dsn, new_user(), "select id from bastion.credentials where scope = 'app'")
    assert rows == (0, [])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_user(
            dsn, new_user(), "select * from bastion.get_app_credential('postgres', %s)", (ref.secret,)
        )


async def test_a_direct_database_client_sees_not_even_its_own_credentials(
    provider: PostgresCredentialProvider, migrated_database: MigratedDatabase
) -> None:
    alice = new_user()
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    direct = migrated_database.cluster.dsn(migrated_database.name, user="api_client")
    assert await as_user(direct, alice, "select id from bastion.credentials") == (0, [])


async def test_a_direct_database_client_is_forbidden_app_credentials(
    provider: PostgresCredentialProvider, migrated_database: MigratedDatabase, keys: CredentialKeyring
) -> None:
    ref = CredentialRef(provider="postgres", secret=f"app-{uuid.uuid4()}", scope="app")
    await provider.put(ref, SECRET_VALUE)
    direct_pool = await open_pool(migrated_database.cluster.dsn(migrated_database.name, user="api_client"))
    try:
        direct = PostgresCredentialProvider(direct_pool, keys=keys)
        with pytest.raises(CredentialForbiddenError):
            await direct.get(ref)
    finally:
        await direct_pool.close()


async def test_a_credential_stored_in_one_tenant_is_not_found_in_another(
    pool: AsyncConnectionPool[Any], keys: CredentialKeyring
) -> None:
    alice = new_user()
    acme = PostgresCredentialProvider(pool, keys=keys, tenant_id="acme")
    await acme.put(USER_REF, SECRET_VALUE, owner_id=alice)
    assert await acme.get(USER_REF, owner_id=alice) == SECRET_VALUE
    assert (
        await PostgresCredentialProvider(pool, keys=keys, tenant_id="globex").get(USER_REF, owner_id=alice)
        is None
    )
    assert await PostgresCredentialProvider(pool, keys=keys).get(USER_REF, owner_id=alice) is None


async def test_a_row_moved_to_another_tenant_does_not_decrypt(
    pool: AsyncConnectionPool[Any], keys: CredentialKeyring, admin: psycopg.AsyncConnection[Any]
) -> None:
    alice = new_user()
    await PostgresCredentialProvider(pool, keys=keys, tenant_id="acme").put(
        USER_REF, SECRET_VALUE, owner_id=alice
    )
    await admin.execute("update bastion.credentials set tenant_id = 'globex' where owner_id = %s", (alice,))
    with pytest.raises(CredentialInvalidError):
        await PostgresCredentialProvider(pool, keys=keys, tenant_id="globex").get(USER_REF, owner_id=alice)


# Validation and failures


async def test_references_that_do_not_fit_are_refused_before_any_query(
    provider: PostgresCredentialProvider,
) -> None:
    with pytest.raises(ValueError):
        await provider.get(
            CredentialRef(provider="memory", secret="linear", scope="user"), owner_id=new_user()
        )
    with pytest.raises(ValueError):
        await provider.get(USER_REF, owner_id=None)
    with pytest.raises(ValueError):
        await provider.get(APP_REF, owner_id=new_user())
    with pytest.raises(ValueError):
        await provider.get(USER_REF, owner_id="not-a-uuid")
    with pytest.raises(ValueError):
        await provider.put(USER_REF, "", owner_id=new_user())


async def test_a_database_failure_is_a_storage_error_that_reveals_nothing(
    pg_cluster: PostgresCluster, migrated_database: MigratedDatabase, keys: CredentialKeyring
) -> None:
    unmigrated = await open_pool(pg_cluster.dsn(pg_cluster.database(), user="bastion_app"))
    try:
        with pytest.raises(CredentialStorageError) as raised:
            await PostgresCredentialProvider(unmigrated, keys=keys).get(USER_REF, owner_id=new_user())
    finally:
        await unmigrated.close()
    assert str(raised.value) == CredentialStorageError.message


# The keyring


def test_a_bare_key_gets_an_id_derived_from_it() -> None:
    key = new_key()
    assert keyring(key).current_key_id == keyring(key).current_key_id != keyring(new_key()).current_key_id


def test_the_first_key_in_the_environment_encrypts() -> None:
    assert keyring(f"new:{new_key()}, old:{new_key()}").current_key_id == "new"
    assert keyring(f"new:{new_key()}, old:{new_key()}").key_ids == frozenset({"new", "old"})


@pytest.mark.parametrize(
    "value",
    ["", "k1:not base64!", f"k1:{base64.b64encode(os.urandom(16)).decode()}", "bad id:" + new_key()],
    ids=["missing", "not-base64", "short", "bad-id"],
)
def test_a_missing_or_malformed_key_is_a_configuration_error(value: str) -> None:
    with pytest.raises(ValueError):
        keyring(value)


def test_a_key_id_named_twice_is_a_configuration_error() -> None:
    with pytest.raises(ValueError):
        keyring(f"k1:{new_key()},k1:{new_key()}")


def test_neither_the_keyring_nor_its_errors_show_key_material() -> None:
    key = new_key()
    assert key not in repr(keyring(f"k1:{key}"))
    with pytest.raises(ValueError) as raised:
        keyring(f"k1:{key},k1:{key}")
    assert key not in str(raised.value)


def test_the_provider_reads_its_key_from_the_environment(
    pool: AsyncConnectionPool[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BASTION_CREDENTIALS_KEY", raising=False)
    with pytest.raises(ValueError):
        PostgresCredentialProvider(pool)
    monkeypatch.setenv("BASTION_CREDENTIALS_KEY", f"from-env:{new_key()}")
    assert PostgresCredentialProvider(pool).name == "postgres"


# credential_auth end to end


@dataclass(frozen=True)
class Ctx:
    user_id: str | None


@pytest.fixture(scope="module")
def token_server() -> Iterator[RunningServer]:
    with serve_mcp("http", Behavior(tokens=frozenset({MCP_TOKEN}))) as running:
        yield running


def docs_connection(server: RunningServer, provider: CredentialProvider, ref: CredentialRef) -> Any:
    auth = credential_auth(provider=provider, ref=ref, owner=ref.scope, connection="Documents")
    return McpConnectionDefinition[Ctx](
        name="docs", transport=McpTransport(type="http", url=server.url), allowlist=["whoami"], auth=auth
    )


async def call_whoami(definition: Any, context: Ctx) -> Any:
    connections = await create_mcp_connections([definition], context=context)
    try:
        [whoami] = connections.tools
        assert whoami.execute is not None
        return await whoami.execute(
            ToolCall(tool_name=whoami.name, input={"user": "alice"}, tool_call_id="c1")
        )
    finally:
        await connections.close()


async def test_credential_auth_sends_the_users_token_from_postgres(
    token_server: RunningServer, provider: PostgresCredentialProvider
) -> None:
    alice = new_user()
    await provider.put(USER_REF, MCP_TOKEN, owner_id=alice)
    result = await call_whoami(docs_connection(token_server, provider, USER_REF), Ctx(alice))
    assert result == {"result": "alice"}
    assert token_server.log.tool_calls("whoami")[-1].authorization == f"Bearer {MCP_TOKEN}"


async def test_credential_auth_sends_the_app_token_from_postgres(
    token_server: RunningServer, provider: PostgresCredentialProvider
) -> None:
    ref = CredentialRef(provider="postgres", secret=f"app-{uuid.uuid4()}", scope="app")
    await provider.put(ref, MCP_TOKEN)
    assert await call_whoami(docs_connection(token_server, provider, ref), Ctx(None)) == {"result": "alice"}


async def test_a_user_without_a_stored_credential_needs_authorization_before_connecting(
    token_server: RunningServer, provider: PostgresCredentialProvider
) -> None:
    alice, bob = new_user(), new_user()
    await provider.put(USER_REF, MCP_TOKEN, owner_id=alice)
    before = len(token_server.log.requests)
    with pytest.raises(McpConnectionError) as raised:
        await call_whoami(docs_connection(token_server, provider, USER_REF), Ctx(bob))
    assert raised.value.code == "authorization_required"
    assert len(token_server.log.requests) == before


async def test_credential_auth_maps_missing_and_undecryptable_credentials(
    pool: AsyncConnectionPool[Any], provider: PostgresCredentialProvider
) -> None:
    alice = new_user()
    headers = credential_auth(provider=provider, ref=USER_REF, owner="user", connection="Linear")
    with pytest.raises(ConnectionAuthorizationRequiredError):
        await headers(Ctx(alice))
    await provider.put(USER_REF, SECRET_VALUE, owner_id=alice)
    wrong_key = PostgresCredentialProvider(pool, keys=keyring(f"k1:{new_key()}"))
    refused = credential_auth(provider=wrong_key, ref=USER_REF, owner="user", connection="Linear")
    with pytest.raises(ConnectionAuthorizationFailedError):
        await refused(Ctx(alice))


# Supabase Vault (a stand-in schema with Vault's names; see the module docstring)


@dataclass(frozen=True)
class VaultDatabase:
    admin_dsn: str
    app_dsn: str
    direct_dsn: str


@pytest.fixture(scope="module")
def vault_database(pg_cluster: PostgresCluster, migrated_database: MigratedDatabase) -> VaultDatabase:
    name = pg_cluster.database("vault")
    with psycopg.connect(pg_cluster.dsn(name), autocommit=True) as conn:
        conn.execute(STAND_IN_VAULT.encode())
    asyncio.run(apply_migrations(pg_cluster.dsn(name)))
    pg_cluster.create_login_roles()
    return VaultDatabase(
        admin_dsn=pg_cluster.dsn(name),
        app_dsn=pg_cluster.dsn(name, user="bastion_app"),
        direct_dsn=pg_cluster.dsn(name, user="api_client"),
    )


@pytest.fixture
async def vault_pool(vault_database: VaultDatabase) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pool = await open_pool(vault_database.app_dsn)
    yield pool
    await pool.close()


@pytest.fixture
async def vault(vault_pool: AsyncConnectionPool[Any]) -> VaultCredentialProvider:
    found = await VaultCredentialProvider.detect(vault_pool)
    assert found is not None
    return found


async def test_detect_finds_no_vault_in_a_plain_database(pool: AsyncConnectionPool[Any]) -> None:
    assert await VaultCredentialProvider.detect(pool) is None


async def test_a_vault_provider_without_vault_is_a_storage_error(pool: AsyncConnectionPool[Any]) -> None:
    with pytest.raises(CredentialStorageError):
        await VaultCredentialProvider(pool).get(VAULT_USER_REF, owner_id=new_user())


async def test_a_vault_user_credential_round_trips_and_is_replaced(vault: VaultCredentialProvider) -> None:
    alice = new_user()
    await vault.put(VAULT_USER_REF, "first", owner_id=alice)
    await vault.put(VAULT_USER_REF, SECRET_VALUE, owner_id=alice)
    assert await vault.get(VAULT_USER_REF, owner_id=alice) == SECRET_VALUE


async def test_a_vault_app_credential_round_trips_and_is_deleted(vault: VaultCredentialProvider) -> None:
    ref = CredentialRef(provider="vault", secret=f"app-{uuid.uuid4()}", scope="app")
    await vault.put(ref, SECRET_VALUE)
    assert await vault.get(ref) == SECRET_VALUE
    await vault.delete(ref)
    await vault.delete(ref)
    assert await vault.get(ref) is None


async def test_a_missing_vault_credential_is_none(vault: VaultCredentialProvider) -> None:
    assert await vault.get(VAULT_USER_REF, owner_id=new_user()) is None


async def test_a_vault_credential_is_reachable_only_by_its_owner(vault: VaultCredentialProvider) -> None:
    alice, bob = new_user(), new_user()
    await vault.put(VAULT_USER_REF, SECRET_VALUE, owner_id=alice)
    assert await vault.get(VAULT_USER_REF, owner_id=bob) is None
    await vault.put(VAULT_USER_REF, "bobs-own", owner_id=bob)
    await vault.delete(VAULT_USER_REF, owner_id=bob)
    assert await vault.get(VAULT_USER_REF, owner_id=alice) == SECRET_VALUE


async def test_a_vault_credential_stored_in_one_tenant_is_not_found_in_another(
    vault_pool: AsyncConnectionPool[Any],
) -> None:
    alice = new_user()
    await VaultCredentialProvider(vault_pool, tenant_id="acme").put(
        VAULT_USER_REF, SECRET_VALUE, owner_id=alice
    )
    assert (
        await VaultCredentialProvider(vault_pool, tenant_id="globex").get(VAULT_USER_REF, owner_id=alice)
        is None
    )
    assert await VaultCredentialProvider(vault_pool).get(VAULT_USER_REF, owner_id=alice) is None


async def test_vault_secret_names_carry_the_verified_owner_and_tenant(
    vault_pool: AsyncConnectionPool[Any], vault_database: VaultDatabase
) -> None:
    alice = new_user()
    await VaultCredentialProvider(vault_pool, tenant_id="acme").put(
        VAULT_USER_REF, SECRET_VALUE, owner_id=alice
    )
    async with await psycopg.AsyncConnection.connect(vault_database.admin_dsn) as conn:
        cursor = await conn.execute("select name from vault.secrets where name like %s", (f"%{alice}%",))
        [(name,)] = await cursor.fetchall()
    assert json.loads(name) == ["bastion", "user", "vault", "linear", alice, "acme"]


async def test_the_application_role_cannot_read_vault_directly(vault_database: VaultDatabase) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_user(
            vault_database.app_dsn, new_user(), "select decrypted_secret from vault.decrypted_secrets"
        )


async def test_the_authenticated_role_cannot_call_the_vault_functions(vault_database: VaultDatabase) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        await as_user(
            vault_database.app_dsn,
            new_user(),
            "select bastion.vault_get_credential('user', 'vault', 'linear')",
        )


async def test_a_direct_database_client_is_forbidden_vault_credentials(vault_database: VaultDatabase) -> None:
    direct_pool = await open_pool(vault_database.direct_dsn)
    try:
        with pytest.raises(CredentialForbiddenError):
            await VaultCredentialProvider(direct_pool).get(VAULT_USER_REF, owner_id=new_user())
    finally:
        await direct_pool.close()


async def test_the_vault_functions_refuse_a_user_credential_without_a_user(
    vault_database: VaultDatabase,
) -> None:
    async with await psycopg.AsyncConnection.connect(vault_database.app_dsn) as conn:
        await conn.execute("set local role bastion_runtime")
        with pytest.raises(psycopg.Error) as raised:
            await conn.execute("select bastion.vault_get_credential('user', 'vault', 'linear')")
    assert raised.value.sqlstate == "BS403"


async def test_credential_auth_sends_the_users_token_from_vault(
    token_server: RunningServer, vault: VaultCredentialProvider
) -> None:
    alice = new_user()
    await vault.put(VAULT_USER_REF, MCP_TOKEN, owner_id=alice)
    assert await call_whoami(docs_connection(token_server, vault, VAULT_USER_REF), Ctx(alice)) == {
        "result": "alice"
    }
    assert token_server.log.tool_calls("whoami")[-1].authorization == f"Bearer {MCP_TOKEN}"
