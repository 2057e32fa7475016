"""The authenticated worker, served by uvicorn and called over HTTP: route declarations, bearer
verification before application code, JSON errors, body limits, CORS, and disconnect cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from bastion.auth import SupabaseEnv, TokenVerifier
from bastion.history import AgentHistoryConflictError, AgentMessagesInvalidError
from bastion.stores import ConversationBusyError, TurnConflictError
from bastion.worker import RequestContext, RequestFailure, Route, create_agent_worker
from tests.live_server import live_server
from tests.supabase_tokens import JwksHost, SigningKeys, es256, user_claims

ORIGIN = "https://app.example"
WAIT = 10.0


class Recorder:
    """What the handlers saw, written in the server thread and read by the test."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.authorize_calls: list[str] = []
        self.started = threading.Event()
        self.handler_cancelled = threading.Event()
        self.stream_finished = threading.Event()
        self.stream_saw_cancel = False
        self.background_finished = threading.Event()
        self.cancel_after_response: bool | None = None


recorder = Recorder()


async def whoami(request: Request, context: RequestContext) -> Response:
    principal = context.principal
    assert principal is not None
    return JSONResponse({"id": principal.id, "tenant": principal.tenant_id, "roles": list(principal.roles)})


async def public(request: Request, context: RequestContext) -> Response:
    return JSONResponse({"principal": context.principal})


async def item(request: Request, context: RequestContext) -> Response:
    return JSONResponse({"params": dict(context.params)})


async def echo(request: Request, context: RequestContext) -> Response:
    return JSONResponse({"received": len(await request.body()), "json": (await request.json())["n"]})


def guard(request: Request, context: RequestContext) -> Any:
    verdict = context.params["verdict"]
    recorder.authorize_calls.append(verdict)
    if verdict == "teapot":
        raise HTTPException(status_code=418, detail="Not a coffee pot.")
    if verdict == "crash":
        raise RuntimeError("authorize failed")
    return {"allow": None, "deny": False, "response": JSONResponse({"code": "pay"}, status_code=402)}[verdict]


async def guarded(request: Request, context: RequestContext) -> Response:
    return JSONResponse({"ok": True})


async def conflict(request: Request, context: RequestContext) -> Response:
    raise HTTPException(status_code=409, detail="The chat changed. Reload it.")


async def crash(request: Request, context: RequestContext) -> Response:
    raise RuntimeError("database password=hunter2 at db.internal")


async def not_a_response(request: Request, context: RequestContext) -> Any:
    return {"plain": "dict"}


async def wait_for_disconnect(request: Request, context: RequestContext) -> Response:
    recorder.started.set()
    await context.cancel.wait()
    recorder.handler_cancelled.set()
    return JSONResponse({"late": True})


async def stream(request: Request, context: RequestContext) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        try:
            yield b"first\n"
            await context.cancel.wait()
            yield b"after cancel\n"
        finally:
            recorder.stream_saw_cancel = context.cancel.is_set()
            recorder.stream_finished.set()

    return StreamingResponse(chunks(), media_type="text/plain")


async def quick(request: Request, context: RequestContext) -> Response:
    async def after_response() -> None:
        # Let the worker see the end of the exchange before looking at the signal.
        for _ in range(20):
            await asyncio.sleep(0)
        recorder.cancel_after_response = context.cancel.is_set()
        recorder.background_finished.set()

    return JSONResponse({"quick": True}, background=BackgroundTask(after_response))


ROUTES = [
    Route(method="GET", path="/whoami", auth="user", handler=whoami),
    Route(method="POST", path="/whoami", auth="user", handler=whoami),
    Route(method="GET", path="/public", auth="none", handler=public),
    Route(method="GET", path="/items/{item_id}", auth="user", handler=item),
    Route(method="POST", path="/echo", auth="user", handler=echo),
    Route(method="GET", path="/guarded/{verdict}", auth="user", handler=guarded, authorize=guard),
    Route(method="GET", path="/conflict", auth="user", handler=conflict),
    Route(method="GET", path="/crash", auth="none", handler=crash),
    Route(method="GET", path="/not-a-response", auth="none", handler=not_a_response),
    Route(method="GET", path="/wait", auth="user", handler=wait_for_disconnect),
    Route(method="GET", path="/stream", auth="user", handler=stream),
    Route(method="GET", path="/quick", auth="none", handler=quick),
]
CORS = Middleware(
    CORSMiddleware, allow_origins=[ORIGIN], allow_methods=["GET", "POST"], allow_headers=["authorization"]
)


