"""Supabase sign-in: verify a user's access token locally and turn its claims into a `Principal`.

Tokens are checked against the project's signing keys (a JWKS of ES256 or RS256 keys, fetched once and
cached as parsed key objects) or the optional legacy HS256 secret. The key decides the algorithm, never
the token. Issuer, audience, role, subject and lifetime are checked the way Supabase issues user tokens,
so a service-role or anonymous-key token is refused where a signed-in user is expected.

The subject is the user's id, a UUID, as Supabase Auth issues it and as the stores hold it (`auth.uid()`
is a uuid); a token whose `sub` is anything else is refused as `invalid_claims` on every route, so no
route can half-accept such a user. A tenant claim must likewise be a name the stores can hold: 1 to
200 characters, no NUL or unpaired surrogate.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias
from urllib.parse import urlsplit

import httpx2
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.hashes import SHA256

__all__ = [
    "AuthenticationError",
    "AuthenticationErrorCode",
    "KeySetUnavailableError",
    "Principal",
    "SupabaseEnv",
    "TokenVerifier",
    "bearer_token",
]

logger = logging.getLogger(__name__)

AuthenticationErrorCode: TypeAlias = Literal[
    "missing_token", "malformed_token", "token_expired", "invalid_signature", "invalid_claims"
]

_MESSAGES: Mapping[AuthenticationErrorCode, str] = {
    "missing_token": "Sign in to continue.",
    "malformed_token": "Sign in again.",
    "token_expired": "Your session has expired. Sign in again.",
    "invalid_signature": "Sign in again.",
    "invalid_claims": "Sign in again.",
}

_Algorithm: TypeAlias = Literal["ES256", "RS256", "HS256"]
_ASYMMETRIC: frozenset[str] = frozenset({"ES256", "RS256"})
_MAX_TOKEN_LENGTH = 16_384
_MAX_JWKS_BYTES = 1_048_576
_MIN_RSA_BITS = 2048
_MIN_SECRET_BYTES = 32
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_USER_ROLE = "authenticated"
_MAX_TENANT_LENGTH = 200


class AuthenticationError(Exception):
    """The request carries no usable user token. `code` is stable; `message` is safe to show."""

    def __init__(self, code: AuthenticationErrorCode) -> None:
        self.code: AuthenticationErrorCode = code
        self.message = _MESSAGES[code]
        super().__init__(self.message)


class KeySetUnavailableError(Exception):
    """The signing keys could not be fetched, so no token can be judged: a server fault, not the user's."""

    code = "auth_unavailable"
    message = "Sign-in cannot be checked right now. Try again."

    def __init__(self) -> None:
        super().__init__(self.message)


