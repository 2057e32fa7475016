"""Credential providers and `credential_auth`: whose credential a connection gets, and how failures map."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from bastion.auth import Principal
from bastion.credentials import (
    ConnectionAuthorizationFailedError,
    ConnectionAuthorizationRequiredError,
    CredentialForbiddenError,
    CredentialInvalidError,
    CredentialProvider,
    CredentialRef,
    CredentialScope,
    CredentialStorageError,
    CredentialUnauthorizedError,
    EnvironmentCredentialProvider,
    InMemoryCredentialProvider,
    credential_auth,
)

USER_REF = CredentialRef(provider="memory", secret="linear", scope="user")
APP_REF = CredentialRef(provider="memory", secret="linear", scope="app")
SECRET_VALUE = "lin_secret_5f3a"


@dataclass(frozen=True)
class Ctx:
    user_id: str | None


class FailingProvider:
    """A provider whose every read fails with the given error, and that counts the reads."""

    name = "memory"
    scopes: frozenset[CredentialScope] = frozenset({"app", "user"})

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.reads = 0

    async def get(self, ref: CredentialRef, *, owner_id: str | None) -> str | None:
        self.reads += 1
        raise self.error

    async def put(self, ref: CredentialRef, value: str, *, owner_id: str | None) -> None:
        raise self.error

    async def delete(self, ref: CredentialRef, *, owner_id: str | None) -> None:
        raise self.error


def user_auth(provider: CredentialProvider) -> object:
    return credential_auth(provider=provider, ref=USER_REF, owner="user", connection="Linear")


# References


def test_a_reference_scope_is_app_or_user() -> None:
    with pytest.raises(ValueError):
        CredentialRef(provider="memory", secret="linear", scope="tenant")  # type: ignore[arg-type]


def test_a_reference_needs_a_secret_name() -> None:
    with pytest.raises(ValueError):
        CredentialRef(provider="memory", secret=" ", scope="app")


# The in-memory provider


async def test_each_user_reads_only_their_own_credential() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(USER_REF, "alice-token", owner_id="alice")
    await provider.put(USER_REF, "bob-token", owner_id="bob")
    assert await provider.get(USER_REF, owner_id="alice") == "alice-token"
    assert await provider.get(USER_REF, owner_id="bob") == "bob-token"
    assert await provider.get(USER_REF, owner_id="carol") is None


async def test_the_app_credential_is_separate_from_users_credentials() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(APP_REF, "app-token", owner_id=None)
    assert await provider.get(USER_REF, owner_id="alice") is None
    assert await provider.get(APP_REF, owner_id=None) == "app-token"


async def test_a_deleted_credential_is_gone() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(USER_REF, "alice-token", owner_id="alice")
    await provider.delete(USER_REF, owner_id="alice")
    assert await provider.get(USER_REF, owner_id="alice") is None


async def test_a_user_credential_needs_an_owner() -> None:
    with pytest.raises(ValueError):
        await InMemoryCredentialProvider().get(USER_REF, owner_id=None)


async def test_an_app_credential_has_no_owner() -> None:
    with pytest.raises(ValueError):
        await InMemoryCredentialProvider().put(APP_REF, "token", owner_id="alice")


async def test_a_reference_to_another_provider_is_refused() -> None:
    with pytest.raises(ValueError):
        await InMemoryCredentialProvider().get(
            CredentialRef(provider="vault", secret="linear", scope="app"), owner_id=None
        )


# The environment provider


async def test_the_environment_provider_reads_app_credentials_under_its_prefix() -> None:
    provider = EnvironmentCredentialProvider(environ={"MCP_LINEAR": "env-token"}, prefix="MCP_")
    assert await provider.get(CredentialRef(provider="env", secret="LINEAR", scope="app"), owner_id=None) == (
        "env-token"
    )


async def test_a_missing_or_empty_environment_variable_is_no_credential() -> None:
    provider = EnvironmentCredentialProvider(environ={"EMPTY": ""})
    assert (
        await provider.get(CredentialRef(provider="env", secret="EMPTY", scope="app"), owner_id=None) is None
    )
    assert (
        await provider.get(CredentialRef(provider="env", secret="ABSENT", scope="app"), owner_id=None) is None
    )


async def test_the_environment_provider_refuses_user_credentials() -> None:
    provider = EnvironmentCredentialProvider(environ={"LINEAR": "env-token"})
    with pytest.raises(ValueError):
        await provider.get(CredentialRef(provider="env", secret="LINEAR", scope="user"), owner_id="alice")
    with pytest.raises(ValueError):
        credential_auth(
            provider=provider,
            ref=CredentialRef(provider="env", secret="LINEAR", scope="user"),
            owner="user",
            connection="Linear",
        )


async def test_the_environment_provider_is_read_only() -> None:
    provider = EnvironmentCredentialProvider(environ={})
    with pytest.raises(CredentialForbiddenError):
        await provider.put(CredentialRef(provider="env", secret="LINEAR", scope="app"), "x", owner_id=None)


# credential_auth


async def test_an_app_owned_connection_shares_the_app_credential() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(APP_REF, "app-token", owner_id=None)
    auth = credential_auth(provider=provider, ref=APP_REF, owner="app", connection="Linear")
    assert await auth(Ctx("alice")) == {"Authorization": "Bearer app-token"}
    assert await auth(Ctx(None)) == {"Authorization": "Bearer app-token"}


async def test_a_user_owned_connection_sends_the_signed_in_users_credential() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(USER_REF, "alice-token", owner_id="alice")
    await provider.put(USER_REF, "bob-token", owner_id="bob")
    auth = credential_auth(provider=provider, ref=USER_REF, owner="user", connection="Linear")
    assert await auth(Ctx("alice")) == {"Authorization": "Bearer alice-token"}
    assert await auth(Ctx("bob")) == {"Authorization": "Bearer bob-token"}


async def test_a_verified_principal_is_found_as_the_user_without_configuration() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(USER_REF, "alice-token", owner_id="alice")
    auth = credential_auth(provider=provider, ref=USER_REF, owner="user", connection="Linear")
    principal = Principal(
        id="alice",
        role="authenticated",
        email=None,
        is_anonymous=False,
        aal=None,
        session_id=None,
        tenant_id=None,
        roles=(),
        claims={},
    )
    assert await auth(principal) == {"Authorization": "Bearer alice-token"}


async def test_the_user_can_be_found_with_an_application_function() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(USER_REF, "alice-token", owner_id="alice")
    auth = credential_auth(
        provider=provider,
        ref=USER_REF,
        owner="user",
        connection="Linear",
        user=lambda context: context["sub"],
    )
    assert await auth({"sub": "alice"}) == {"Authorization": "Bearer alice-token"}


async def test_a_turn_without_a_user_needs_authorization_and_reads_nothing() -> None:
    provider = FailingProvider(RuntimeError("must not be read"))
    with pytest.raises(ConnectionAuthorizationRequiredError) as raised:
        await credential_auth(provider=provider, ref=USER_REF, owner="user", connection="Linear")(Ctx(None))
    assert (raised.value.code, raised.value.connection) == ("authorization_required", "Linear")
    assert provider.reads == 0


async def test_a_missing_credential_needs_authorization() -> None:
    auth = credential_auth(
        provider=InMemoryCredentialProvider(), ref=USER_REF, owner="user", connection="Linear"
    )
    with pytest.raises(ConnectionAuthorizationRequiredError):
        await auth(Ctx("alice"))


async def test_an_unauthorized_read_needs_authorization() -> None:
    auth = credential_auth(
        provider=FailingProvider(CredentialUnauthorizedError()),
        ref=USER_REF,
        owner="user",
        connection="Linear",
    )
    with pytest.raises(ConnectionAuthorizationRequiredError):
        await auth(Ctx("alice"))


@pytest.mark.parametrize("error", [CredentialForbiddenError(), CredentialInvalidError()])
async def test_a_forbidden_or_invalid_credential_fails_for_good(error: Exception) -> None:
    auth = credential_auth(provider=FailingProvider(error), ref=USER_REF, owner="user", connection="Linear")
    with pytest.raises(ConnectionAuthorizationFailedError) as raised:
        await auth(Ctx("alice"))
    assert raised.value.code == "authorization_failed"
    assert raised.value.retryable is False


async def test_any_other_provider_failure_is_a_generic_storage_error() -> None:
    failure = RuntimeError(f"connection to db failed, password={SECRET_VALUE}")
    auth = credential_auth(provider=FailingProvider(failure), ref=USER_REF, owner="user", connection="Linear")
    with pytest.raises(CredentialStorageError) as raised:
        await auth(Ctx("alice"))
    assert raised.value.code == "credential_storage_error"
    assert SECRET_VALUE not in str(raised.value)
    assert raised.value.__cause__ is None


async def test_a_stored_value_that_cannot_be_a_header_fails_without_showing_it() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(USER_REF, f"{SECRET_VALUE}\r\nX-Injected: 1", owner_id="alice")
    auth = credential_auth(provider=provider, ref=USER_REF, owner="user", connection="Linear")
    with pytest.raises(ConnectionAuthorizationFailedError) as raised:
        await auth(Ctx("alice"))
    assert SECRET_VALUE not in str(raised.value)


async def test_the_header_and_scheme_can_be_chosen() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(APP_REF, "key-1", owner_id=None)
    auth = credential_auth(
        provider=provider, ref=APP_REF, owner="app", connection="Search", header="X-Api-Key", scheme=None
    )
    assert await auth(Ctx(None)) == {"X-Api-Key": "key-1"}


def test_the_owner_must_match_the_references_scope() -> None:
    with pytest.raises(ValueError):
        credential_auth(provider=InMemoryCredentialProvider(), ref=APP_REF, owner="user", connection="Linear")


def test_the_reference_must_name_the_provider() -> None:
    ref = CredentialRef(provider="vault", secret="linear", scope="user")
    with pytest.raises(ValueError):
        credential_auth(provider=InMemoryCredentialProvider(), ref=ref, owner="user", connection="Linear")


async def test_neither_the_provider_nor_the_resolver_shows_a_stored_secret() -> None:
    provider = InMemoryCredentialProvider()
    await provider.put(USER_REF, SECRET_VALUE, owner_id="alice")
    assert SECRET_VALUE not in repr(provider)
    assert SECRET_VALUE not in repr(user_auth(provider))


def test_providers_satisfy_the_protocol() -> None:
    assert isinstance(InMemoryCredentialProvider(), CredentialProvider)
    assert isinstance(EnvironmentCredentialProvider(environ={}), CredentialProvider)