@pytest.fixture(scope="module")
def keys() -> SigningKeys:
    return SigningKeys()


@pytest.fixture(scope="module")
def jwks(keys: SigningKeys) -> Iterator[str]:
    host = JwksHost(keys.jwks())
    with live_server(host.app) as url:
        yield url


@pytest.fixture(scope="module")
def env(jwks: str) -> SupabaseEnv:
    return SupabaseEnv(url=jwks, publishable_keys={"default": "sb_publishable_x"})


@pytest.fixture(scope="module")
def worker_url(env: SupabaseEnv) -> Iterator[str]:
    app = create_agent_worker(env=env, routes=ROUTES, middleware=[CORS], max_body_bytes=1024)
    with live_server(app) as url:
        yield url


@pytest.fixture
async def client(worker_url: str) -> AsyncIterator[httpx2.AsyncClient]:
    recorder.reset()
    async with httpx2.AsyncClient(base_url=worker_url, trust_env=False) as client:
        yield client


@pytest.fixture
def token(env: SupabaseEnv, keys: SigningKeys) -> str:
    return es256(keys, user_claims(env.issuer, time.time()))


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def served_once(app: Any, method: str, path: str, **kwargs: Any) -> httpx2.Response:
    with live_server(app) as url:
        async with httpx2.AsyncClient(base_url=url, trust_env=False) as client:
            return await client.request(method, path, **kwargs)


async def handler(request: Request, context: RequestContext) -> Response:
    return JSONResponse({})


# Route declarations


def test_route_without_auth_fails_at_construction() -> None:
    with pytest.raises(TypeError, match="auth"):
        Route(method="GET", path="/x", handler=handler)  # type: ignore[call-arg]


@pytest.mark.parametrize("auth", [None, "", "public", "USER", "service_role"])
def test_route_with_an_undeclared_auth_mode_fails_at_construction(auth: Any) -> None:
    with pytest.raises(ValueError, match="auth"):
        Route(method="GET", path="/x", auth=auth, handler=handler)


def test_route_declared_twice_fails_at_construction(env: SupabaseEnv) -> None:
    twice = [Route(method="GET", path="/x", auth="none", handler=handler)] * 2

    with pytest.raises(ValueError, match="twice"):
        create_agent_worker(env=env, routes=twice)


def test_verifier_of_another_project_fails_at_construction(env: SupabaseEnv) -> None:
    other = TokenVerifier(SupabaseEnv(url="https://other.supabase.co"))

    with pytest.raises(ValueError, match="same SupabaseEnv"):
        create_agent_worker(env=env, routes=[], verifier=other)


# Authentication


async def test_user_route_without_a_token_is_401_missing_token(client: httpx2.AsyncClient) -> None:
    response = await client.get("/whoami")

    assert response.status_code == 401
    assert response.json() == {"code": "missing_token", "message": "Sign in to continue."}
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("claims", "code"),
    [({"exp": 1_000}, "token_expired"), ({"role": "service_role"}, "invalid_claims")],
)
async def test_user_route_with_a_refused_token_is_401_with_its_code(
    client: httpx2.AsyncClient, env: SupabaseEnv, keys: SigningKeys, claims: dict[str, Any], code: str
) -> None:
    token = es256(keys, user_claims(env.issuer, time.time(), **claims))

    response = await client.get("/whoami", headers=bearer(token))

    assert response.status_code == 401
    assert response.json()["code"] == code
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert token not in response.text


async def test_forged_signature_is_401_invalid_signature(client: httpx2.AsyncClient, token: str) -> None:
    header, payload, _ = token.split(".")
    forged = f"{header}.{payload}.{'A' * 86}"

    response = await client.get("/whoami", headers=bearer(forged))

    assert (response.status_code, response.json()["code"]) == (401, "invalid_signature")


async def test_garbage_token_is_401_malformed_token(client: httpx2.AsyncClient) -> None:
    response = await client.get("/whoami", headers=bearer("not-a-jwt"))

    assert (response.status_code, response.json()["code"]) == (401, "malformed_token")


async def test_two_authorization_headers_are_refused(client: httpx2.AsyncClient, token: str) -> None:
    headers = [("authorization", f"Bearer {token}"), ("authorization", "Bearer other.token.here")]

    response = await client.get("/whoami", headers=headers)

    assert (response.status_code, response.json()["code"]) == (401, "malformed_token")


