"""Channel adapters: each delivers its contacts' messages to one tenant's inbox, proving itself with a secret.

The tenant comes from the channel's configuration, never from the request. The bearer secret is
compared in constant time (as digests, so not even its length shows), and a request that fails the
check is refused before its body is read.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from bastion.inbox.errors import ChannelUnauthorizedError
from bastion.stores.entities import check_text

__all__ = ["InboxChannel", "InboxChannels"]

_NAME: Final = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_MIN_SECRET_LENGTH: Final = 16
RESERVED_CHANNELS: Final = frozenset({"widget"})


@dataclass(frozen=True, kw_only=True)
class InboxChannel:
    """One adapter: its `name` (in the webhook's address), the `tenant_id` it delivers to, its `secret`."""

    name: str
    tenant_id: str
    secret: str = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name) or self.name in RESERVED_CHANNELS:
            raise ValueError("A channel name is lower-case letters, digits, '-' or '_' (and not 'widget').")
        check_text(self.tenant_id)
        if not isinstance(self.secret, str) or len(self.secret) < _MIN_SECRET_LENGTH:
            raise ValueError(f"A channel secret is at least {_MIN_SECRET_LENGTH} characters.")


class InboxChannels:
    """The configured channels by name; `authenticate` finds the one a request's secret proves."""

    def __init__(self, channels: Iterable[InboxChannel] = ()) -> None:
        by_name: dict[str, InboxChannel] = {}
        for channel in channels:
            if channel.name in by_name:
                raise ValueError(f"Two channels are named {channel.name!r}.")
            by_name[channel.name] = channel
        self._channels: Mapping[str, InboxChannel] = by_name
        self._digests = {name: _digest(channel.secret) for name, channel in by_name.items()}
        # A missing channel is compared too, against a digest nothing matches, so both take as long.
        self._nothing = hashlib.sha256(b"bastion.inbox.no-channel").digest()

    def authenticate(self, name: object, secret: str | None) -> InboxChannel:
        """The channel `name` when `secret` is its secret; `ChannelUnauthorizedError` otherwise."""
        channel = self._channels.get(name) if isinstance(name, str) else None
        expected = self._digests[channel.name] if channel is not None else self._nothing
        given = _digest(secret or "")
        if not hmac.compare_digest(given, expected) or channel is None or not secret:
            raise ChannelUnauthorizedError()
        return channel


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()
