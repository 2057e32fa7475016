"""The versioned HTTP API: routes declared under `/api` served under `/v1`, their old paths kept as
aliases, the AI SDK's paths kept and documented, and every response naming the API version."""

from __future__ import annotations

import time
from typing import Any

import httpx2
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bastion.api import openapi_document, operation
from bastion.auth import SupabaseEnv
from bastion.chat.conversations import ConversationOut
from bastion.versioning import ApiVersioning
from bastion.worker import RequestContext, Route, create_agent_worker
from tests.live_server import live_server
from tests.supabase_tokens import SigningKeys, es256, user_claims

PROJECT_URL = "https://project-ref.supabase.co"
ADA = "7f1c1c4e-1b0a-4f39-9d38-6a1c2b7e9a01"


@operation(responses={200: ConversationOut}, errors=(404,))
async def thing(request: Request, context: RequestContext) -> Response:
    """Read a thing."""
    assert context.principal is not None
    return JSONResponse(
        {"path": request.url.path, "id": context.params["thing_id"], "who": context.principal.id}
    )


@operation(responses={200: ConversationOut})
async def chat(request: Request, context: RequestContext) -> Response:
    """Chat."""
    return JSONResponse({"path": request.url.path})


@operation(responses={200: ConversationOut})
async def health(request: Request, context: RequestContext) -> Response:
    """Up."""
    return JSONResponse({"path": request.url.path})


ROUTES = [
    Route(method="GET", path="/api/things/{thing_id}", auth="user", handler=thing),
    Route(method="POST", path="/api/chat", auth="user", handler=chat, keep_declared_path=True),
    Route(method="GET", path="/health", auth="none", handler=health),
]


def headers(keys: SigningKeys, env: SupabaseEnv) -> dict[str, str]:
    return {"Authorization": f"Bearer {es256(keys, user_claims(env.issuer, time.time(), sub=ADA))}"}


def serve(versioning: ApiVersioning | None) -> tuple[Any, dict[str, str]]:
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    return create_agent_worker(env=env, routes=ROUTES, versioning=versioning), headers(keys, env)


def test_a_route_under_api_answers_under_v1_and_at_its_old_path_naming_the_version() -> None:
    app, auth = serve(ApiVersioning())
    with live_server(app) as url, httpx2.Client(base_url=url) as http:
        versioned = http.get("/v1/things/7", headers=auth)
        alias = http.get("/api/things/7", headers=auth)
        chats = [http.post(path, headers=auth) for path in ("/v1/chat", "/api/chat")]
        up = http.get("/health")
        not_versioned = http.get("/v1/health")
        unknown = http.get("/v1/nothing")
        refused = http.get("/v1/things/7")
    assert versioned.json() == {"path": "/v1/things/7", "id": "7", "who": ADA}
    assert alias.json() == {"path": "/api/things/7", "id": "7", "who": ADA}
    assert [response.json()["path"] for response in chats] == ["/v1/chat", "/api/chat"]
    assert up.status_code == 200 and not_versioned.status_code == 404
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"
    assert refused.status_code == 401 and refused.json()["code"] == "missing_token"
    for response in (versioned, alias, *chats, up, not_versioned, unknown, refused):
        assert response.headers["x-bastion-api-version"] == "1"


def test_without_aliases_only_the_versioned_and_the_kept_paths_answer() -> None:
    app, auth = serve(ApiVersioning(aliases=False))
    with live_server(app) as url, httpx2.Client(base_url=url) as http:
        assert http.get("/v1/things/7", headers=auth).status_code == 200
        assert http.get("/api/things/7", headers=auth).status_code == 404
        assert http.post("/api/chat", headers=auth).status_code == 200
        assert http.post("/v1/chat", headers=auth).status_code == 200


def test_without_versioning_every_route_is_where_it_was_declared() -> None:
    app, auth = serve(None)
    with live_server(app) as url, httpx2.Client(base_url=url) as http:
        declared = http.get("/api/things/7", headers=auth)
        assert http.get("/v1/things/7", headers=auth).status_code == 404
    assert declared.status_code == 200
    assert "x-bastion-api-version" not in declared.headers


def test_the_document_lists_the_versioned_and_kept_paths_not_the_aliases() -> None:
    document = openapi_document(ROUTES, title="t", version="0.1")
    assert set(document["paths"]) == {"/v1/things/{thing_id}", "/v1/chat", "/api/chat", "/health"}
    ids = [op["operationId"] for methods in document["paths"].values() for op in methods.values()]
    assert sorted(ids) == ["chat", "chat_unversioned", "health", "thing"]
    thing_operation = document["paths"]["/v1/things/{thing_id}"]["get"]
    assert thing_operation["parameters"][0]["name"] == "thing_id"
    for status in ("200", "401", "404"):
        header = thing_operation["responses"][status]["headers"]["X-Bastion-Api-Version"]
        assert header["schema"]["const"] == "1" and header["required"] is True
    assert document["info"]["x-bastion-api-version"] == "1"
    assert "`/v1`" in document["info"]["description"] and "`/api/chat`" in document["info"]["description"]
    unversioned = openapi_document(ROUTES, title="t", version="0.1", versioning=None)
    assert set(unversioned["paths"]) == {"/api/things/{thing_id}", "/api/chat", "/health"}


def test_an_alias_that_collides_with_a_declared_route_is_refused() -> None:
    keys = SigningKeys()
    env = SupabaseEnv(url=PROJECT_URL, jwks=keys.jwks())
    clash = Route(method="GET", path="/v1/things/{thing_id}", auth="user", handler=thing)
    with pytest.raises(ValueError, match="declared twice"):
        create_agent_worker(env=env, routes=[*ROUTES, clash])


@pytest.mark.parametrize(
    "settings",
    [{"prefix": "v1"}, {"prefix": "/v1/"}, {"declared": "/"}, {"prefix": "/api"}, {"version": ""}],
)
def test_a_versioning_that_could_not_serve_is_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ApiVersioning(**settings)