async def test_handler_receives_the_verified_principal(client: httpx2.AsyncClient, token: str) -> None:
    response = await client.get("/whoami", headers=bearer(token))

    assert response.json() == {
        "id": "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01",
        "tenant": "tenant-a",
        "roles": ["member", "editor"],
    }


async def test_handler_receives_route_parameters(client: httpx2.AsyncClient, token: str) -> None:
    response = await client.get("/items/chat-42", headers=bearer(token))

    assert response.json() == {"params": {"item_id": "chat-42"}}


async def test_public_route_serves_without_a_token_and_without_a_principal(
    client: httpx2.AsyncClient,
) -> None:
    response = await client.get("/public")

    assert (response.status_code, response.json()) == (200, {"principal": None})


async def test_expired_or_missing_keys_service_is_503(keys: SigningKeys, jwks: str) -> None:
    env = SupabaseEnv(url=jwks, jwks=f"{jwks}/nowhere/jwks.json")
    app = create_agent_worker(env=env, routes=ROUTES)
    token = es256(keys, user_claims(env.issuer, time.time()))

    response = await served_once(app, "GET", "/whoami", headers=bearer(token))

    assert (response.status_code, response.json()["code"]) == (503, "auth_unavailable")


# Authorization


async def test_authorize_runs_only_after_the_token_is_verified(client: httpx2.AsyncClient) -> None:
    response = await client.get("/guarded/allow", headers=bearer("not.a.token"))

    assert response.status_code == 401
    assert recorder.authorize_calls == []


async def test_authorize_returning_none_lets_the_handler_run(client: httpx2.AsyncClient, token: str) -> None:
    response = await client.get("/guarded/allow", headers=bearer(token))

    assert (response.status_code, response.json()) == (200, {"ok": True})


async def test_authorize_returning_false_is_403(client: httpx2.AsyncClient, token: str) -> None:
    response = await client.get("/guarded/deny", headers=bearer(token))

    assert (response.status_code, response.json()["code"]) == (403, "forbidden")


async def test_authorize_raising_an_http_exception_keeps_its_status(
    client: httpx2.AsyncClient, token: str
) -> None:
    response = await client.get("/guarded/teapot", headers=bearer(token))

    assert (response.status_code, response.json()["message"]) == (418, "Not a coffee pot.")


async def test_authorize_returning_a_response_sends_it(client: httpx2.AsyncClient, token: str) -> None:
    response = await client.get("/guarded/response", headers=bearer(token))

    assert (response.status_code, response.json()) == (402, {"code": "pay"})


async def test_authorize_failing_denies_with_a_generic_500(client: httpx2.AsyncClient, token: str) -> None:
    response = await client.get("/guarded/crash", headers=bearer(token))

    assert response.status_code == 500
    assert "authorize failed" not in response.text


# Errors


async def test_unknown_path_is_404_json(client: httpx2.AsyncClient) -> None:
    response = await client.get("/nowhere")

    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


async def test_wrong_method_is_405_json_listing_the_allowed_methods(
    client: httpx2.AsyncClient, token: str
) -> None:
    response = await client.delete("/whoami", headers=bearer(token))

    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"
    assert response.headers["allow"] == "GET, HEAD, POST"


async def test_head_is_served_by_the_get_handler(client: httpx2.AsyncClient) -> None:
    response = await client.head("/public")

    assert (response.status_code, response.content) == (200, b"")


async def test_http_exception_from_a_handler_keeps_its_status_and_message(
    client: httpx2.AsyncClient, token: str
) -> None:
    response = await client.get("/conflict", headers=bearer(token))

    assert response.status_code == 409
    assert response.json() == {"code": "conflict", "message": "The chat changed. Reload it."}


async def test_unhandled_error_is_a_generic_500_and_is_logged(
    client: httpx2.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="bastion.worker"):
        response = await client.get("/crash")

    assert response.status_code == 500
    assert response.json() == {"code": "internal", "message": "Unable to complete the request. Try again."}
    assert any(record.exc_info and "hunter2" in str(record.exc_info[1]) for record in caplog.records)


async def test_handler_returning_a_non_response_is_a_500(client: httpx2.AsyncClient) -> None:
    response = await client.get("/not-a-response")

    assert (response.status_code, response.json()["code"]) == (500, "internal")


