"""A stand-in Supabase project for tests: signing keys, a served JWKS that counts its fetches, and
user access tokens shaped like the ones Supabase issues (plus raw builders for hostile ones)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

EC_KID = "ec-key-1"
RSA_KID = "rsa-key-1"
JWT_SECRET = "legacy-jwt-secret-with-at-least-32-bytes"
JWKS_PATH = "/auth/v1/.well-known/jwks.json"


@dataclass
class SigningKeys:
    """The project's private keys; the JWKS publishes their public halves."""

    ec: ec.EllipticCurvePrivateKey = field(default_factory=lambda: ec.generate_private_key(ec.SECP256R1()))
    rsa: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    def jwks(self) -> dict[str, Any]:
        return {"keys": [ec_jwk(self.ec.public_key(), EC_KID), rsa_jwk(self.rsa.public_key(), RSA_KID)]}


def ec_jwk(public_key: ec.EllipticCurvePublicKey, kid: str) -> dict[str, Any]:
    return {**ECAlgorithm.to_jwk(public_key, as_dict=True), "kid": kid, "alg": "ES256", "use": "sig"}


def rsa_jwk(public_key: rsa.RSAPublicKey, kid: str) -> dict[str, Any]:
    return {**RSAAlgorithm.to_jwk(public_key, as_dict=True), "kid": kid, "alg": "RS256", "use": "sig"}


class JwksHost:
    """Serves a JWKS document at the Supabase path; tests change it and count fetches."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.initial = document
        self.document = document
        self.status = 200
        self.fetches = 0
        self.app = Starlette(routes=[Route(JWKS_PATH, self._jwks)])

    def reset(self) -> None:
        self.document, self.status, self.fetches = self.initial, 200, 0

    async def _jwks(self, request: Request) -> JSONResponse:
        self.fetches += 1
        return JSONResponse(self.document, status_code=self.status)


DROP: Any = object()
"""Pass as a claim override to leave the claim out."""


def user_claims(issuer: str, now: float, **overrides: Any) -> dict[str, Any]:
    """Claims of a signed-in user's access token, as Supabase issues them."""
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": "authenticated",
        "role": "authenticated",
        "sub": "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01",
        "exp": int(now) + 3600,
        "iat": int(now),
        "email": "ada@example.com",
        "phone": "",
        "aal": "aal1",
        "amr": [{"method": "password", "timestamp": int(now)}],
        "session_id": "0b9a7c4e-5d1f-4a2b-8c3d-9e8f7a6b5c4d",
        "is_anonymous": False,
        "app_metadata": {"provider": "email", "tenant_id": "tenant-a", "roles": ["member", "editor"]},
        "user_metadata": {"tenant_id": "tenant-evil", "roles": ["admin"]},
    }
    claims.update(overrides)
    return {name: value for name, value in claims.items() if value is not DROP}


def es256(keys: SigningKeys, claims: dict[str, Any], *, kid: str | None = EC_KID) -> str:
    return jwt.encode(claims, keys.ec, algorithm="ES256", headers={"kid": kid} if kid else None)


def rs256(keys: SigningKeys, claims: dict[str, Any], *, kid: str | None = RSA_KID) -> str:
    return jwt.encode(claims, keys.rsa, algorithm="RS256", headers={"kid": kid} if kid else None)


def segment(value: dict[str, Any] | list[Any] | bytes) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def hs256(header: dict[str, Any], claims: dict[str, Any], secret: bytes) -> str:
    """An HS256 token signed with any bytes as the secret (PyJWT refuses public keys as secrets)."""
    signing_input = f"{segment(header)}.{segment(claims)}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{segment(signature)}"
