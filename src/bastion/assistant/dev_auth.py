"""Development sign-in: a local ES256 signing key, its JWKS, and tokens shaped like Supabase's.

Used only when no Supabase project is configured, and only on loopback. Tokens are verified by the same
`TokenVerifier` as production tokens, so the application runs its real authentication path. `session`,
`refresh` and `user` answer in the shapes of Supabase Auth, so the web page signs in through supabase-js
in both modes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["DevelopmentSignIn", "InvalidSessionError", "InvalidUserNameError"]

_USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_USER_NAMESPACE = uuid.UUID("8d0f5c4e-1f49-4f0e-9a53-6a7b3c2d1e0f")
TOKEN_LIFETIME_SECONDS = 3600
REFRESH_LIFETIME_SECONDS = 30 * 24 * 3600
# A refresh token is signed by the same key but for another audience, so it is never an access token.
_REFRESH_AUDIENCE = "development-refresh"


class InvalidUserNameError(ValueError):
    """A development user name must be short and plain, since it becomes the email's local part."""

    code = "invalid_user_name"

    def __init__(self) -> None:
        super().__init__(
            "Use 1–63 letters, digits, dots, dashes or underscores, starting with a letter or digit."
        )


class InvalidSessionError(ValueError):
    """A refresh or access token that this development sign-in did not issue, or that has expired."""

    code = "invalid_session"

    def __init__(self) -> None:
        super().__init__("The session has ended. Sign in again.")


class DevelopmentSignIn:
    """Issues development tokens for `issuer`; the key lives in `data_dir` so tokens survive a restart."""

    def __init__(self, *, data_dir: Path, issuer: str) -> None:
        self.issuer = issuer
        self._key = _load_or_create_key(data_dir / "dev-signing-key.pem")
        numbers = self._key.public_key().public_numbers()
        self.kid = _b64(_sha256_prefix(numbers.x.to_bytes(32, "big") + numbers.y.to_bytes(32, "big")))
        self.jwks: dict[str, Any] = {
            "keys": [
                {
                    "kty": "EC",
                    "crv": "P-256",
                    "alg": "ES256",
                    "use": "sig",
                    "kid": self.kid,
                    "x": _b64(numbers.x.to_bytes(32, "big")),
                    "y": _b64(numbers.y.to_bytes(32, "big")),
                }
            ]
        }

    @staticmethod
    def user_id(user_name: str) -> str:
        """A stable user id for a development user name."""
        return str(uuid.uuid5(_USER_NAMESPACE, user_name.lower()))

    def issue_token(self, user_name: str, *, lifetime: int = TOKEN_LIFETIME_SECONDS) -> str:
        """A signed access token for `user_name`, with the claims Supabase puts in user tokens."""
        if not isinstance(user_name, str) or not _USER_NAME.match(user_name):
            raise InvalidUserNameError()
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "aud": "authenticated",
            "role": "authenticated",
            "sub": self.user_id(user_name),
            "email": f"{user_name.lower()}@localhost",
            "iat": now,
            "exp": now + lifetime,
            "aal": "aal1",
            "amr": [{"method": "development", "timestamp": now}],
            "session_id": str(uuid.uuid4()),
            "is_anonymous": False,
            # Development users staff the inbox, so the first session shows it (`INBOX_STAFF_ROLE`).
            "app_metadata": {"provider": "development", "roles": ["inbox_staff"]},
            "user_metadata": {"name": user_name},
        }
        return jwt.encode(claims, self._key, algorithm="ES256", headers={"kid": self.kid})

    def session(self, user_name: str) -> dict[str, Any]:
        """A session as Supabase Auth's token endpoint answers it: access and refresh token, and the user."""
        token = self.issue_token(user_name)
        now = int(time.time())
        refresh = jwt.encode(
            {
                "iss": self.issuer,
                "aud": _REFRESH_AUDIENCE,
                "sub": self.user_id(user_name),
                "name": user_name,
                "iat": now,
                "exp": now + REFRESH_LIFETIME_SECONDS,
                "jti": str(uuid.uuid4()),
            },
            self._key,
            algorithm="ES256",
            headers={"kid": self.kid},
        )
        return {
            "access_token": token,
            "token_type": "bearer",
            "expires_in": TOKEN_LIFETIME_SECONDS,
            "expires_at": now + TOKEN_LIFETIME_SECONDS,
            "refresh_token": refresh,
            "user": self.user(user_name),
        }

    def refresh(self, refresh_token: object) -> dict[str, Any]:
        """A new session for the user a refresh token was issued to."""
        claims = self._decode(refresh_token, _REFRESH_AUDIENCE)
        return self.session(str(claims.get("name")))

    def user_name(self, access_token: object) -> str:
        """The development user an access token was issued to."""
        claims = self._decode(access_token, "authenticated")
        return str((claims.get("user_metadata") or {}).get("name"))

    def user(self, user_name: str) -> dict[str, Any]:
        """The user as Supabase Auth's `/user` endpoint describes one."""
        return {
            "id": self.user_id(user_name),
            "aud": "authenticated",
            "role": "authenticated",
            "email": f"{user_name.lower()}@localhost",
            "app_metadata": {
                "provider": "development",
                "providers": ["development"],
                "roles": ["inbox_staff"],
            },
            "user_metadata": {"name": user_name},
            "identities": [],
            "is_anonymous": False,
            "created_at": "1970-01-01T00:00:00Z",
        }

    def _decode(self, token: object, audience: str) -> dict[str, Any]:
        if not isinstance(token, str) or not token:
            raise InvalidSessionError()
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._key.public_key(),
                algorithms=["ES256"],
                audience=audience,
                issuer=self.issuer,
                options={"require": ["exp", "sub", "aud", "iss"]},
            )
        except jwt.PyJWTError:
            raise InvalidSessionError() from None
        return claims


def _load_or_create_key(path: Path) -> ec.EllipticCurvePrivateKey:
    if path.exists():
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError("The development signing key is not an EC key; delete it to make a new one.")
        return loaded
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(pem)
    return key


def _sha256_prefix(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:12]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
