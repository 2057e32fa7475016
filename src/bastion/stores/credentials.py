"""Credential providers over Postgres: secrets encrypted by the application, or kept in Supabase Vault.

`PostgresCredentialProvider` encrypts each value with AES-256-GCM under a key from the environment
(`CredentialKeyring`) before it reaches the database, and binds the ciphertext to its provider,
secret name, scope, owner and tenant, so a row copied to another owner does not decrypt. A user's
credential is read and written as that user, under row-level security (migration 0004); an app
credential is reachable only through functions the application server's `bastion_runtime` role may
execute. `VaultCredentialProvider` keeps values in Supabase Vault through database functions that
derive each secret's name from the caller's verified identity.

Both implement `bastion.credentials.CredentialProvider`; pass them to `credential_auth`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from bastion._extras import missing_extra

try:
    import psycopg
    from psycopg.rows import TupleRow
    from psycopg_pool import AsyncConnectionPool
except ImportError as error:
    raise missing_extra("bastion.stores.credentials", "postgres", error) from error

from bastion.credentials import (
    CredentialForbiddenError,
    CredentialInvalidError,
    CredentialRef,
    CredentialScope,
    CredentialStorageError,
    check_credential_owner,
)
from bastion.stores.entities import StoreIdentity
from bastion.stores.errors import InvalidInputError
from bastion.stores.postgres import caller_transaction

__all__ = [
    "CREDENTIALS_KEY_VARIABLE",
    "CredentialKeyring",
    "LockedCredential",
    "PostgresCredentialProvider",
    "VaultCredentialProvider",
]

Connection: TypeAlias = psycopg.AsyncConnection[TupleRow]
Pool: TypeAlias = AsyncConnectionPool[Connection]

CREDENTIALS_KEY_VARIABLE: Final = "BASTION_CREDENTIALS_KEY"

_KEY_ID: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_MAX_NAME: Final = 200
_MAX_VALUE_BYTES: Final = 65536
_NONCE_BYTES: Final = 12
_FORMAT: Final = "bastion.credentials.v1"
# Refusals the database raises on purpose (BS403) or for a missing privilege (42501).
_FORBIDDEN_STATES: Final = frozenset({"BS403", "42501"})
_SET_CALLER: Final = "select set_config('role', %s, true), set_config('request.jwt.claims', %s, true)"
_VAULT_PRESENT: Final = """
select exists (
  select 1 from pg_catalog.pg_proc p join pg_catalog.pg_namespace n on n.oid = p.pronamespace
  where n.nspname = 'vault' and p.proname in ('create_secret', 'update_secret')
  having count(distinct p.proname) = 2
) and exists (
  select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
  where n.nspname = 'vault' and c.relname in ('secrets', 'decrypted_secrets')
  having count(distinct c.relname) = 2
)
"""
_PUT_USER_CREDENTIAL: Final = """
insert into bastion.credentials (scope, provider, secret, key_id, nonce, ciphertext)
values ('user', %s, %s, %s, %s, %s)
on conflict on constraint credentials_identity do update
set key_id = excluded.key_id, nonce = excluded.nonce, ciphertext = excluded.ciphertext, updated_at = now()
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class LockedCredential:
    """A credential held under its row lock: its `value` (None when nothing is stored), and `replace` and
    `delete`, which take effect when the lock is released."""

    value: str | None = field(repr=False)
    _replace: Callable[[str], Awaitable[None]] = field(repr=False)
    _delete: Callable[[], Awaitable[None]] = field(repr=False)

    async def replace(self, value: str) -> None:
        await self._replace(value)

    async def delete(self) -> None:
        await self._delete()


async def _nothing_locked(*_: str) -> None:
    raise CredentialInvalidError("No credential is stored to change.")


def _text(plaintext: bytes) -> str:
    try:
        return plaintext.decode()
    except UnicodeDecodeError:
        raise CredentialInvalidError() from None


