"""The assistant's own request and response shapes; they validate its routes and write their OpenAPI."""

from __future__ import annotations

from typing import Literal

from bastion.api import StrictModel

__all__ = [
    "ConnectionStatus",
    "ConnectionToken",
    "DevelopmentToken",
    "DevelopmentTokenRequest",
    "DevelopmentUser",
    "Health",
    "Info",
]


class ConnectionStatus(StrictModel):
    """Whether the caller's MCP credential is stored."""

    connected: bool


class ConnectionToken(StrictModel):
    token: str


class Health(StrictModel):
    """The server is up."""

    status: Literal["ok"]


class Info(StrictModel):
    """Which model runs and how users sign in."""

    demo_model: bool
    model: str
    development_sign_in: bool


class DevelopmentTokenRequest(StrictModel):
    user: str


class DevelopmentUser(StrictModel):
    id: str
    email: str


class DevelopmentToken(StrictModel):
    """A development access token."""

    access_token: str
    token_type: Literal["bearer"]
    expires_in: int
    user: DevelopmentUser
