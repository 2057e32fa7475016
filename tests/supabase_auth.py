"""A stand-in for a Supabase project's Auth server, for the web page's sign-in tests.

It speaks the part of the Auth API that supabase-js uses from a browser, cross-origin as a real project
is: password sign-in (`/token?grant_type=password`), refresh (`grant_type=refresh_token`), magic links
(`/otp`, then `/verify` redirecting with the session in the address), anonymous sign-in (`/signup`
without an email), `/user`, `/logout`, `/settings`, and the JWKS the assistant verifies tokens with.
The first session of each password sign-in is short-lived, so supabase-js must refresh it before using
it; `/refuse-refresh` makes every later refresh fail, as for a revoked session, and later password
sign-ins give sessions that have already expired, so the next use must refresh and cannot.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jwt
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.supabase_tokens import JWKS_PATH, SigningKeys, es256, user_claims

# Inside supabase-js's refresh margin (90 s), so the first use of a new session refreshes it.
SHORT_LIFETIME = 60
LIFETIME = 3600


@dataclass
class AuthStandIn:
    """The project's users and what the stand-in saw: sign-ins, refreshes, sign-outs, sent links."""

    passwords: dict[str, str]
    keys: SigningKeys = field(default_factory=SigningKeys)
    url: str = ""
    refreshed: list[str] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)
    sign_outs: int = 0
    refuse_refresh: bool = False
    outbox: list[str] = field(default_factory=list)
    _refresh_tokens: dict[str, dict[str, Any]] = field(default_factory=dict)
    _link_tokens: dict[str, str] = field(default_factory=dict)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(JWKS_PATH, lambda request: JSONResponse(self.keys.jwks())),
                Route("/auth/v1/settings", self._settings),
                Route("/auth/v1/token", self._token, methods=["POST"]),
                Route("/auth/v1/otp", self._otp, methods=["POST"]),
                Route("/auth/v1/verify", self._verify),
                Route("/auth/v1/signup", self._signup, methods=["POST"]),
                Route("/auth/v1/user", self._user),
                Route("/auth/v1/logout", self._logout, methods=["POST"]),
                Route("/outbox", lambda request: JSONResponse({"links": self.outbox})),
                Route("/refuse-refresh", self._refuse_refresh, methods=["POST"]),
            ],
            middleware=[
                Middleware(
                    CORSMiddleware,
                    allow_origin_regex=r"http://127\.0\.0\.1:[0-9]+",
                    allow_methods=["GET", "POST"],
                    allow_headers=["*"],
                )
            ],
        )

    def _user_for(self, email: str | None) -> dict[str, Any]:
        anonymous = email is None
        return {
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, email or secrets.token_hex(8))),
            "email": email or "",
            "is_anonymous": anonymous,
            "aud": "authenticated",
            "role": "authenticated",
            "app_metadata": {"provider": "anonymous" if anonymous else "email"},
            "user_metadata": {},
        }

    def _session(self, user: dict[str, Any], lifetime: int) -> dict[str, Any]:
        now = time.time()
        token = es256(
            self.keys,
            user_claims(
                f"{self.url}/auth/v1",
                now,
                sub=user["id"],
                email=user["email"],
                is_anonymous=user["is_anonymous"],
                exp=int(now) + lifetime,
                session_id=str(uuid.uuid4()),
            ),
        )
        refresh = secrets.token_urlsafe(16)
        self._refresh_tokens[refresh] = user
        self.issued.append(token)
        return {
            "access_token": token,
            "token_type": "bearer",
            "expires_in": lifetime,
            "expires_at": int(now) + lifetime,
            "refresh_token": refresh,
            "user": user,
        }

    async def _refuse_refresh(self, request: Request) -> Response:
        """The test's switch: every refresh from now on is refused, as for a revoked session."""
        self.refuse_refresh = True
        return Response(status_code=204)

    async def _settings(self, request: Request) -> Response:
        return JSONResponse({"external": {"email": True, "anonymous_users": True}, "disable_signup": False})

    async def _token(self, request: Request) -> Response:
        body = await request.json()
        grant = request.query_params.get("grant_type")
        if grant == "password":
            email = body.get("email")
            if self.passwords.get(email) != body.get("password"):
                return _error(400, "invalid_credentials", "Invalid login credentials")
            # Once refreshes are refused, a new session is already out of date, as after a long sleep.
            lifetime = -1 if self.refuse_refresh else SHORT_LIFETIME
            return JSONResponse(self._session(self._user_for(email), lifetime))
        if grant == "refresh_token":
            user = self._refresh_tokens.pop(body.get("refresh_token"), None)
            if self.refuse_refresh:
                user = None
            if user is None:
                return _error(400, "refresh_token_not_found", "Invalid Refresh Token")
            session = self._session(user, LIFETIME)
            self.refreshed.append(session["access_token"])
            return JSONResponse(session)
        return _error(400, "validation_failed", "Unsupported grant type")

    async def _otp(self, request: Request) -> Response:
        body = await request.json()
        link_token = secrets.token_urlsafe(16)
        self._link_tokens[link_token] = body["email"]
        redirect = request.query_params.get("redirect_to") or body.get("redirect_to") or ""
        query = urlencode({"token": link_token, "type": "magiclink", "redirect_to": redirect})
        self.outbox.append(f"{self.url}/auth/v1/verify?{query}")
        return JSONResponse({})

    async def _verify(self, request: Request) -> Response:
        email = self._link_tokens.pop(request.query_params.get("token", ""), None)
        if email is None:
            return _error(403, "otp_expired", "Email link is invalid or has expired")
        session = self._session(self._user_for(email), LIFETIME)
        fragment = urlencode(
            {key: session[key] for key in ("access_token", "refresh_token", "expires_in", "expires_at")}
            | {"token_type": "bearer", "type": "magiclink"}
        )
        return RedirectResponse(f"{request.query_params['redirect_to']}#{fragment}", status_code=303)

    async def _signup(self, request: Request) -> Response:
        body = await request.json()
        if body.get("email"):
            return _error(422, "signup_disabled", "Signups not allowed for this instance")
        return JSONResponse(self._session(self._user_for(None), LIFETIME))

    async def _user(self, request: Request) -> Response:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        try:
            claims = jwt.decode(
                token, self.keys.ec.public_key(), algorithms=["ES256"], audience="authenticated"
            )
        except jwt.PyJWTError:
            return _error(401, "bad_jwt", "invalid JWT")
        user = self._user_for(claims["email"] or None)
        return JSONResponse(user | {"id": claims["sub"], "is_anonymous": claims["is_anonymous"]})

    async def _logout(self, request: Request) -> Response:
        self.sign_outs += 1
        return Response(status_code=204)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "error_code": code, "msg": message}, status_code=status)