class CredentialKeyring:
    """The AES-256 keys credentials are encrypted with: one current key, and older ones that still decrypt.

    Each key has an id stored beside every ciphertext, so keys rotate without re-encrypting at once:
    put the new key first, keep the old ones after it until every credential was written again.
    The environment format is `id:base64,id:base64,...` (the first encrypts); a bare base64 key gets
    an id derived from it. Keys never appear in a repr or an error.
    """

    __slots__ = ("_current", "_keys")

    def __init__(self, keys: Mapping[str, bytes], *, current: str) -> None:
        if not keys:
            raise ValueError("A credential keyring needs at least one key.")
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
                raise ValueError("A credential key id uses 1 to 64 letters, digits, '_', '.' or '-'.")
            if not isinstance(key, bytes) or len(key) != 32:
                raise ValueError(f"Credential key {key_id!r} is not 32 bytes.")
        if current not in keys:
            raise ValueError("The current credential key is not in the keyring.")
        self._keys = dict(keys)
        self._current = current

    @classmethod
    def from_environment(
        cls, *, environ: Mapping[str, str] | None = None, variable: str = CREDENTIALS_KEY_VARIABLE
    ) -> CredentialKeyring:
        """The keyring in environment variable `variable` (default `BASTION_CREDENTIALS_KEY`)."""
        text = (environ if environ is not None else os.environ).get(variable, "").strip()
        if not text:
            raise ValueError(f"Set {variable} to a base64-encoded 32-byte key to store credentials.")
        keys: dict[str, bytes] = {}
        for entry in (part.strip() for part in text.split(",")):
            key_id, separator, encoded = entry.rpartition(":")
            key = _decode_key(encoded, variable)
            key_id = key_id if separator else hashlib.sha256(key).hexdigest()[:16]
            if key_id in keys:
                raise ValueError(f"{variable} names credential key {key_id!r} twice.")
            keys[key_id] = key
        return cls(keys, current=next(iter(keys)))

    @property
    def current_key_id(self) -> str:
        return self._current

    @property
    def key_ids(self) -> frozenset[str]:
        return frozenset(self._keys)

    def __repr__(self) -> str:
        return f"CredentialKeyring(current={self._current!r}, key_ids={sorted(self._keys)!r})"

    def encrypt(self, plaintext: bytes, associated_data: bytes) -> tuple[str, bytes, bytes]:
        """`(key id, nonce, ciphertext)` under the current key; a fresh random nonce every time."""
        nonce = os.urandom(_NONCE_BYTES)
        key_id = self._current
        return key_id, nonce, AESGCM(self._keys[key_id]).encrypt(nonce, plaintext, associated_data)

    def decrypt(self, key_id: str, nonce: bytes, ciphertext: bytes, associated_data: bytes) -> bytes:
        """The plaintext, or `CredentialInvalidError` for an unknown key, a wrong key or a moved row."""
        key = self._keys.get(key_id)
        if key is None or len(nonce) != _NONCE_BYTES:
            raise CredentialInvalidError()
        try:
            return AESGCM(key).decrypt(nonce, ciphertext, associated_data)
        except InvalidTag:
            raise CredentialInvalidError() from None


