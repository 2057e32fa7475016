"""Credentials for connections: where secrets live (`CredentialProvider`) and how a connection gets them.

A `CredentialRef` names a secret in a provider and says whose it is: the application's (`scope="app"`,
one value shared by every turn) or a user's (`scope="user"`, one value per owner). `credential_auth`
turns a reference into the headers of an MCP connection definition (`McpConnectionDefinition.auth`),
resolved afresh every time the connection opens, so a turn always uses the signed-in user's current
credential and never another user's.

Providers map their failures onto a small set of errors, which `credential_auth` turns into what the
application acts on: a missing or unauthorized credential asks the user to connect
(`ConnectionAuthorizationRequiredError`), a forbidden or invalid one fails for good
(`ConnectionAuthorizationFailedError`), anything else is a generic `CredentialStorageError`.
Secret values never appear in an error, a log line or a repr.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar, overload, runtime_checkable

from bastion.auth import Principal

__all__ = [
    "ConnectionAuthorizationFailedError",
    "ConnectionAuthorizationRequiredError",
    "CredentialError",
    "CredentialForbiddenError",
    "CredentialInvalidError",
    "CredentialProvider",
    "CredentialRef",
    "CredentialScope",
    "CredentialStorageError",
    "CredentialUnauthorizedError",
    "EnvironmentCredentialProvider",
    "InMemoryCredentialProvider",
    "check_credential_owner",
    "credential_auth",
]

ContextT = TypeVar("ContextT")
CredentialScope: TypeAlias = Literal["app", "user"]

logger = logging.getLogger("bastion.credentials")

_SCOPES: frozenset[str] = frozenset({"app", "user"})
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, kw_only=True)
class CredentialRef:
    """Which secret, in which provider, owned by whom: the application (`app`) or each user (`user`)."""

    provider: str
    secret: str
    scope: CredentialScope

    def __post_init__(self) -> None:
        if not isinstance(self.provider, str) or not self.provider.strip():
            raise ValueError("A credential reference needs a provider name.")
        if not isinstance(self.secret, str) or not self.secret.strip():
            raise ValueError("A credential reference needs a secret name.")
        if self.scope not in _SCOPES:
            raise ValueError(f"A credential scope is 'app' or 'user', got {self.scope!r}.")


class CredentialError(Exception):
    """A provider could not hand out a credential. `code` is stable; the message names no secret."""

    code = "credential_error"
    message = "The credential is not available."

    def __init__(self, message: str | None = None) -> None:
        if message is not None:
            self.message = message
        super().__init__(self.message)


class CredentialUnauthorizedError(CredentialError):
    """The store needs an authorization the caller lacks (for example, the user's session ended)."""

    code = "credential_unauthorized"
    message = "Not authorized to read this credential."


class CredentialForbiddenError(CredentialError):
    """The store refuses this caller this credential, or this operation, for good."""

    code = "credential_forbidden"
    message = "Access to this credential is forbidden."


class CredentialInvalidError(CredentialError):
    """The stored credential cannot be used (it cannot be decrypted, or it was revoked)."""

    code = "credential_invalid"
    message = "The stored credential is invalid."


class CredentialStorageError(CredentialError):
    """The credential store failed; the cause is logged, never shown."""

    code = "credential_storage_error"
    message = "Credentials are unavailable right now. Try again later."


class ConnectionAuthorizationRequiredError(Exception):
    """The connection has no usable credential for this turn: the user should connect (again).

    `can_authorize` is True when the user of this turn can be sent to sign in right away (an interactive
    OAuth connection and a signed-in user); False for jobs, contacts and credentials only pasted in.
    """

    code = "authorization_required"
    retryable = True

    def __init__(self, connection: str, *, can_authorize: bool = False) -> None:
        self.connection = connection
        self.can_authorize = can_authorize
        self.message = f"Connect {connection} to continue."
        super().__init__(self.message)


class ConnectionAuthorizationFailedError(Exception):
    """The connection's credential is forbidden or invalid; trying again will not help."""

    code = "authorization_failed"
    retryable = False

    def __init__(self, connection: str) -> None:
        self.connection = connection
        self.message = f"The credential for {connection} was refused."
        super().__init__(self.message)


@runtime_checkable
class CredentialProvider(Protocol):
    """Where credentials are stored. `owner_id` is the user for `scope="user"` references, else None.

    `get` returns None when nothing is stored. Failures are raised as `CredentialUnauthorizedError`,
    `CredentialForbiddenError` or `CredentialInvalidError`; anything else counts as a storage failure.
    A provider backed by a database reads and writes a user's credential as that user (row-level
    security keyed by `owner_id`), so one user's turn can never read another's.
    """

    @property
    def name(self) -> str:
        """The provider name that references to this provider carry (`CredentialRef.provider`)."""
        ...

    @property
    def scopes(self) -> frozenset[CredentialScope]:
        """The scopes this provider can store."""
        ...

    async def get(self, ref: CredentialRef, *, owner_id: str | None) -> str | None: ...

    async def put(self, ref: CredentialRef, value: str, *, owner_id: str | None) -> None: ...

    async def delete(self, ref: CredentialRef, *, owner_id: str | None) -> None: ...


def check_credential_owner(provider: CredentialProvider, ref: CredentialRef, owner_id: str | None) -> None:
    """Refuse a reference meant for another provider or scope, and an owner that does not fit the scope.

    These are programming errors (`ValueError`), checked by every provider before touching storage.
    """
    if ref.provider != provider.name:
        raise ValueError(f"The reference names provider {ref.provider!r}, not {provider.name!r}.")
    if ref.scope not in provider.scopes:
        raise ValueError(f"Provider {provider.name!r} does not store {ref.scope!r} credentials.")
    if ref.scope == "user" and (not isinstance(owner_id, str) or not owner_id):
        raise ValueError("A user credential needs the owner's id.")
    if ref.scope == "app" and owner_id is not None:
        raise ValueError("An app credential has no owner.")


class EnvironmentCredentialProvider:
    """App credentials read from environment variables (`prefix` + the reference's secret name).

    Read-only and app-scoped: a user's credential never lives in the process environment.
    """

    def __init__(
        self, *, environ: Mapping[str, str] | None = None, prefix: str = "", name: str = "env"
    ) -> None:
        if prefix and not _ENV_NAME.match(prefix):
            raise ValueError("An environment variable prefix uses letters, digits and underscores.")
        self._environ = environ if environ is not None else os.environ
        self._prefix = prefix
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def scopes(self) -> frozenset[CredentialScope]:
        return frozenset({"app"})

    def _variable(self, ref: CredentialRef, owner_id: str | None) -> str:
        check_credential_owner(self, ref, owner_id)
        variable = self._prefix + ref.secret
        if not _ENV_NAME.match(variable):
            raise ValueError("An environment secret name uses letters, digits and underscores.")
        return variable

    async def get(self, ref: CredentialRef, *, owner_id: str | None = None) -> str | None:
        return self._environ.get(self._variable(ref, owner_id)) or None

    async def put(self, ref: CredentialRef, value: str, *, owner_id: str | None = None) -> None:
        self._variable(ref, owner_id)
        raise CredentialForbiddenError("Environment credentials are read-only.")

    async def delete(self, ref: CredentialRef, *, owner_id: str | None = None) -> None:
        self._variable(ref, owner_id)
        raise CredentialForbiddenError("Environment credentials are read-only.")


class InMemoryCredentialProvider:
    """Credentials in a dictionary, for tests and development; gone when the process ends."""

    def __init__(self, *, name: str = "memory") -> None:
        self._name = name
        self._values: dict[tuple[str, str, str | None], str] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def scopes(self) -> frozenset[CredentialScope]:
        return frozenset({"app", "user"})

    def _key(self, ref: CredentialRef, owner_id: str | None) -> tuple[str, str, str | None]:
        check_credential_owner(self, ref, owner_id)
        return (ref.scope, ref.secret, owner_id)

    async def get(self, ref: CredentialRef, *, owner_id: str | None = None) -> str | None:
        return self._values.get(self._key(ref, owner_id))

    async def put(self, ref: CredentialRef, value: str, *, owner_id: str | None = None) -> None:
        if not isinstance(value, str) or not value:
            raise ValueError("A credential value is a non-empty string.")
        self._values[self._key(ref, owner_id)] = value

    async def delete(self, ref: CredentialRef, *, owner_id: str | None = None) -> None:
        self._values.pop(self._key(ref, owner_id), None)


def _user_id_of(context: Any) -> str | None:
    """The default way to find the signed-in user: a verified `Principal`, or a `user_id` attribute or key."""
    if isinstance(context, Principal):
        return context.id
    value = context.get("user_id") if isinstance(context, Mapping) else getattr(context, "user_id", None)
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True)
class _CredentialHeaders(Generic[ContextT]):
    provider: CredentialProvider
    ref: CredentialRef
    owner: CredentialScope
    connection: str
    user: Callable[[ContextT], str | None]
    header: str
    scheme: str | None

    async def __call__(self, context: ContextT) -> dict[str, str]:
        owner_id: str | None = None
        if self.owner == "user":
            owner_id = self._signed_in_user(context)
        try:
            value = await self.provider.get(self.ref, owner_id=owner_id)
        except (ConnectionAuthorizationRequiredError, ConnectionAuthorizationFailedError):
            raise
        except CredentialUnauthorizedError:
            raise ConnectionAuthorizationRequiredError(self.connection) from None
        except (CredentialForbiddenError, CredentialInvalidError):
            raise ConnectionAuthorizationFailedError(self.connection) from None
        except Exception:
            logger.exception("Reading the credential for %s failed.", self.connection)
            raise CredentialStorageError() from None
        if value is None or value == "":
            raise ConnectionAuthorizationRequiredError(self.connection)
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise ConnectionAuthorizationFailedError(self.connection)
        return {self.header: f"{self.scheme} {value}" if self.scheme else value}

    def _signed_in_user(self, context: ContextT) -> str:
        try:
            user_id = self.user(context)
        except Exception:
            logger.warning("Finding the user for %s failed.", self.connection, exc_info=True)
            user_id = None
        if not isinstance(user_id, str) or not user_id:
            raise ConnectionAuthorizationRequiredError(self.connection)
        return user_id


