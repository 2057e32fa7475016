"""A stand-in Supabase project for the run: a fresh ES256 key, its JWKS, and one user's access token."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

SUPABASE_URL = "https://bench.supabase.co"
_KID = "bench-key-1"
SUBJECT = "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"
"""The signed-in user's id (the token's `sub`)."""


@dataclass(frozen=True, slots=True)
class SigningProject:
    jwks: dict[str, Any]
    token: str


def signing_project(*, lifetime: int = 6 * 3600) -> SigningProject:
    key = ec.generate_private_key(ec.SECP256R1())
    public = {**ECAlgorithm.to_jwk(key.public_key(), as_dict=True), "kid": _KID, "alg": "ES256", "use": "sig"}
    now = int(time.time())
    claims = {
        "iss": f"{SUPABASE_URL}/auth/v1",
        "aud": "authenticated",
        "role": "authenticated",
        "sub": SUBJECT,
        "exp": now + lifetime,
        "iat": now,
        "email": "bench@example.com",
        "aal": "aal1",
        "session_id": "0b9a7c4e-5d1f-4a2b-8c3d-9e8f7a6b5c4d",
        "is_anonymous": False,
        "app_metadata": {"provider": "email", "tenant_id": "tenant-a", "roles": ["member"]},
        "user_metadata": {},
    }
    token = jwt.encode(claims, key, algorithm="ES256", headers={"kid": _KID})
    return SigningProject(jwks={"keys": [public]}, token=token)
