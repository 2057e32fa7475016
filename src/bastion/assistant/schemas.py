"""The assistant's own request and response shapes; they validate its routes and write their OpenAPI."""

from __future__ import annotations

from typing import Any, Literal

from bastion.api import StrictModel

__all__ = [
    "AuthConfig",
    "ConnectionStatus",
    "ConnectionToken",
    "DevelopmentAuthSettings",
    "DevelopmentAuthUser",
    "DevelopmentGrant",
    "DevelopmentGrantQuery",
    "DevelopmentSession",
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


class AuthConfig(StrictModel):
    """What the page makes its Supabase Auth client from: the project's URL and publishable key, or
    (`development`) the development Auth API on this same server, with no URL or key."""

    mode: Literal["development", "supabase"]
    url: str | None
    publishable_key: str | None


class Info(StrictModel):
    """Which model runs and how users sign in."""

    demo_model: bool
    model: str
    development_sign_in: bool
    auth: AuthConfig


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


class DevelopmentGrantQuery(StrictModel):
    grant_type: Literal["password", "refresh_token"]


class DevelopmentGrant(StrictModel):
    """What supabase-js sends to sign in with a password (the development user's `name@localhost`,
    any password) or to refresh a session."""

    email: str | None = None
    password: str | None = None
    refresh_token: str | None = None


class DevelopmentAuthUser(StrictModel):
    """A development user, as Supabase Auth describes one."""

    id: str
    aud: Literal["authenticated"]
    role: Literal["authenticated"]
    email: str
    app_metadata: dict[str, Any]
    user_metadata: dict[str, Any]
    identities: list[Any]
    is_anonymous: bool
    created_at: str


class DevelopmentSession(StrictModel):
    """A session, as Supabase Auth's token endpoint answers it."""

    access_token: str
    token_type: Literal["bearer"]
    expires_in: int
    expires_at: int
    refresh_token: str
    user: DevelopmentAuthUser


class DevelopmentAuthSettings(StrictModel):
    """Which ways in there are: email only."""

    external: dict[str, bool]
    disable_signup: bool