@dataclass(frozen=True, slots=True, kw_only=True)
class SupabaseEnv:
    """A Supabase project as the server sees it. Secrets stay out of `repr` and logs.

    `jwks` is None (fetch from the project's `/auth/v1/.well-known/jwks.json`), a URL string, or a JWKS
    document given inline. `jwt_secret` is the legacy HS256 secret, only if the project still uses it.
    `publishable_keys` and `secret_keys` are the project's API keys by name, kept for the application.

    `issuer` is the `iss` every token must carry: `<url>/auth/v1` unless given. `url` may be left out
    when the keys are given otherwise (`jwks` inline or as a URL, or `jwt_secret`); `issuer` is then
    required, so a token is never accepted from whoever happens to hold a key.
    """

    url: str | None = None
    publishable_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    secret_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    jwks: str | Mapping[str, Any] | None = None
    jwt_secret: str | None = field(default=None, repr=False)
    issuer: str | None = None

    def __post_init__(self) -> None:
        if self.url is not None:
            object.__setattr__(self, "url", _http_url(self.url, what="url").rstrip("/"))
        elif self.jwks is None and self.jwt_secret is None:
            raise ValueError(
                "SupabaseEnv needs url, or the signing keys: jwks (inline or a URL) or jwt_secret."
            )
        if self.issuer is not None:
            _http_url(self.issuer, what="issuer")
        elif self.url is not None:
            object.__setattr__(self, "issuer", f"{self.url}/auth/v1")
        else:
            raise ValueError("SupabaseEnv without url needs the issuer its tokens carry (iss).")
        object.__setattr__(self, "publishable_keys", _named_keys(self.publishable_keys, "publishable_keys"))
        object.__setattr__(self, "secret_keys", _named_keys(self.secret_keys, "secret_keys"))
        if isinstance(self.jwks, str):
            _http_url(self.jwks, what="jwks")
        elif self.jwks is not None and not isinstance(self.jwks, Mapping):
            raise TypeError("jwks must be None, a URL string or a JWKS mapping.")
        if self.jwt_secret is not None and len(self.jwt_secret.encode()) < _MIN_SECRET_BYTES:
            raise ValueError(f"jwt_secret must be at least {_MIN_SECRET_BYTES} bytes long.")

    @property
    def jwks_url(self) -> str | None:
        """Where the signing keys are fetched from; None when they were given inline (or only a secret)."""
        if isinstance(self.jwks, str):
            return self.jwks
        if self.jwks is None and self.url is not None:
            return f"{self.url}/auth/v1/.well-known/jwks.json"
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """The signed-in user, read only from verified claims.

    `tenant_id` and `roles` come from the claims the verifier was configured with (server-controlled
    `app_metadata`, never the user-editable `user_metadata`). `claims` is the verified payload, read-only
    at the top level.
    """

    id: str
    role: str
    email: str | None
    is_anonymous: bool
    aal: str | None
    session_id: str | None
    tenant_id: str | None
    roles: tuple[str, ...]
    claims: Mapping[str, Any] = field(repr=False, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class _VerificationKey:
    algorithm: _Algorithm
    key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey | bytes


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header value."""
    if not authorization:
        raise AuthenticationError("missing_token")
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError("missing_token")
    return token


class TokenVerifier:
    """Verifies Supabase user access tokens without a network call on the hot path.

    Keys are cached as parsed objects. An unknown `kid` refreshes the key set at most once per
    `refresh_interval` seconds (concurrent refreshes share one fetch); a key set older than `max_age`
    is fetched again before use. `clock` returns seconds since the epoch (for token lifetimes and both
    intervals); tests inject a fake one.
    """

    def __init__(
        self,
        env: SupabaseEnv,
        *,
        tenant_claim: str | None = "app_metadata.tenant_id",
        roles_claim: str | None = "app_metadata.roles",
        leeway: float = 30.0,
        refresh_interval: float = 60.0,
        max_age: float = 600.0,
        fetch_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
        http_client: httpx2.AsyncClient | None = None,
    ) -> None:
        if leeway < 0 or refresh_interval < 0 or max_age <= 0 or fetch_timeout <= 0:
            raise ValueError("leeway and refresh_interval must be >= 0; max_age and fetch_timeout > 0.")
        self.env = env
        self._tenant_path = _claim_path(tenant_claim, "tenant_claim")
        self._roles_path = _claim_path(roles_claim, "roles_claim")
        self._leeway = leeway
        self._refresh_interval = refresh_interval
        self._max_age = max_age
        self._fetch_timeout = fetch_timeout
        self._clock = clock
        self._http_client = http_client
        self._jwks_url = env.jwks_url
        self._legacy = (
            _VerificationKey("HS256", env.jwt_secret.encode()) if env.jwt_secret is not None else None
        )
        self._keys: dict[str, _VerificationKey] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._refresh: asyncio.Future[None] | None = None
        if isinstance(env.jwks, Mapping):
            self._keys = _parse_key_set(env.jwks)
            if not self._keys and self._legacy is None:
                raise ValueError("The JWKS holds no usable ES256 or RS256 key and there is no jwt_secret.")

    async def verify(self, token: str) -> Principal:
        """The principal of a valid user token; `AuthenticationError` otherwise."""
        if not token:
            raise AuthenticationError("missing_token")
        if len(token) > _MAX_TOKEN_LENGTH or _COMPACT_JWS.fullmatch(token) is None:
            raise AuthenticationError("malformed_token")
        header_segment, payload_segment, signature_segment = token.split(".")
        header = _json_object(header_segment)
        algorithm, kid = header.get("alg"), header.get("kid")
        if "crit" in header or not isinstance(algorithm, str) or not isinstance(kid, str | None):
            raise AuthenticationError("malformed_token")
        key = self._cached_key(algorithm, kid) or await self._fetched_key(kid)
        signing_input = f"{header_segment}.{payload_segment}".encode("ascii")
        if key.algorithm != algorithm or not _signature_matches(
            key, signing_input, _base64url(signature_segment)
        ):
            raise AuthenticationError("invalid_signature")
        claims = _json_object(payload_segment)
        self._check_claims(claims)
        return self._principal(claims)

    def _cached_key(self, algorithm: str, kid: str | None) -> _VerificationKey | None:
        """The key for this header without any I/O; None when the key set must be fetched first."""
        if algorithm == "HS256":
            # The legacy secret is the only symmetric key; a kid on such a token selects nothing else.
            if self._legacy is None:
                raise AuthenticationError("invalid_signature")
            return self._legacy
        if algorithm not in _ASYMMETRIC:
            raise AuthenticationError("invalid_signature")
        key = self._key_for(kid)
        if self._jwks_url is None:
            if key is None:
                raise AuthenticationError("invalid_signature")
            return key
        return key if self._is_fresh() else None

    def _key_for(self, kid: str | None) -> _VerificationKey | None:
        """The key a token names; a token without `kid` can only mean the key set's one and only key."""
        if kid:
            return self._keys.get(kid)
        if len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return None

    async def _fetched_key(self, kid: str | None) -> _VerificationKey:
        now = self._clock()
        may_fetch = self._attempted_at is None or now - self._attempted_at >= self._refresh_interval
        if self._refresh is not None or may_fetch:
            await self._refreshed()
        if not self._is_fresh():
            raise KeySetUnavailableError()
        key = self._key_for(kid)
        if key is None:
            raise AuthenticationError("invalid_signature")
        return key

    def _is_fresh(self) -> bool:
        return self._fetched_at is not None and self._clock() - self._fetched_at < self._max_age

    async def _refreshed(self) -> None:
        """Wait for the key set refresh, starting one unless one is already in flight."""
        if self._refresh is None:
            self._attempted_at = self._clock()
            refresh = asyncio.ensure_future(self._fetch_key_set())
            refresh.add_done_callback(self._forget_refresh)
            self._refresh = refresh
        # Shielded: a caller that goes away must not cancel the fetch the others are waiting for.
        await asyncio.shield(self._refresh)

    def _forget_refresh(self, refresh: asyncio.Future[None]) -> None:
        if self._refresh is refresh:
            self._refresh = None

    async def _fetch_key_set(self) -> None:
        url = self._jwks_url
        assert url is not None
        try:
            if self._http_client is not None:
                response = await self._http_client.get(url, timeout=self._fetch_timeout)
            else:
                async with httpx2.AsyncClient(timeout=self._fetch_timeout) as client:
                    response = await client.get(url)
            if response.status_code != 200:
                raise ValueError(f"status {response.status_code}")
            if len(response.content) > _MAX_JWKS_BYTES:
                raise ValueError("the key set is too large")
            keys = _parse_key_set(json.loads(response.content))
        except Exception:
            logger.warning("Unable to refresh the signing keys from %s.", url, exc_info=True)
            return
        if not keys:
            logger.warning("The key set at %s holds no usable ES256 or RS256 key.", url)
        self._keys = keys
        self._fetched_at = self._clock()

    def _check_claims(self, claims: Mapping[str, Any]) -> None:
        now = self._clock()
        expires = _timestamp(claims.get("exp"))
        if expires is None:
            raise AuthenticationError("invalid_claims")
        if now > expires + self._leeway:
            raise AuthenticationError("token_expired")
        for name in ("nbf", "iat"):
            if name not in claims:
                continue
            moment = _timestamp(claims[name])
            if moment is None or moment > now + self._leeway:
                raise AuthenticationError("invalid_claims")
        audience = claims.get("aud")
        audience_ok = audience == _USER_ROLE or (isinstance(audience, list) and _USER_ROLE in audience)
        subject = claims.get("sub")
        if (
            claims.get("iss") != self.env.issuer
            or not audience_ok
            or claims.get("role") != _USER_ROLE
            or not _is_user_id(subject)
        ):
            raise AuthenticationError("invalid_claims")

    def _principal(self, claims: dict[str, Any]) -> Principal:
        tenant = _claim_at(claims, self._tenant_path)
        if tenant is not None and not _is_tenant_name(tenant):
            # A tenant claim that is there but unreadable must not place the user outside any tenant.
            raise AuthenticationError("invalid_claims")
        roles = _claim_at(claims, self._roles_path)
        return Principal(
            id=claims["sub"],
            role=claims["role"],
            email=_optional_text(claims.get("email")),
            is_anonymous=claims.get("is_anonymous") is True,
            aal=_optional_text(claims.get("aal")),
            session_id=_optional_text(claims.get("session_id")),
            tenant_id=tenant,
            # Malformed roles grant nothing rather than something.
            roles=tuple(roles) if isinstance(roles, list) and all(isinstance(r, str) for r in roles) else (),
            claims=MappingProxyType(claims),
        )


def _signature_matches(key: _VerificationKey, signing_input: bytes, signature: bytes) -> bool:
    if isinstance(key.key, bytes):
        return hmac.compare_digest(hmac.digest(key.key, signing_input, "sha256"), signature)
    try:
        if isinstance(key.key, ec.EllipticCurvePublicKey):
            if len(signature) != 64:
                return False
            r, s = int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
            key.key.verify(encode_dss_signature(r, s), signing_input, ec.ECDSA(SHA256()))
        else:
            key.key.verify(signature, signing_input, padding.PKCS1v15(), SHA256())
    except InvalidSignature:
        return False
    return True


def _base64url(segment: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise AuthenticationError("malformed_token") from None


def _json_object(segment: str) -> dict[str, Any]:
    try:
        value = json.loads(_base64url(segment))
    except (ValueError, RecursionError):
        raise AuthenticationError("malformed_token") from None
    if not isinstance(value, dict):
        raise AuthenticationError("malformed_token")
    return value


def _timestamp(value: Any) -> float | None:
    """A NumericDate claim as seconds, or None when it is not a finite number."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


def _is_user_id(value: Any) -> bool:
    """A UUID in its 36-character form, the only kind of subject Supabase Auth issues."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _is_tenant_name(value: Any) -> bool:
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_TENANT_LENGTH or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _optional_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _claim_at(claims: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = claims
    for part in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value if path else None


def _claim_path(claim: str | None, what: str) -> tuple[str, ...]:
    if claim is None:
        return ()
    path = tuple(claim.split("."))
    if not all(path):
        raise ValueError(f"{what} must be a dotted claim path such as 'app_metadata.tenant_id'.")
    if path[0] == "user_metadata":
        raise ValueError(f"{what} must not read user_metadata: users can edit it.")
    return path


def _parse_key_set(document: Any) -> dict[str, _VerificationKey]:
    """Parse a JWKS once into verification keys by kid; unusable entries are skipped.

    A key without `kid` is kept under "" (so only a token without `kid` can use it, and only while it
    is the set's one key); a second key without `kid`, or a repeated `kid`, is skipped.
    """
    if not isinstance(document, Mapping) or not isinstance(document.get("keys"), list):
        raise ValueError("A JWKS is an object with a 'keys' list.")
    keys: dict[str, _VerificationKey] = {}
    for jwk in document["keys"]:
        kid = jwk.get("kid", "") if isinstance(jwk, Mapping) else None
        if not isinstance(kid, str) or kid in keys:
            continue
        try:
            key = _parse_jwk(jwk)
        except (KeyError, TypeError, ValueError, binascii.Error):
            key = None
        if key is None:
            logger.info("Skipping signing key %r: not a public ES256 (P-256) or RS256 key.", kid)
            continue
        keys[kid] = key
    return keys


def _parse_jwk(jwk: Mapping[str, Any]) -> _VerificationKey | None:
    if jwk.get("use", "sig") != "sig" or "d" in jwk:
        return None
    kty, algorithm = jwk.get("kty"), jwk.get("alg")
    if kty == "EC" and jwk.get("crv") == "P-256" and algorithm in (None, "ES256"):
        x, y = _jwk_bytes(jwk["x"]), _jwk_bytes(jwk["y"])
        if len(x) != 32 or len(y) != 32:
            return None
        numbers = ec.EllipticCurvePublicNumbers(_uint(x), _uint(y), ec.SECP256R1())
        return _VerificationKey("ES256", numbers.public_key())
    if kty == "RSA" and algorithm in (None, "RS256"):
        public_key = rsa.RSAPublicNumbers(
            _uint(_jwk_bytes(jwk["e"])), _uint(_jwk_bytes(jwk["n"]))
        ).public_key()
        return _VerificationKey("RS256", public_key) if public_key.key_size >= _MIN_RSA_BITS else None
    return None


def _jwk_bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError("JWK members are base64url strings.")
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


def _uint(data: bytes) -> int:
    return int.from_bytes(data, "big")


def _http_url(value: str, *, what: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(f"{what} must be an http(s) URL without query or fragment.")
    return value


def _named_keys(keys: Mapping[str, str], what: str) -> Mapping[str, str]:
    if not all(isinstance(name, str) and isinstance(key, str) and key for name, key in keys.items()):
        raise ValueError(f"{what} maps names to non-empty key strings.")
    return MappingProxyType(dict(keys))