class PostgresCredentialProvider:
    """Credentials in `bastion.credentials`, encrypted by this process, under row-level security.

    `pool` is a pool connected as the application's role (no BYPASSRLS; member of `authenticated`
    and `bastion_runtime`), and may be the one given to `PostgresStore.open`. A user's credential is
    read and written as `owner_id` inside one tenant, `tenant_id` (build one provider per tenant);
    another user's is simply not found. App credentials have no owner and no tenant. `keys` defaults
    to `CredentialKeyring.from_environment()`.
    """

    def __init__(
        self,
        pool: Pool,
        *,
        keys: CredentialKeyring | None = None,
        name: str = "postgres",
        tenant_id: str | None = None,
    ) -> None:
        _check_name(name, "provider name")
        if tenant_id is not None:
            _check_name(tenant_id, "tenant id")
        self._pool = pool
        self._keys = keys if keys is not None else CredentialKeyring.from_environment()
        self._name = name
        self._tenant_id = tenant_id

    @property
    def name(self) -> str:
        return self._name

    @property
    def scopes(self) -> frozenset[CredentialScope]:
        return frozenset({"app", "user"})

    async def get(self, ref: CredentialRef, *, owner_id: str | None = None) -> str | None:
        caller = self._caller(ref, owner_id)
        with _database_errors():
            async with _transaction(self._pool, caller) as conn:
                if ref.scope == "app":
                    cursor = await conn.execute(
                        "select key_id, nonce, ciphertext from bastion.get_app_credential(%s, %s)",
                        (ref.provider, ref.secret),
                    )
                else:
                    cursor = await conn.execute(
                        "select key_id, nonce, ciphertext from bastion.credentials "
                        "where scope = 'user' and provider = %s and secret = %s and owner_id = %s",
                        (ref.provider, ref.secret, caller.owner_id),
                    )
            row = await cursor.fetchone()
        if row is None:
            return None
        key_id, nonce, ciphertext = row
        plaintext = self._keys.decrypt(
            key_id, bytes(nonce), bytes(ciphertext), self._aad(ref, caller, key_id)
        )
        try:
            return plaintext.decode()
        except UnicodeDecodeError:
            raise CredentialInvalidError() from None

    async def put(self, ref: CredentialRef, value: str, *, owner_id: str | None = None) -> None:
        caller = self._caller(ref, owner_id)
        plaintext = _check_value(value)
        key_id, nonce, ciphertext = self._keys.encrypt(
            plaintext, self._aad(ref, caller, self._keys.current_key_id)
        )
        with _database_errors():
            async with _transaction(self._pool, caller) as conn:
                if ref.scope == "app":
                    await conn.execute(
                        "select bastion.put_app_credential(%s, %s, %s, %s, %s)",
                        (ref.provider, ref.secret, key_id, nonce, ciphertext),
                    )
                else:
                    await conn.execute(
                        _PUT_USER_CREDENTIAL,
                        (ref.provider, ref.secret, key_id, nonce, ciphertext),
                    )

    async def delete(self, ref: CredentialRef, *, owner_id: str | None = None) -> None:
        """Forget the credential; forgetting one that is not stored is not an error."""
        caller = self._caller(ref, owner_id)
        with _database_errors():
            async with _transaction(self._pool, caller) as conn:
                if ref.scope == "app":
                    await conn.execute(
                        "select bastion.delete_app_credential(%s, %s)", (ref.provider, ref.secret)
                    )
                else:
                    await conn.execute(
                        "delete from bastion.credentials "
                        "where scope = 'user' and provider = %s and secret = %s and owner_id = %s",
                        (ref.provider, ref.secret, caller.owner_id),
                    )

    @asynccontextmanager
    async def locked(self, ref: CredentialRef, *, owner_id: str) -> AsyncIterator[LockedCredential]:
        """A user's credential read under a row lock held until the block ends; replacing or deleting it
        inside the block commits with it, so two callers updating one credential (say, refreshing a token
        that rotates) take turns, and the second sees what the first wrote. Nothing stored: no lock,
        `value` is None."""
        if ref.scope != "user":
            raise ValueError("Only a user credential can be locked.")
        caller = self._caller(ref, owner_id)
        with _database_errors():
            async with _transaction(self._pool, caller) as conn:
                cursor = await conn.execute(
                    "select id, key_id, nonce, ciphertext from bastion.credentials "
                    "where scope = 'user' and provider = %s and secret = %s and owner_id = %s for update",
                    (ref.provider, ref.secret, caller.owner_id),
                )
                row = await cursor.fetchone()
                if row is None:
                    yield LockedCredential(value=None, _replace=_nothing_locked, _delete=_nothing_locked)
                    return
                row_id, key_id, nonce, ciphertext = row
                plaintext = self._keys.decrypt(
                    key_id, bytes(nonce), bytes(ciphertext), self._aad(ref, caller, key_id)
                )

                async def replace(value: str) -> None:
                    encoded = _check_value(value)
                    aad = self._aad(ref, caller, self._keys.current_key_id)
                    new_key_id, new_nonce, sealed = self._keys.encrypt(encoded, aad)
                    await conn.execute(
                        "update bastion.credentials set key_id = %s, nonce = %s, ciphertext = %s, "
                        "updated_at = now() where id = %s",
                        (new_key_id, new_nonce, sealed, row_id),
                    )

                async def delete() -> None:
                    await conn.execute("delete from bastion.credentials where id = %s", (row_id,))

                yield LockedCredential(value=_text(plaintext), _replace=replace, _delete=delete)

    def _caller(self, ref: CredentialRef, owner_id: str | None) -> _Caller:
        check_credential_owner(self, ref, owner_id)
        _check_name(ref.secret, "secret name")
        return _caller_of(ref, owner_id, self._tenant_id)

    def _aad(self, ref: CredentialRef, caller: _Caller, key_id: str) -> bytes:
        """What the ciphertext is bound to: decrypting it anywhere else fails."""
        tenant = caller.tenant_id if ref.scope == "user" else None
        fields = [_FORMAT, key_id, ref.provider, ref.secret, ref.scope, caller.owner_id, tenant]
        return json.dumps(fields, separators=(",", ":")).encode()


