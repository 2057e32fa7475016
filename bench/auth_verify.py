"""Token verification cost per request with a warm key cache, ES256, RS256 and legacy HS256.

Baseline in the same run: PyJWT's `jwt.decode` with a pre-parsed key (issuer, audience and expiry
checked), which does less than bastion (no key lookup, no role/sub checks, no principal). Prints
microseconds per verification (median of rounds) and the ratio bastion / PyJWT.

    .venv/bin/python bench/auth_verify.py
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx2
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from bastion.auth import SupabaseEnv, TokenVerifier

URL = "https://bench.supabase.co"
SECRET = "legacy-jwt-secret-with-at-least-32-bytes"
ROUNDS = 7
PER_ROUND = 2000


def claims(issuer: str) -> dict[str, Any]:
    now = int(time.time())
    return {
        "iss": issuer,
        "aud": "authenticated",
        "role": "authenticated",
        "sub": "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01",
        "exp": now + 3600,
        "iat": now,
        "email": "ada@example.com",
        "aal": "aal1",
        "session_id": "0b9a7c4e-5d1f-4a2b-8c3d-9e8f7a6b5c4d",
        "is_anonymous": False,
        "app_metadata": {"provider": "email", "tenant_id": "tenant-a", "roles": ["member"]},
        "user_metadata": {},
    }


async def bastion_us(verifier: TokenVerifier, token: str) -> float:
    """Median microseconds per `verifier.verify(token)` over the rounds."""
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(PER_ROUND):
            await verifier.verify(token)
        rounds.append((time.perf_counter() - start) / PER_ROUND * 1e6)
    return statistics.median(rounds)


def pyjwt_us(token: str, key: Any, algorithm: str, issuer: str) -> float:
    """Median microseconds per plain `jwt.decode` with the key already parsed."""
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(PER_ROUND):
            jwt.decode(token, key, algorithms=[algorithm], audience="authenticated", issuer=issuer, leeway=30)
        rounds.append((time.perf_counter() - start) / PER_ROUND * 1e6)
    return statistics.median(rounds)


async def main() -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = {
        "keys": [
            {**ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True), "kid": "ec", "alg": "ES256"},
            {**RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True), "kid": "rsa", "alg": "RS256"},
        ]
    }
    fetches = 0

    def serve_jwks(request: httpx2.Request) -> httpx2.Response:
        nonlocal fetches
        fetches += 1
        return httpx2.Response(200, json=jwks)

    env = SupabaseEnv(url=URL, jwt_secret=SECRET)
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(serve_jwks)) as http_client:
        verifier = TokenVerifier(env, http_client=http_client)
        payload = claims(env.issuer)
        cases = [
            ("ES256", jwt.encode(payload, ec_key, "ES256", headers={"kid": "ec"}), ec_key.public_key()),
            ("RS256", jwt.encode(payload, rsa_key, "RS256", headers={"kid": "rsa"}), rsa_key.public_key()),
            ("HS256", jwt.encode(payload, SECRET, "HS256"), SECRET),
        ]
        print(f"{'alg':6} {'bastion µs':>11} {'PyJWT µs':>9} {'ratio':>6}")
        for algorithm, token, key in cases:
            await verifier.verify(token)  # warm the key cache
            ours = await bastion_us(verifier, token)
            theirs = pyjwt_us(token, key, algorithm, env.issuer)
            print(f"{algorithm:6} {ours:11.1f} {theirs:9.1f} {ours / theirs:6.2f}")
    print(f"key set fetches: {fetches} (warm cache: one fetch for the whole run)")


if __name__ == "__main__":
    asyncio.run(main())