async def test_custom_on_error_formats_every_error(env: SupabaseEnv) -> None:
    def on_error(request: Request, failure: RequestFailure) -> Response:
        return JSONResponse(
            {"error": {"type": failure.code}}, status_code=failure.status, headers=dict(failure.headers)
        )

    app = create_agent_worker(env=env, routes=ROUTES, on_error=on_error)

    response = await served_once(app, "GET", "/whoami")

    assert (response.status_code, response.json()) == (401, {"error": {"type": "missing_token"}})
    assert response.headers["www-authenticate"] == "Bearer"


async def test_custom_on_error_formats_not_found(env: SupabaseEnv) -> None:
    async def on_error(request: Request, failure: RequestFailure) -> Response:
        return JSONResponse({"error": failure.code}, status_code=failure.status)

    app = create_agent_worker(env=env, routes=ROUTES, on_error=on_error)

    response = await served_once(app, "GET", "/nowhere")

    assert (response.status_code, response.json()) == (404, {"error": "not_found"})


async def test_failing_on_error_falls_back_to_the_generic_500(env: SupabaseEnv) -> None:
    def on_error(request: Request, failure: RequestFailure) -> Response:
        raise RuntimeError("formatter bug")

    app = create_agent_worker(env=env, routes=ROUTES, on_error=on_error)

    response = await served_once(app, "GET", "/whoami")

    assert (response.status_code, response.json()["code"]) == (500, "internal")


# Request bodies


async def test_body_within_the_limit_reaches_the_handler(client: httpx2.AsyncClient, token: str) -> None:
    response = await client.post("/echo", headers=bearer(token), json={"n": 7, "pad": "x" * 500})

    assert response.status_code == 200
    assert response.json()["json"] == 7


async def test_declared_body_over_the_limit_is_413(client: httpx2.AsyncClient, token: str) -> None:
    response = await client.post("/echo", headers=bearer(token), content=b"x" * 2048)

    assert response.status_code == 413
    assert response.json() == {
        "code": "body_too_large",
        "message": "The request body is too large: this server takes at most 1 KB.",
    }


async def test_streamed_body_over_the_limit_is_413(client: httpx2.AsyncClient, token: str) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"x" * 600

    response = await client.post("/echo", headers=bearer(token), content=chunks())

    assert response.status_code == 413
    assert response.json()["code"] == "body_too_large"
    assert "at most 1 KB" in response.json()["message"]


async def test_body_of_an_unauthenticated_request_is_refused_before_its_size_matters(
    client: httpx2.AsyncClient,
) -> None:
    response = await client.post("/echo", content=b"x" * 2048)

    assert response.status_code == 401


# CORS


async def test_cors_preflight_is_answered_by_the_middleware(client: httpx2.AsyncClient) -> None:
    response = await client.options(
        "/whoami",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization",
        },
    )

    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ORIGIN


async def test_cors_headers_are_on_error_responses_too(client: httpx2.AsyncClient) -> None:
    response = await client.get("/whoami", headers={"origin": ORIGIN})

    assert response.status_code == 401
    assert response.headers["access-control-allow-origin"] == ORIGIN


async def test_cors_refuses_other_origins(client: httpx2.AsyncClient) -> None:
    response = await client.options(
        "/whoami", headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
    )

    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers


# Disconnects


async def test_client_disconnect_sets_cancel_while_the_handler_works(
    client: httpx2.AsyncClient, token: str
) -> None:
    request = asyncio.ensure_future(client.get("/wait", headers=bearer(token)))
    assert await asyncio.to_thread(recorder.started.wait, WAIT)

    request.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await request

    assert await asyncio.to_thread(recorder.handler_cancelled.wait, WAIT)


async def test_client_disconnect_sets_cancel_during_a_streaming_response(
    client: httpx2.AsyncClient, token: str
) -> None:
    async with client.stream("GET", "/stream", headers=bearer(token)) as response:
        first = await anext(response.aiter_bytes())

    assert first == b"first\n"
    assert await asyncio.to_thread(recorder.stream_finished.wait, WAIT)
    assert recorder.stream_saw_cancel is True


async def test_completed_response_does_not_set_cancel(client: httpx2.AsyncClient) -> None:
    assert (await client.get("/quick")).status_code == 200

    assert await asyncio.to_thread(recorder.background_finished.wait, WAIT)
    assert recorder.cancel_after_response is False