@overload
def credential_auth(
    *,
    provider: CredentialProvider,
    ref: CredentialRef,
    owner: CredentialScope,
    connection: str,
    header: str = "Authorization",
    scheme: str | None = "Bearer",
) -> Callable[[object], Awaitable[dict[str, str]]]: ...


@overload
def credential_auth(
    *,
    provider: CredentialProvider,
    ref: CredentialRef,
    owner: CredentialScope,
    connection: str,
    user: Callable[[ContextT], str | None],
    header: str = "Authorization",
    scheme: str | None = "Bearer",
) -> Callable[[ContextT], Awaitable[dict[str, str]]]: ...


def credential_auth(
    *,
    provider: CredentialProvider,
    ref: CredentialRef,
    owner: CredentialScope,
    connection: str,
    user: Callable[[Any], str | None] = _user_id_of,
    header: str = "Authorization",
    scheme: str | None = "Bearer",
) -> Callable[[Any], Awaitable[dict[str, str]]]:
    """The headers of an MCP connection, read from `provider` each time the connection opens.

    `owner="app"` shares the application's credential; `owner="user"` reads the signed-in user's
    (found with `user(context)`, by default the context's `user_id`), and a turn without a user gets
    `ConnectionAuthorizationRequiredError`. `connection` is the name shown to the user in errors.
    The value is sent as `<header>: <scheme> <value>` (just the value when `scheme` is None).
    """
    if owner not in _SCOPES:
        raise ValueError(f"A credential owner is 'app' or 'user', got {owner!r}.")
    if not isinstance(ref, CredentialRef):
        raise TypeError("ref must be a CredentialRef.")
    if ref.scope != owner:
        raise ValueError(f"owner={owner!r} needs a reference with scope {owner!r}, not {ref.scope!r}.")
    if ref.provider != provider.name:
        raise ValueError(f"The reference names provider {ref.provider!r}, not {provider.name!r}.")
    if ref.scope not in provider.scopes:
        raise ValueError(f"Provider {provider.name!r} does not store {ref.scope!r} credentials.")
    if not isinstance(connection, str) or not connection.strip():
        raise ValueError("credential_auth needs the connection's display name.")
    if not _HEADER_NAME.match(header):
        raise ValueError(f"{header!r} is not a valid header name.")
    if scheme is not None and (not scheme or not _HEADER_NAME.match(scheme)):
        raise ValueError(f"{scheme!r} is not a valid authorization scheme.")
    if not callable(user):
        raise TypeError("user must be a function of the context.")
    return _CredentialHeaders[Any](
        provider=provider,
        ref=ref,
        owner=owner,
        connection=connection,
        user=user,
        header=header,
        scheme=scheme,
    )
