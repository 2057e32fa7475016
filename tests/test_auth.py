"""Supabase token verification: what is accepted, every way a token is refused, and the key cache."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bastion.auth import (
    AuthenticationError,
    KeySetUnavailableError,
    SupabaseEnv,
    TokenVerifier,
    bearer_token,
)
from tests.live_server import live_server
from tests.supabase_tokens import (
    DROP,
    EC_KID,
    JWT_SECRET,
    RSA_KID,
    JwksHost,
    SigningKeys,
    ec_jwk,
    es256,
    hs256,
    rs256,
    rsa_jwk,
    segment,
    user_claims,
)

NOW = 1_800_000_000.0


class FakeClock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def keys() -> SigningKeys:
    return SigningKeys()


@pytest.fixture(scope="module")
def served(keys: SigningKeys) -> Iterator[tuple[JwksHost, str]]:
    host = JwksHost(keys.jwks())
    with live_server(host.app) as url:
        yield host, url


@pytest.fixture
def host(served: tuple[JwksHost, str]) -> JwksHost:
    served[0].reset()
    return served[0]


@pytest.fixture
def env(served: tuple[JwksHost, str]) -> SupabaseEnv:
    return SupabaseEnv(url=served[1])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def verifier(env: SupabaseEnv, host: JwksHost, clock: FakeClock) -> TokenVerifier:
    return TokenVerifier(env, clock=clock)


def claims(env: SupabaseEnv, **overrides: Any) -> dict[str, Any]:
    return user_claims(env.issuer, NOW, **overrides)


async def refused(verifier: TokenVerifier, token: str) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as caught:
        await verifier.verify(token)
    return caught.value


# Accepted tokens


async def test_es256_token_gives_the_principal_of_its_claims(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    principal = await verifier.verify(es256(keys, claims(env)))

    assert principal.id == "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"
    assert principal.email == "ada@example.com"
    assert principal.role == "authenticated"
    assert principal.is_anonymous is False
    assert principal.aal == "aal1"
    assert principal.session_id == "0b9a7c4e-5d1f-4a2b-8c3d-9e8f7a6b5c4d"
    assert principal.tenant_id == "tenant-a"
    assert principal.roles == ("member", "editor")
    assert principal.claims["amr"][0]["method"] == "password"


async def test_rs256_token_verifies(verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys) -> None:
    principal = await verifier.verify(rs256(keys, claims(env)))

    assert principal.id == "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"


async def test_legacy_hs256_token_verifies_with_the_jwt_secret(served: tuple[JwksHost, str]) -> None:
    env = SupabaseEnv(url=served[1], jwt_secret=JWT_SECRET)
    verifier = TokenVerifier(env, clock=FakeClock())
    token = hs256({"alg": "HS256", "typ": "JWT"}, claims(env), JWT_SECRET.encode())

    assert (await verifier.verify(token)).id == "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"


async def test_anonymous_sign_in_is_a_principal_marked_anonymous(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    token = es256(keys, claims(env, is_anonymous=True, email=DROP))

    principal = await verifier.verify(token)

    assert principal.is_anonymous is True
    assert principal.email is None


async def test_audience_list_containing_authenticated_is_accepted(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    token = es256(keys, claims(env, aud=["authenticated", "other"]))

    assert (await verifier.verify(token)).role == "authenticated"


async def test_expiry_within_the_leeway_is_accepted(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    token = es256(keys, claims(env, exp=int(NOW) - 20))

    assert (await verifier.verify(token)).id


async def test_expiry_beyond_the_leeway_is_refused(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    token = es256(keys, claims(env, exp=int(NOW) - 31))

    assert (await refused(verifier, token)).code == "token_expired"


# Hostile and malformed tokens

Mint = Callable[[SigningKeys, SupabaseEnv], str]
OTHER_EC = ec.generate_private_key(ec.SECP256R1())


def rsa_public_pem(keys: SigningKeys) -> bytes:
    return keys.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def with_header(token: str, header: dict[str, Any] | list[Any] | bytes) -> str:
    _, payload, signature = token.split(".")
    return f"{segment(header)}.{payload}.{signature}"


def with_claims(token: str, new_claims: dict[str, Any]) -> str:
    header, _, signature = token.split(".")
    return f"{header}.{segment(new_claims)}.{signature}"


def with_signature(token: str, change: Callable[[bytes], bytes]) -> str:
    header, payload, signature = token.split(".")
    raw = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
    return f"{header}.{payload}.{segment(change(raw))}"


def der_signature(raw: bytes) -> bytes:
    """The same ES256 signature as ASN.1 DER, which JWS does not allow (RFC 7518 §3.4)."""
    return encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))


HOSTILE: dict[str, tuple[Mint, str]] = {
    "alg none with kid": (
        lambda k, e: f"{segment({'alg': 'none', 'kid': EC_KID})}.{segment(claims(e))}.",
        "malformed_token",
    ),
    "alg none with signature": (
        lambda k, e: f"{segment({'alg': 'none', 'kid': EC_KID})}.{segment(claims(e))}.AAAA",
        "invalid_signature",
    ),
    "HS256 signed with the RSA public key": (
        lambda k, e: hs256({"alg": "HS256", "kid": RSA_KID}, claims(e), rsa_public_pem(k)),
        "invalid_signature",
    ),
    "HS256 signed with the public key, no kid": (
        lambda k, e: hs256({"alg": "HS256"}, claims(e), rsa_public_pem(k)),
        "invalid_signature",
    ),
    "unknown kid": (lambda k, e: es256(k, claims(e), kid="not-a-project-key"), "invalid_signature"),
    "no kid on an ES256 token": (lambda k, e: es256(k, claims(e), kid=None), "invalid_signature"),
    "ES256 header on the RSA key": (
        lambda k, e: with_header(rs256(k, claims(e)), {"alg": "ES256", "kid": RSA_KID}),
        "invalid_signature",
    ),
    "RS256 header on the EC key": (
        lambda k, e: with_header(es256(k, claims(e)), {"alg": "RS256", "kid": EC_KID}),
        "invalid_signature",
    ),
    "signed by another key under the project's kid": (
        lambda k, e: es256(SigningKeys(ec=OTHER_EC, rsa=k.rsa), claims(e)),
        "invalid_signature",
    ),
    "payload changed after signing": (
        lambda k, e: with_claims(es256(k, claims(e)), claims(e, sub="someone-else")),
        "invalid_signature",
    ),
    "expired": (lambda k, e: es256(k, claims(e, exp=int(NOW) - 3600)), "token_expired"),
    "wrong issuer": (
        lambda k, e: es256(k, claims(e, iss="https://other.supabase.co/auth/v1")),
        "invalid_claims",
    ),
    "issuer without /auth/v1": (lambda k, e: es256(k, claims(e, iss=e.url)), "invalid_claims"),
    "wrong audience": (lambda k, e: es256(k, claims(e, aud="anon")), "invalid_claims"),
    "audience list without authenticated": (
        lambda k, e: es256(k, claims(e, aud=["other"])),
        "invalid_claims",
    ),
    "service role": (lambda k, e: es256(k, claims(e, role="service_role")), "invalid_claims"),
    "anon role": (lambda k, e: es256(k, claims(e, role="anon", aud="anon")), "invalid_claims"),
    "empty sub": (lambda k, e: es256(k, claims(e, sub="")), "invalid_claims"),
    "blank sub": (lambda k, e: es256(k, claims(e, sub="   ")), "invalid_claims"),
    "missing sub": (lambda k, e: es256(k, claims(e, sub=DROP)), "invalid_claims"),
    "non-string sub": (lambda k, e: es256(k, claims(e, sub=42)), "invalid_claims"),
    # The stores hold user ids as UUIDs (auth.uid() is a uuid): any other subject is refused everywhere.
    "third-party style sub": (lambda k, e: es256(k, claims(e, sub="user_2abcDEF")), "invalid_claims"),
    "UUID without hyphens": (
        lambda k, e: es256(k, claims(e, sub="7f1c1c4e1b0a4f399d386a1c2b7e9a01")),
        "invalid_claims",
    ),
    "UUID in braces": (
        lambda k, e: es256(k, claims(e, sub="{7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01}")),
        "invalid_claims",
    ),
    "missing exp": (lambda k, e: es256(k, claims(e, exp=DROP)), "invalid_claims"),
    "string exp": (lambda k, e: es256(k, claims(e, exp=str(int(NOW) + 60))), "invalid_claims"),
    "huge exp": (lambda k, e: es256(k, claims(e, exp=10**400)), "invalid_claims"),
    "boolean exp": (lambda k, e: es256(k, claims(e, exp=True)), "invalid_claims"),
    "boolean nbf": (lambda k, e: es256(k, claims(e, nbf=True)), "invalid_claims"),
    "boolean iat": (lambda k, e: es256(k, claims(e, iat=False)), "invalid_claims"),
    "infinite exp": (lambda k, e: es256(k, claims(e, exp=math.inf)), "invalid_claims"),
    "NaN exp": (lambda k, e: es256(k, claims(e, exp=math.nan)), "invalid_claims"),
    "null nbf": (lambda k, e: es256(k, claims(e, nbf=None)), "invalid_claims"),
    "ES256 signature with a zero byte slipped in before s": (
        lambda k, e: with_signature(es256(k, claims(e)), lambda raw: raw[:32] + b"\x00" + raw[32:]),
        "invalid_signature",
    ),
    "ES256 signature DER-encoded": (
        lambda k, e: with_signature(es256(k, claims(e)), der_signature),
        "invalid_signature",
    ),
    "kid that is not text": (
        lambda k, e: signed({"alg": "ES256", "kid": 5}, claims(e), ecdsa_p256(k.ec)),
        "malformed_token",
    ),
    "alg that is not text": (
        lambda k, e: signed({"alg": 256, "kid": EC_KID}, claims(e), ecdsa_p256(k.ec)),
        "malformed_token",
    ),
    "header of an impossible base64 length": (lambda k, e: "abcde.abcd.abcd", "malformed_token"),
    "nbf in the future": (lambda k, e: es256(k, claims(e, nbf=int(NOW) + 600)), "invalid_claims"),
    "iat in the future": (lambda k, e: es256(k, claims(e, iat=int(NOW) + 600)), "invalid_claims"),
    "truncated": (lambda k, e: es256(k, claims(e))[:-20], "invalid_signature"),
    "two segments": (lambda k, e: es256(k, claims(e)).rsplit(".", 1)[0], "malformed_token"),
    "four segments": (lambda k, e: es256(k, claims(e)) + ".AAAA", "malformed_token"),
    "non-JSON header": (lambda k, e: with_header(es256(k, claims(e)), b"not json"), "malformed_token"),
    "header is a JSON array": (lambda k, e: with_header(es256(k, claims(e)), [EC_KID]), "malformed_token"),
    "non-JSON payload": (
        lambda k, e: es256(k, claims(e)).split(".")[0] + "." + segment(b"\xff\xfe") + ".AAAA",
        "invalid_signature",
    ),
    "crit header": (
        lambda k, e: with_header(es256(k, claims(e)), {"alg": "ES256", "kid": EC_KID, "crit": ["exp"]}),
        "malformed_token",
    ),
    "not base64url": (lambda k, e: "eyJ+/=.eyJ.sig", "malformed_token"),
    "oversized": (lambda k, e: "a" * 20_000 + ".b.c", "malformed_token"),
    "a publishable API key": (lambda k, e: "sb_publishable_abc123", "malformed_token"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
async def test_hostile_token_is_refused_with_its_code(
    case: str, verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    mint, code = HOSTILE[case]
    token = mint(keys, env)

    error = await refused(verifier, token)

    assert error.code == code
    assert token not in str(error) and token not in error.message


def signed(header: dict[str, Any], payload: dict[str, Any], sign: Callable[[bytes], bytes]) -> str:
    """A compact JWS over any header, signed by `sign`: for tokens PyJWT refuses to make."""
    signing_input = f"{segment(header)}.{segment(payload)}"
    return f"{signing_input}.{segment(sign(signing_input.encode()))}"


def ecdsa_p256(key: ec.EllipticCurvePrivateKey) -> Callable[[bytes], bytes]:
    def sign(data: bytes) -> bytes:
        r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    return sign


def rsa_pkcs1(key: rsa.RSAPrivateKey) -> Callable[[bytes], bytes]:
    return lambda data: key.sign(data, padding.PKCS1v15(), hashes.SHA256())


async def test_a_correctly_signed_token_made_by_hand_verifies(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    es = signed({"alg": "ES256", "kid": EC_KID}, claims(env), ecdsa_p256(keys.ec))
    rs = signed({"alg": "RS256", "kid": RSA_KID}, claims(env), rsa_pkcs1(keys.rsa))

    assert (await verifier.verify(es)).role == (await verifier.verify(rs)).role == "authenticated"


@pytest.mark.parametrize(
    ("header", "signer"),
    [
        ({"alg": "RS256", "kid": EC_KID}, lambda k: ecdsa_p256(k.ec)),
        ({"alg": "ES256", "kid": RSA_KID}, lambda k: rsa_pkcs1(k.rsa)),
    ],
    ids=["RS256-header-signed-by-the-EC-key", "ES256-header-signed-by-the-RSA-key"],
)
async def test_the_key_pins_the_algorithm_even_when_its_own_signature_is_valid(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, header: dict[str, Any], signer: Any
) -> None:
    token = signed(header, claims(env), signer(keys))

    assert (await refused(verifier, token)).code == "invalid_signature"


@pytest.mark.parametrize("label", ["PS256", "RS384", "ES256"])
async def test_an_rsa_key_published_for_another_algorithm_verifies_nothing(
    keys: SigningKeys, label: str
) -> None:
    document = {
        "keys": [
            ec_jwk(keys.ec.public_key(), EC_KID),
            {**rsa_jwk(keys.rsa.public_key(), "rsa-other"), "alg": label},
            rsa_jwk(keys.rsa.public_key(), RSA_KID),
        ]
    }
    env = SupabaseEnv(url="https://example.supabase.co", jwks=document)
    verifier = TokenVerifier(env, clock=FakeClock())

    assert (await verifier.verify(rs256(keys, claims(env)))).role == "authenticated"
    assert (await refused(verifier, rs256(keys, claims(env), kid="rsa-other"))).code == "invalid_signature"


@pytest.mark.parametrize("algorithm", ["RS512", "PS256", "ES384", "EdDSA"])
async def test_an_unsupported_algorithm_is_refused_without_fetching_keys(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, algorithm: str
) -> None:
    token = signed({"alg": algorithm, "kid": "not-a-project-key"}, claims(env), rsa_pkcs1(keys.rsa))

    assert (await refused(verifier, token)).code == "invalid_signature"
    assert host.fetches == 0


async def test_public_key_as_hmac_secret_is_refused_even_with_a_legacy_secret(
    served: tuple[JwksHost, str], keys: SigningKeys
) -> None:
    env = SupabaseEnv(url=served[1], jwt_secret=JWT_SECRET)
    verifier = TokenVerifier(env, clock=FakeClock())
    token = hs256({"alg": "HS256"}, claims(env), rsa_public_pem(keys))

    assert (await refused(verifier, token)).code == "invalid_signature"


async def test_hs256_token_is_refused_when_the_project_has_no_legacy_secret(
    verifier: TokenVerifier, env: SupabaseEnv
) -> None:
    token = hs256({"alg": "HS256", "typ": "JWT"}, claims(env), JWT_SECRET.encode())

    assert (await refused(verifier, token)).code == "invalid_signature"


async def test_empty_token_is_missing(verifier: TokenVerifier) -> None:
    assert (await refused(verifier, "")).code == "missing_token"


# Identity claims


async def test_tenant_and_roles_never_come_from_user_metadata(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    token = es256(keys, claims(env, app_metadata={"provider": "email"}))

    principal = await verifier.verify(token)

    assert principal.tenant_id is None
    assert principal.roles == ()


async def test_tenant_and_roles_claims_are_configurable(
    env: SupabaseEnv, host: JwksHost, keys: SigningKeys
) -> None:
    verifier = TokenVerifier(env, tenant_claim="org", roles_claim="app_metadata.groups", clock=FakeClock())
    token = es256(keys, claims(env, org="tenant-b", app_metadata={"groups": ["billing"]}))

    principal = await verifier.verify(token)

    assert (principal.tenant_id, principal.roles) == ("tenant-b", ("billing",))


@pytest.mark.parametrize(
    "tenant", [42, "", ["acme"], {"id": "acme"}, True, "t" * 201, "nul\x00", "lone \ud800"], ids=repr
)
async def test_a_tenant_claim_that_is_not_a_name_is_refused_not_taken_as_no_tenant(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, tenant: Any
) -> None:
    token = es256(keys, claims(env, app_metadata={"tenant_id": tenant}))

    with pytest.raises(AuthenticationError) as refused:
        await verifier.verify(token)

    assert refused.value.code == "invalid_claims"


async def test_a_null_tenant_claim_is_no_tenant(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    principal = await verifier.verify(es256(keys, claims(env, app_metadata={"tenant_id": None})))

    assert principal.tenant_id is None


def test_claims_under_user_metadata_are_refused_as_configuration(env: SupabaseEnv) -> None:
    with pytest.raises(ValueError, match="user_metadata"):
        TokenVerifier(env, roles_claim="user_metadata.roles")


async def test_malformed_roles_claim_grants_no_roles(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    token = es256(keys, claims(env, app_metadata={"roles": ["member", {"admin": True}]}))

    assert (await verifier.verify(token)).roles == ()


async def test_principal_claims_are_read_only(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    principal = await verifier.verify(es256(keys, claims(env)))

    with pytest.raises(TypeError):
        principal.claims["sub"] = "someone-else"  # type: ignore[index]


# The key cache


async def test_signing_keys_are_fetched_once_and_reused(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost
) -> None:
    for _ in range(5):
        await verifier.verify(es256(keys, claims(env)))
        await verifier.verify(rs256(keys, claims(env)))

    assert host.fetches == 1


async def test_concurrent_first_verifications_share_one_fetch(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost
) -> None:
    token = es256(keys, claims(env))

    principals = await asyncio.gather(*(verifier.verify(token) for _ in range(20)))

    assert len(principals) == 20
    assert host.fetches == 1


async def test_unknown_kid_refreshes_at_most_once_per_interval(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    await verifier.verify(es256(keys, claims(env)))
    stranger = es256(keys, claims(env), kid="rotated-key")

    for _ in range(5):
        await refused(verifier, stranger)
    fetches_within_interval = host.fetches
    clock.now += 61
    await refused(verifier, es256(keys, claims(env, exp=int(clock.now) + 60), kid="rotated-key"))

    assert fetches_within_interval == 1
    assert host.fetches == 2


async def test_concurrent_unknown_kids_share_one_refresh(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    await verifier.verify(es256(keys, claims(env)))
    clock.now += 61
    stranger = es256(keys, claims(env, exp=int(clock.now) + 60), kid="rotated-key")

    results = await asyncio.gather(*(verifier.verify(stranger) for _ in range(20)), return_exceptions=True)

    assert all(isinstance(result, AuthenticationError) for result in results)
    assert host.fetches == 2


async def test_rotated_in_key_is_picked_up_by_a_refresh_after_the_interval(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    await verifier.verify(es256(keys, claims(env)))
    new_key = ec.generate_private_key(ec.SECP256R1())
    host.document = {"keys": [*keys.jwks()["keys"], ec_jwk(new_key.public_key(), "ec-key-2")]}
    clock.now += 61

    principal = await verifier.verify(
        es256(SigningKeys(ec=new_key, rsa=keys.rsa), claims(env), kid="ec-key-2")
    )

    assert principal.id
    assert host.fetches == 2


async def test_key_set_older_than_max_age_is_fetched_again(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    await verifier.verify(es256(keys, claims(env)))
    clock.now += 601

    await verifier.verify(es256(keys, claims(env, exp=int(clock.now) + 60)))

    assert host.fetches == 2


async def test_removed_key_stops_verifying_once_the_key_set_ages(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    await verifier.verify(es256(keys, claims(env)))
    host.document = {"keys": [rsa_jwk(keys.rsa.public_key(), RSA_KID)]}
    clock.now += 601

    error = await refused(verifier, es256(keys, claims(env, exp=int(clock.now) + 60)))

    assert error.code == "invalid_signature"


async def test_unreachable_key_set_is_a_server_fault_not_a_bad_token(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost
) -> None:
    host.status = 503

    with pytest.raises(KeySetUnavailableError):
        await verifier.verify(es256(keys, claims(env)))


async def test_failed_fetch_is_not_retried_within_the_interval(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    host.status = 503
    for _ in range(3):
        with pytest.raises(KeySetUnavailableError):
            await verifier.verify(es256(keys, claims(env)))
    host.status = 200
    clock.now += 61

    await verifier.verify(es256(keys, claims(env, exp=int(clock.now) + 60)))

    assert host.fetches == 2


async def test_inline_key_set_is_used_without_fetching(
    served: tuple[JwksHost, str], keys: SigningKeys, host: JwksHost
) -> None:
    env = SupabaseEnv(url=served[1], jwks=keys.jwks())
    verifier = TokenVerifier(env, clock=FakeClock())

    await verifier.verify(rs256(keys, claims(env)))

    assert host.fetches == 0


ISSUER = "https://auth.example.com/auth/v1"


def one_key_env(jwk: dict[str, Any], **fields: Any) -> SupabaseEnv:
    return SupabaseEnv(jwks={"keys": [jwk]}, issuer=ISSUER, **fields)


@pytest.mark.parametrize("kid", [None, ""], ids=["no-kid", "empty-kid"])
async def test_a_token_without_kid_verifies_with_the_one_inline_key(
    keys: SigningKeys, kid: str | None
) -> None:
    env = one_key_env(ec_jwk(keys.ec.public_key(), EC_KID))
    verifier = TokenVerifier(env, clock=FakeClock())
    header = {"alg": "ES256"} if kid is None else {"alg": "ES256", "kid": kid}

    principal = await verifier.verify(signed(header, claims(env), ecdsa_p256(keys.ec)))

    assert principal.id == "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"


async def test_the_one_inline_key_still_pins_its_algorithm(keys: SigningKeys) -> None:
    env = one_key_env(rsa_jwk(keys.rsa.public_key(), RSA_KID))
    verifier = TokenVerifier(env, clock=FakeClock())

    assert (await verifier.verify(rs256(keys, claims(env), kid=None))).role == "authenticated"
    forged = signed({"alg": "ES256"}, claims(env), rsa_pkcs1(keys.rsa))
    assert (await refused(verifier, forged)).code == "invalid_signature"
    other = signed({"alg": "ES256"}, claims(env), ecdsa_p256(keys.ec))
    assert (await refused(verifier, other)).code == "invalid_signature"


async def test_an_inline_key_without_kid_serves_only_tokens_without_kid(keys: SigningKeys) -> None:
    jwk = ec_jwk(keys.ec.public_key(), EC_KID)
    del jwk["kid"]
    env = one_key_env(jwk)
    verifier = TokenVerifier(env, clock=FakeClock())

    assert (await verifier.verify(es256(keys, claims(env), kid=None))).role == "authenticated"
    assert (await refused(verifier, es256(keys, claims(env)))).code == "invalid_signature"


async def test_with_two_keys_a_token_without_kid_is_refused_even_when_one_key_has_no_kid(
    keys: SigningKeys,
) -> None:
    kidless = ec_jwk(keys.ec.public_key(), EC_KID)
    del kidless["kid"]
    env = SupabaseEnv(jwks={"keys": [kidless, rsa_jwk(keys.rsa.public_key(), RSA_KID)]}, issuer=ISSUER)
    verifier = TokenVerifier(env, clock=FakeClock())

    assert (await refused(verifier, es256(keys, claims(env), kid=None))).code == "invalid_signature"
    assert (await verifier.verify(rs256(keys, claims(env)))).role == "authenticated"


async def test_a_token_without_kid_verifies_with_the_one_fetched_key(keys: SigningKeys) -> None:
    host = JwksHost({"keys": [ec_jwk(keys.ec.public_key(), EC_KID)]})
    with live_server(host.app) as url:
        env = SupabaseEnv(url=url)
        verifier = TokenVerifier(env, clock=FakeClock())

        principal = await verifier.verify(es256(keys, claims(env), kid=None))

    assert principal.role == "authenticated"
    assert host.fetches == 1


async def test_without_url_the_given_issuer_is_the_one_tokens_must_carry(keys: SigningKeys) -> None:
    env = one_key_env(ec_jwk(keys.ec.public_key(), EC_KID))
    verifier = TokenVerifier(env, clock=FakeClock())

    assert env.url is None and env.jwks_url is None and env.issuer == ISSUER
    assert (await verifier.verify(es256(keys, claims(env)))).role == "authenticated"
    other = user_claims("https://other.example.com/auth/v1", NOW)
    assert (await refused(verifier, es256(keys, other))).code == "invalid_claims"


async def test_a_legacy_secret_alone_needs_no_url(served: tuple[JwksHost, str]) -> None:
    env = SupabaseEnv(jwt_secret=JWT_SECRET, issuer=ISSUER)
    verifier = TokenVerifier(env, clock=FakeClock())

    assert env.jwks_url is None
    token = hs256({"alg": "HS256"}, claims(env), JWT_SECRET.encode())
    assert (await verifier.verify(token)).role == "authenticated"


def test_an_issuer_given_with_the_url_replaces_the_derived_one() -> None:
    env = SupabaseEnv(url="https://example.supabase.co", issuer=ISSUER)

    assert env.issuer == ISSUER
    assert env.jwks_url == "https://example.supabase.co/auth/v1/.well-known/jwks.json"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({}, "needs url, or the signing keys"),
        ({"issuer": ISSUER}, "needs url, or the signing keys"),
        ({"jwks": {"keys": []}}, "needs the issuer"),
        ({"jwks": "https://auth.example.com/jwks.json"}, "needs the issuer"),
        ({"jwt_secret": JWT_SECRET}, "needs the issuer"),
        ({"jwt_secret": JWT_SECRET, "issuer": "auth.example.com"}, "issuer must be an http"),
    ],
)
def test_an_env_that_cannot_name_its_issuer_and_keys_is_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SupabaseEnv(**fields)


def test_key_set_entries_that_are_not_public_signing_keys_are_skipped(keys: SigningKeys) -> None:
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    document = {
        "keys": [
            rsa_jwk(weak.public_key(), "weak"),
            {**ec_jwk(keys.ec.public_key(), "private"), "d": "AAAA"},
            {**ec_jwk(keys.ec.public_key(), "encryption"), "use": "enc"},
            {"kty": "oct", "kid": "symmetric", "k": segment(JWT_SECRET.encode())},
            {**ec_jwk(keys.ec.public_key(), "labelled-rs256"), "alg": "RS256"},
        ]
    }

    with pytest.raises(ValueError, match="no usable"):
        TokenVerifier(SupabaseEnv(url="https://example.supabase.co", jwks=document))


# Configuration


def test_env_repr_hides_keys_and_secrets() -> None:
    env = SupabaseEnv(
        url="https://example.supabase.co/",
        publishable_keys={"default": "sb_publishable_visible_nowhere"},
        secret_keys={"default": "sb_secret_visible_nowhere"},
        jwt_secret=JWT_SECRET,
    )

    assert "visible_nowhere" not in repr(env) and JWT_SECRET not in repr(env)
    assert env.secret_keys["default"] == "sb_secret_visible_nowhere"


def test_env_derives_issuer_and_key_set_address_from_the_project_url() -> None:
    env = SupabaseEnv(url="https://example.supabase.co/")

    assert env.issuer == "https://example.supabase.co/auth/v1"
    assert env.jwks_url == "https://example.supabase.co/auth/v1/.well-known/jwks.json"


def test_short_legacy_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="jwt_secret"):
        SupabaseEnv(url="https://example.supabase.co", jwt_secret="short")


@pytest.mark.parametrize("header", [None, "", "Basic dXNlcjpwYXNz", "Bearer", "Bearer   "])
def test_authorization_without_a_bearer_token_is_missing(header: str | None) -> None:
    with pytest.raises(AuthenticationError) as caught:
        bearer_token(header)

    assert caught.value.code == "missing_token"


def test_bearer_scheme_is_case_insensitive() -> None:
    assert bearer_token("bearer abc.def.ghi") == "abc.def.ghi"


# Boundaries and messages a mutation review found unpinned


def test_errors_carry_their_safe_message() -> None:
    assert str(AuthenticationError("missing_token")) == "Sign in to continue."
    assert str(KeySetUnavailableError()) == "Sign-in cannot be checked right now. Try again."


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({}, ValueError, "SupabaseEnv needs url, or the signing keys: jwks (inline or a URL) or jwt_secret."),
        (
            {"jwt_secret": JWT_SECRET},
            ValueError,
            "SupabaseEnv without url needs the issuer its tokens carry (iss).",
        ),
        (
            {"url": "ftp://example.supabase.co"},
            ValueError,
            "url must be an http(s) URL without query or fragment.",
        ),
        ({"url": "https:///no-host"}, ValueError, "url must be an http(s) URL without query or fragment."),
        (
            {"url": "https://example.supabase.co?a=1"},
            ValueError,
            "url must be an http(s) URL without query or fragment.",
        ),
        (
            {"url": "https://example.supabase.co#f"},
            ValueError,
            "url must be an http(s) URL without query or fragment.",
        ),
        (
            {"url": "https://x.co", "jwks": "keys.json"},
            ValueError,
            "jwks must be an http(s) URL without query or fragment.",
        ),
        ({"url": "https://x.co", "jwks": 5}, TypeError, "jwks must be None, a URL string or a JWKS mapping."),
        (
            {"url": "https://x.co", "publishable_keys": {"default": ""}},
            ValueError,
            "publishable_keys maps names to non-empty key strings.",
        ),
        (
            {"url": "https://x.co", "publishable_keys": {"default": 5}},
            ValueError,
            "publishable_keys maps names to non-empty key strings.",
        ),
        (
            {"url": "https://x.co", "secret_keys": {5: "sb_secret"}},
            ValueError,
            "secret_keys maps names to non-empty key strings.",
        ),
    ],
)
def test_each_unusable_env_is_refused_with_what_to_fix(
    fields: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error) as raised:
        SupabaseEnv(**fields)
    assert str(raised.value) == message


def test_env_keeps_its_api_keys_read_only_and_its_url_without_trailing_slashes() -> None:
    env = SupabaseEnv(url="https://example.com/projX/", publishable_keys={"default": "sb_publishable_1"})

    assert env.url == "https://example.com/projX"
    assert dict(env.publishable_keys) == {"default": "sb_publishable_1"}
    with pytest.raises(TypeError):
        env.publishable_keys["other"] = "x"  # type: ignore[index]


def test_a_legacy_secret_of_exactly_the_minimum_length_is_accepted() -> None:
    assert SupabaseEnv(url="https://example.supabase.co", jwt_secret="s" * 32).jwt_secret == "s" * 32


def test_bearer_token_takes_everything_after_the_scheme() -> None:
    assert bearer_token("Bearer  a.b.c ") == "a.b.c"


VERIFIER_LIMITS = "leeway and refresh_interval must be >= 0; max_age and fetch_timeout > 0."


@pytest.mark.parametrize(
    "limits",
    [{"leeway": -1}, {"refresh_interval": -1}, {"max_age": 0}, {"fetch_timeout": 0}],
)
def test_verifier_limits_out_of_range_are_refused(env: SupabaseEnv, limits: dict[str, float]) -> None:
    with pytest.raises(ValueError) as raised:
        TokenVerifier(env, **limits)
    assert str(raised.value) == VERIFIER_LIMITS


def test_verifier_limits_at_their_bounds_are_accepted(env: SupabaseEnv) -> None:
    TokenVerifier(env, leeway=0, refresh_interval=0, max_age=1, fetch_timeout=1)
    TokenVerifier(env, max_age=0.5, fetch_timeout=0.5)


@pytest.mark.parametrize("name", ["tenant_claim", "roles_claim"])
def test_a_claim_path_with_an_empty_segment_is_refused_by_name(env: SupabaseEnv, name: str) -> None:
    with pytest.raises(ValueError) as raised:
        TokenVerifier(env, **{name: "app_metadata..tenant_id"})
    assert str(raised.value) == f"{name} must be a dotted claim path such as 'app_metadata.tenant_id'."


def test_an_inline_key_set_without_a_keys_list_is_refused() -> None:
    for document in ({"keys": {}}, {"keys": "abc"}, {"kty": "EC"}):
        with pytest.raises(ValueError) as raised:
            TokenVerifier(SupabaseEnv(jwks=document, issuer=ISSUER))  # type: ignore[arg-type]
        assert str(raised.value) == "A JWKS is an object with a 'keys' list."


def test_an_inline_key_set_without_a_usable_key_is_refused_with_its_reason(keys: SigningKeys) -> None:
    with pytest.raises(ValueError) as raised:
        TokenVerifier(SupabaseEnv(jwks={"keys": []}, issuer=ISSUER))
    assert str(raised.value) == "The JWKS holds no usable ES256 or RS256 key and there is no jwt_secret."


async def test_unusable_entries_are_skipped_and_logged_and_the_rest_still_verify(
    keys: SigningKeys, caplog: pytest.LogCaptureFixture
) -> None:
    broken = {**ec_jwk(keys.ec.public_key(), "broken"), "x": 5}
    no_use = ec_jwk(keys.ec.public_key(), EC_KID)
    del no_use["use"]
    document = {"keys": ["not a key", {"kid": 5}, broken, no_use, rsa_jwk(keys.rsa.public_key(), RSA_KID)]}
    with caplog.at_level("INFO", logger="bastion.auth"):
        verifier = TokenVerifier(SupabaseEnv(jwks=document, issuer=ISSUER), clock=FakeClock())
    env = verifier.env

    assert (await verifier.verify(es256(keys, claims(env)))).role == "authenticated"
    assert (await verifier.verify(rs256(keys, claims(env)))).role == "authenticated"
    assert (await refused(verifier, es256(keys, claims(env), kid="broken"))).code == "invalid_signature"
    assert [r.getMessage() for r in caplog.records if r.name == "bastion.auth"] == [
        "Skipping signing key 'broken': not a public ES256 (P-256) or RS256 key."
    ]


async def test_the_first_key_under_a_kid_is_the_one_kept(keys: SigningKeys) -> None:
    document = {"keys": [ec_jwk(keys.ec.public_key(), EC_KID), ec_jwk(OTHER_EC.public_key(), EC_KID)]}
    verifier = TokenVerifier(SupabaseEnv(jwks=document, issuer=ISSUER), clock=FakeClock())
    env = verifier.env

    assert (await verifier.verify(es256(keys, claims(env)))).role == "authenticated"
    impostor = es256(SigningKeys(ec=OTHER_EC, rsa=keys.rsa), claims(env))
    assert (await refused(verifier, impostor)).code == "invalid_signature"


def test_an_ec_key_with_a_coordinate_not_given_in_full_32_bytes_is_skipped() -> None:
    short = next(
        key
        for key in (ec.generate_private_key(ec.SECP256R1()) for _ in range(5000))
        if key.public_key().public_numbers().x < 2**248
    )
    jwk = ec_jwk(short.public_key(), "short-x")
    x = short.public_key().public_numbers().x.to_bytes(31, "big")
    jwk["x"] = base64.urlsafe_b64encode(x).rstrip(b"=").decode()

    with pytest.raises(ValueError, match="no usable"):
        TokenVerifier(SupabaseEnv(jwks={"keys": [jwk]}, issuer=ISSUER))


async def test_email_and_other_optional_texts_that_are_empty_or_not_text_are_none(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    principal = await verifier.verify(es256(keys, claims(env, email="", aal=5, session_id=None)))

    assert (principal.email, principal.aal, principal.session_id) == (None, None, None)


async def test_without_tenant_or_roles_claims_the_principal_has_neither(
    env: SupabaseEnv, host: JwksHost, keys: SigningKeys
) -> None:
    verifier = TokenVerifier(env, tenant_claim=None, roles_claim=None, clock=FakeClock())

    principal = await verifier.verify(es256(keys, claims(env)))

    assert (principal.tenant_id, principal.roles) == (None, ())


async def test_a_token_of_exactly_the_maximum_length_is_read(keys: SigningKeys) -> None:
    env = one_key_env(ec_jwk(keys.ec.public_key(), EC_KID))
    verifier = TokenVerifier(env, clock=FakeClock())
    exact = next(
        token
        for kid in (EC_KID, None)  # base64 cannot reach every length: two header sizes cover them all
        for size in range(11_500, 12_000)
        if len(token := es256(keys, claims(env, pad="x" * size), kid=kid)) == 16_384
    )

    assert (await verifier.verify(exact)).role == "authenticated"
    longer = es256(keys, claims(env, pad="x" * 12_400))
    assert len(longer) > 16_384
    assert (await refused(verifier, longer)).code == "malformed_token"


async def test_lifetimes_exactly_at_the_leeway_are_accepted(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys
) -> None:
    token = es256(keys, claims(env, exp=int(NOW) - 30, nbf=int(NOW) + 30, iat=int(NOW) + 30))

    assert (await verifier.verify(token)).role == "authenticated"


async def test_a_known_key_is_used_from_the_cache_after_the_refresh_interval(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    await verifier.verify(es256(keys, claims(env)))
    clock.now += 300

    await verifier.verify(es256(keys, claims(env, exp=int(clock.now) + 60)))

    assert host.fetches == 1


async def test_the_default_refresh_interval_allows_a_refresh_after_exactly_sixty_seconds(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    await verifier.verify(es256(keys, claims(env)))
    clock.now += 60

    await refused(verifier, es256(keys, claims(env, exp=int(clock.now) + 60), kid="rotated-key"))

    assert host.fetches == 2


async def test_the_default_key_set_is_stale_after_exactly_six_hundred_seconds(
    verifier: TokenVerifier, env: SupabaseEnv, keys: SigningKeys, host: JwksHost, clock: FakeClock
) -> None:
    await verifier.verify(es256(keys, claims(env)))
    clock.now += 600

    await verifier.verify(es256(keys, claims(env, exp=int(clock.now) + 60)))

    assert host.fetches == 2


async def test_an_injected_http_client_fetches_the_keys(keys: SigningKeys) -> None:
    requested: list[str] = []

    def serve(request: httpx2.Request) -> httpx2.Response:
        requested.append(str(request.url))
        return httpx2.Response(200, json={"keys": [ec_jwk(keys.ec.public_key(), EC_KID)]})

    env = SupabaseEnv(jwks="https://keys.example/jwks.json", issuer=ISSUER)
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(serve)) as client:
        verifier = TokenVerifier(env, clock=FakeClock(), http_client=client)
        principal = await verifier.verify(es256(keys, claims(env)))

    assert principal.role == "authenticated"
    assert requested == ["https://keys.example/jwks.json"]


def held_key_set(released: threading.Event) -> Starlette:
    """A key set host that does not answer until the test is over."""

    async def hold(request: Request) -> JSONResponse:
        while not released.is_set():
            await asyncio.sleep(0.01)
        return JSONResponse({"keys": []})

    return Starlette(routes=[Route("/jwks.json", hold)])


@pytest.mark.parametrize("injected", [False, True], ids=["own-client", "injected-client-without-timeout"])
async def test_a_key_set_that_never_arrives_is_given_up_after_the_fetch_timeout(
    keys: SigningKeys, injected: bool
) -> None:
    released = threading.Event()
    with live_server(held_key_set(released)) as url:
        env = SupabaseEnv(jwks=f"{url}/jwks.json", issuer=ISSUER)
        try:
            async with httpx2.AsyncClient(timeout=None) as client:
                verifier = TokenVerifier(
                    env, clock=FakeClock(), fetch_timeout=0.2, http_client=client if injected else None
                )
                with pytest.raises(KeySetUnavailableError):
                    await asyncio.wait_for(verifier.verify(es256(keys, claims(env))), timeout=30)
        finally:
            released.set()


async def test_a_failed_fetch_is_logged_with_its_cause(
    verifier: TokenVerifier,
    env: SupabaseEnv,
    keys: SigningKeys,
    host: JwksHost,
    caplog: pytest.LogCaptureFixture,
) -> None:
    host.status = 503
    with caplog.at_level("WARNING", logger="bastion.auth"), pytest.raises(KeySetUnavailableError):
        await verifier.verify(es256(keys, claims(env)))

    [record] = [r for r in caplog.records if r.name == "bastion.auth"]
    assert record.getMessage() == f"Unable to refresh the signing keys from {env.jwks_url}."
    assert record.exc_info is not None and str(record.exc_info[1]) == "status 503"


def sized_key_set(keys: SigningKeys, size: int) -> bytes:
    document = {"keys": [ec_jwk(keys.ec.public_key(), EC_KID)], "pad": ""}
    base = len(json.dumps(document).encode())
    document["pad"] = "x" * (size - base)
    body = json.dumps(document).encode()
    assert len(body) == size
    return body


@pytest.mark.parametrize(("size", "accepted"), [(1_048_576, True), (1_048_577, False)])
async def test_a_key_set_is_read_up_to_one_mebibyte(
    keys: SigningKeys, size: int, accepted: bool, caplog: pytest.LogCaptureFixture
) -> None:
    body = sized_key_set(keys, size)
    env = SupabaseEnv(jwks="https://keys.example/jwks.json", issuer=ISSUER)
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=body))
    async with httpx2.AsyncClient(transport=transport) as client:
        verifier = TokenVerifier(env, clock=FakeClock(), http_client=client)
        with caplog.at_level("WARNING", logger="bastion.auth"):
            if accepted:
                assert (await verifier.verify(es256(keys, claims(env)))).role == "authenticated"
            else:
                with pytest.raises(KeySetUnavailableError):
                    await verifier.verify(es256(keys, claims(env)))
    causes = [str(r.exc_info[1]) for r in caplog.records if r.name == "bastion.auth" and r.exc_info]
    assert causes == ([] if accepted else ["the key set is too large"])


async def test_a_fetched_key_set_without_a_usable_key_is_logged_and_only_then(
    keys: SigningKeys, caplog: pytest.LogCaptureFixture
) -> None:
    documents = [{"keys": [ec_jwk(keys.ec.public_key(), EC_KID)]}, {"keys": []}]
    env = SupabaseEnv(jwks="https://keys.example/jwks.json", issuer=ISSUER)
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, json=documents.pop(0)))
    clock = FakeClock()
    async with httpx2.AsyncClient(transport=transport) as client:
        verifier = TokenVerifier(env, clock=clock, http_client=client)
        with caplog.at_level("WARNING", logger="bastion.auth"):
            await verifier.verify(es256(keys, claims(env)))
            assert [r for r in caplog.records if r.name == "bastion.auth"] == []
            clock.now += 601
            await refused(verifier, es256(keys, claims(env, exp=int(clock.now) + 60)))

    assert [r.getMessage() for r in caplog.records if r.name == "bastion.auth"] == [
        "The key set at https://keys.example/jwks.json holds no usable ES256 or RS256 key."
    ]