async def test_a_bastion_error_keeps_its_status_code_and_safe_message() -> None:
    async def conflicted(request: Request, context: RequestContext) -> Response:
        raise AgentHistoryConflictError()

    app = create_agent_worker(
        env=SupabaseEnv(url="https://project-ref.supabase.co", jwks={"keys": []}, jwt_secret="x" * 32),
        routes=[Route(method="GET", path="/conflict", auth="none", handler=conflicted)],
    )
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as client:
        response = await client.get("/conflict")
    assert response.status_code == 409
    assert response.json() == {
        "code": "history_conflict",
        "message": "The conversation changed. Reload it before continuing.",
    }


async def test_an_error_that_names_a_field_sends_it() -> None:
    async def malformed(request: Request, context: RequestContext) -> Response:
        raise AgentMessagesInvalidError("messages[0].role", "must be 'user' or 'assistant'")

    app = create_agent_worker(
        env=SupabaseEnv(url="https://project-ref.supabase.co", jwks={"keys": []}, jwt_secret="x" * 32),
        routes=[Route(method="POST", path="/chat", auth="none", handler=malformed)],
    )
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as client:
        response = await client.post("/chat")
    assert response.status_code == 400
    assert response.json() == {
        "code": "invalid_input",
        "message": "messages[0].role must be 'user' or 'assistant'.",
        "field": "messages[0].role",
    }


async def test_a_busy_conversation_is_a_409_that_says_when_to_retry() -> None:
    async def busy(request: Request, context: RequestContext) -> Response:
        raise ConversationBusyError(retry_after=7.2)

    async def changed(request: Request, context: RequestContext) -> Response:
        raise TurnConflictError()

    app = create_agent_worker(
        env=SupabaseEnv(url="https://project-ref.supabase.co", jwks={"keys": []}, jwt_secret="x" * 32),
        routes=[
            Route(method="GET", path="/busy", auth="none", handler=busy),
            Route(method="GET", path="/changed", auth="none", handler=changed),
        ],
    )
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as client:
        response = await client.get("/busy")
        stale = await client.get("/changed")
    assert response.status_code == 409
    assert response.headers["retry-after"] == "8"
    assert response.json()["code"] == "turn_conflict"
    assert stale.status_code == 409
    assert "retry-after" not in stale.headers


async def test_a_busy_conversation_from_a_row_lock_stays_409_and_a_lost_connection_is_503() -> None:
    """Postgres's `LockNotAvailable` is an `OperationalError`, as a lost connection is: only the one
    bastion has not already answered is an outage."""
    import psycopg

    async def locked(request: Request, context: RequestContext) -> Response:
        try:
            raise psycopg.errors.LockNotAvailable("could not obtain lock on row")
        except psycopg.errors.LockNotAvailable as error:
            raise ConversationBusyError(retry_after=1.0) from error

    async def lost(request: Request, context: RequestContext) -> Response:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    app = create_agent_worker(
        env=SupabaseEnv(url="https://project-ref.supabase.co", jwks={"keys": []}, jwt_secret="x" * 32),
        routes=[
            Route(method="GET", path="/locked", auth="none", handler=locked),
            Route(method="GET", path="/lost", auth="none", handler=lost),
        ],
    )
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as client:
        busy = await client.get("/locked")
        outage = await client.get("/lost")
    assert (busy.status_code, busy.json()["code"], busy.headers["retry-after"]) == (409, "turn_conflict", "1")
    assert (outage.status_code, outage.json()["code"]) == (503, "database_unavailable")
    assert outage.headers["retry-after"] == "2"


def test_require_principal_gives_the_verified_user_and_refuses_a_route_that_ran_without_one() -> None:
    from bastion.auth import Principal

    alice = Principal(
        id="alice",
        role="authenticated",
        email=None,
        is_anonymous=False,
        aal=None,
        session_id=None,
        tenant_id=None,
        roles=(),
        claims={},
    )
    env = SupabaseEnv(url="https://project.supabase.co")
    verified = RequestContext(principal=alice, params={}, env=env, cancel=asyncio.Event())
    assert verified.require_principal() is alice
    anonymous = RequestContext(principal=None, params={}, env=env, cancel=asyncio.Event())
    with pytest.raises(RuntimeError, match="without a verified principal"):
        anonymous.require_principal()