class VaultCredentialProvider:
    """Credentials in Supabase Vault (`vault.create_secret`, `vault.decrypted_secrets`), through bastion's
    `vault_*` database functions (migration 0004), which name each secret after the caller's verified
    identity: a user's turn can only reach that user's secret, in their tenant.

    Vault encrypts at rest with its own key; this process holds no key. Use `detect` to find out whether
    the database has Vault. `pool` and `tenant_id` are as for `PostgresCredentialProvider`.
    """

    def __init__(self, pool: Pool, *, name: str = "vault", tenant_id: str | None = None) -> None:
        _check_name(name, "provider name")
        if tenant_id is not None:
            _check_name(tenant_id, "tenant id")
        self._pool = pool
        self._name = name
        self._tenant_id = tenant_id

    @classmethod
    async def detect(
        cls, pool: Pool, *, name: str = "vault", tenant_id: str | None = None
    ) -> VaultCredentialProvider | None:
        """A provider over Vault when the database has Vault's functions and views, else None."""
        with _database_errors():
            async with pool.connection() as conn:
                cursor = await conn.execute(_VAULT_PRESENT)
                row = await cursor.fetchone()
        return cls(pool, name=name, tenant_id=tenant_id) if row is not None and row[0] else None

    @property
    def name(self) -> str:
        return self._name

    @property
    def scopes(self) -> frozenset[CredentialScope]:
        return frozenset({"app", "user"})

    async def get(self, ref: CredentialRef, *, owner_id: str | None = None) -> str | None:
        caller = self._caller(ref, owner_id)
        with _database_errors():
            async with _transaction(self._pool, caller.as_runtime()) as conn:
                cursor = await conn.execute(
                    "select bastion.vault_get_credential(%s, %s, %s)", (ref.scope, ref.provider, ref.secret)
                )
            row = await cursor.fetchone()
        value = row[0] if row is not None else None
        return value if isinstance(value, str) and value else None

    async def put(self, ref: CredentialRef, value: str, *, owner_id: str | None = None) -> None:
        caller = self._caller(ref, owner_id)
        _check_value(value)
        if "\x00" in value:
            raise ValueError("A Vault credential cannot contain NUL characters.")
        with _database_errors():
            async with _transaction(self._pool, caller.as_runtime()) as conn:
                await conn.execute(
                    "select bastion.vault_put_credential(%s, %s, %s, %s)",
                    (ref.scope, ref.provider, ref.secret, value),
                )

    async def delete(self, ref: CredentialRef, *, owner_id: str | None = None) -> None:
        """Forget the credential; forgetting one that is not stored is not an error."""
        caller = self._caller(ref, owner_id)
        with _database_errors():
            async with _transaction(self._pool, caller.as_runtime()) as conn:
                await conn.execute(
                    "select bastion.vault_delete_credential(%s, %s, %s)",
                    (ref.scope, ref.provider, ref.secret),
                )

    def _caller(self, ref: CredentialRef, owner_id: str | None) -> _Caller:
        check_credential_owner(self, ref, owner_id)
        _check_name(ref.secret, "secret name")
        return _caller_of(ref, owner_id, self._tenant_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Caller:
    """Who a credential transaction runs as: the database role and the claims set for it."""

    role: str
    claims: str = field(repr=False)
    owner_id: str | None
    tenant_id: str | None

    def as_runtime(self) -> _Caller:
        """The same identity as `bastion_runtime`, the only role that may call the Vault functions."""
        return replace(self, role="bastion_runtime")


def _caller_of(ref: CredentialRef, owner_id: str | None, tenant_id: str | None) -> _Caller:
    """A user's credential is handled as that user (row-level security); an app one as the server."""
    if ref.scope == "app":
        return _Caller(role="bastion_runtime", claims="", owner_id=None, tenant_id=None)
    try:
        identity = StoreIdentity(user_id=str(owner_id), tenant_id=tenant_id)
    except InvalidInputError:
        raise ValueError("A user credential's owner is a user id (a UUID).") from None
    return _Caller(
        role="authenticated",
        claims=identity.database_claims(),
        owner_id=identity.user_id,
        tenant_id=tenant_id,
    )


def _transaction(pool: Pool, caller: _Caller) -> AbstractAsyncContextManager[Connection]:
    """One pipelined transaction as `caller`; role and claims never outlive it on a pooled connection."""
    return caller_transaction(pool, _SET_CALLER, (caller.role, caller.claims))


@contextmanager
def _database_errors() -> Iterator[None]:
    """A refusal is `CredentialForbiddenError`; any other database failure a generic storage error."""
    try:
        yield
    except psycopg.Error as error:
        if error.sqlstate in _FORBIDDEN_STATES:
            raise CredentialForbiddenError() from None
        raise CredentialStorageError() from error


def _check_name(value: object, what: str) -> None:
    if not isinstance(value, str) or not 1 <= len(value) <= _MAX_NAME or "\x00" in value:
        raise ValueError(f"A credential {what} is 1 to {_MAX_NAME} characters without NUL.")


def _check_value(value: object) -> bytes:
    if not isinstance(value, str) or not value:
        raise ValueError("A credential value is a non-empty string.")
    encoded = value.encode()
    if len(encoded) > _MAX_VALUE_BYTES:
        raise ValueError(f"A credential value is at most {_MAX_VALUE_BYTES} bytes.")
    return encoded


def _decode_key(encoded: str, variable: str) -> bytes:
    try:
        key = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{variable} holds a key that is not valid base64.") from None
    if len(key) != 32:
        raise ValueError(f"{variable} holds a key that is not 32 bytes.")
    return key
