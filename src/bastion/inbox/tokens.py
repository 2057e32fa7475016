"""Contact tokens: what the application signs to let a web widget speak for one contact in one conversation.

A token is `<payload>.<mac>`, both base64url: the payload names the tenant, the contact, the
conversation and the expiry; the mac is HMAC-SHA256 under the application's secret, over a label that
no other bastion token uses, so a contact token is never a user's session and the reverse. It is checked
in constant time, and nothing in it is trusted before the check.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable
from typing import Final

from bastion.inbox.errors import ContactTokenError
from bastion.inbox.principal import ContactPrincipal
from bastion.stores.errors import InvalidInputError

__all__ = ["ContactTokens"]

_LABEL: Final = b"bastion.inbox.contact.v1\x00"
_MIN_SECRET_BYTES: Final = 32
_MAX_TOKEN_LENGTH: Final = 2048
_SHAPE: Final = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


class ContactTokens:
    """Signs and verifies contact tokens with `secret` (at least 32 bytes); each lives `lifetime` seconds."""

    def __init__(
        self, secret: bytes, *, lifetime: float = 86_400.0, clock: Callable[[], float] = time.time
    ) -> None:
        if not isinstance(secret, bytes) or len(secret) < _MIN_SECRET_BYTES:
            raise ValueError(f"A contact token secret is at least {_MIN_SECRET_BYTES} bytes.")
        if lifetime <= 0:
            raise ValueError("lifetime must be positive.")
        self._key = hashlib.sha256(_LABEL + secret).digest()
        self._lifetime = lifetime
        self._clock = clock

    def issue(self, contact: ContactPrincipal) -> str:
        """A token for `contact`'s conversation, valid for the configured lifetime."""
        payload = json.dumps(
            {
                "tenant": contact.tenant_id,
                "contact": contact.contact_id,
                "conversation": contact.conversation_id,
                "exp": int(self._clock() + self._lifetime),
            },
            separators=(",", ":"),
        ).encode()
        encoded = _encode(payload)
        return f"{encoded}.{_encode(self._mac(encoded))}"

    def verify(self, token: object) -> ContactPrincipal:
        """The contact a valid token names; `ContactTokenError` for anything else."""
        if not isinstance(token, str) or len(token) > _MAX_TOKEN_LENGTH or not _SHAPE.fullmatch(token):
            raise ContactTokenError()
        encoded, mac = token.split(".")
        if not hmac.compare_digest(_decode(mac), self._mac(encoded)):
            raise ContactTokenError()
        try:
            claims = json.loads(_decode(encoded))
            expires = claims["exp"]
            if type(expires) is not int or expires < self._clock():
                raise ContactTokenError()
            return ContactPrincipal(
                tenant_id=claims["tenant"],
                contact_id=claims["contact"],
                conversation_id=claims["conversation"],
            )
        except (ValueError, KeyError, TypeError, InvalidInputError):
            raise ContactTokenError() from None

    def _mac(self, encoded_payload: str) -> bytes:
        return hmac.digest(self._key, encoded_payload.encode("ascii"), "sha256")


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _decode(segment: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise ContactTokenError() from None
