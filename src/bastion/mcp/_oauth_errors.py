"""The refusals of a connection's OAuth steps: one class per stable code, messages that name no secret."""

from __future__ import annotations

from typing import ClassVar

from bastion.errors import BastionError


class McpOAuthError(BastionError):
    """An OAuth step of an MCP connection was refused; subclasses say which."""

    code: ClassVar[str] = "authorization_failed"
    status: ClassVar[int] = 400


class OAuthConnectionNotFoundError(McpOAuthError):
    code: ClassVar[str] = "connection_not_found"
    status: ClassVar[int] = 404


class AuthorizationStateInvalidError(McpOAuthError):
    """No pending authorization of the caller's has this state: never started, another user's, or used."""

    code: ClassVar[str] = "authorization_state_invalid"


class AuthorizationStateExpiredError(McpOAuthError):
    code: ClassVar[str] = "authorization_state_expired"


class AuthorizationDeniedError(McpOAuthError):
    """The user cancelled, or the authorization server refused them."""

    code: ClassVar[str] = "authorization_denied"


class AuthorizationCodeRefusedError(McpOAuthError):
    """The token endpoint refused the code (a wrong PKCE verifier, a used or foreign code)."""

    code: ClassVar[str] = "authorization_code_refused"


class AuthorizationIssuerMismatchError(McpOAuthError):
    """The answer names an issuer other than the authorization server discovered (RFC 9207)."""

    code: ClassVar[str] = "authorization_issuer_mismatch"


class AuthorizationResourceMismatchError(McpOAuthError):
    """The tokens were issued for another resource than the MCP server (RFC 8707)."""

    code: ClassVar[str] = "authorization_resource_mismatch"


class AuthorizationNotNeededError(McpOAuthError):
    code: ClassVar[str] = "authorization_not_needed"
    status: ClassVar[int] = 409


class AuthorizationUnavailableError(McpOAuthError):
    """The server's authorization could not be discovered, or it could not be reached; details are logged."""

    code: ClassVar[str] = "authorization_unavailable"
    status: ClassVar[int] = 502
