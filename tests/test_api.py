"""Typed operations: the declared types validate the request and write the OpenAPI document."""

from __future__ import annotations

from typing import Annotated, Any

import httpx2
import pytest
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from bastion.api import MAX_JSON_DEPTH, StrictModel, json_response, openapi_document, operation
from bastion.auth import SupabaseEnv
from bastion.worker import RequestContext, Route, create_agent_worker


class Rename(StrictModel):
    title: Annotated[str, Field(max_length=5)]
    seats: int = 1


class Page(StrictModel):
    limit: Annotated[int, Field(ge=1, le=10)] = 10


class Renamed(StrictModel):
    """The renamed thing."""

    title: str
    seats: int
    limit: int


@operation(body=Rename, query=Page, responses={200: Renamed}, errors=(404,))
async def rename(request: Request, context: RequestContext, *, body: Rename, query: Page) -> Response:
    """Rename a thing."""
    return json_response(Renamed(title=body.title, seats=body.seats, limit=query.limit))


ROUTES = [Route(method="POST", path="/things/{thing_id}", auth="none", handler=rename)]


@pytest.fixture
async def client() -> Any:
    env = SupabaseEnv(url="https://project-ref.supabase.co", jwks={"keys": []}, jwt_secret="x" * 32)
    app = create_agent_worker(env=env, routes=ROUTES)
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test") as http:
        yield http


async def test_the_handler_gets_the_validated_body_and_query(client: httpx2.AsyncClient) -> None:
    response = await client.post("/things/1?limit=3", json={"title": "Plans", "unknown": True})
    assert response.status_code == 200
    assert response.json() == {"title": "Plans", "seats": 1, "limit": 3}


@pytest.mark.parametrize(
    ("url", "body", "field", "message"),
    [
        ("/things/1", {"title": "too long"}, "title", "title: String should have at most 5 characters."),
        ("/things/1", {"title": "ok", "seats": "5"}, "seats", "seats: Input should be a valid integer."),
        ("/things/1", {}, "title", "title: Field required."),
        ("/things/1?limit=11", {"title": "ok"}, "limit", "limit: Input should be less than or equal to 10."),
    ],
)
async def test_a_refusal_names_the_field_and_the_rule(
    client: httpx2.AsyncClient, url: str, body: Any, field: str, message: str
) -> None:
    response = await client.post(url, json=body)
    assert response.status_code == 400
    assert response.json() == {"code": "invalid_input", "message": message, "field": field}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"{not json",
            "The body is not valid JSON (Expecting property name enclosed in double quotes at character 1).",
        ),
        (b"[1]", "The body must be a JSON object."),
        (b"[" * 100_000, f"The body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels."),
        (
            b'{"title": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}",
            f"The body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels.",
        ),
    ],
    ids=["not JSON", "not an object", "deeper than the parser goes", "one level too deep"],
)
async def test_a_body_that_cannot_be_read_says_why(
    client: httpx2.AsyncClient, content: bytes, message: str
) -> None:
    response = await client.post("/things/1", content=content)
    assert response.status_code == 400
    assert response.json() == {"code": "invalid_input", "message": message, "field": "body"}


async def test_a_body_at_the_depth_limit_is_read(client: httpx2.AsyncClient) -> None:
    nested = b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1)
    response = await client.post("/things/1", content=b'{"title": "ok", "extra": ' + nested + b"}")
    assert response.status_code == 200


def test_the_document_is_written_from_the_declared_types() -> None:
    document = openapi_document(ROUTES, title="things", version="1")
    operation_ = document["paths"]["/things/{thing_id}"]["post"]
    assert operation_["summary"] == "Rename a thing."
    assert operation_["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Rename"
    }
    schemas = document["components"]["schemas"]
    assert schemas["Rename"] == Rename.model_json_schema()
    assert [(p["name"], p["in"]) for p in operation_["parameters"]] == [
        ("thing_id", "path"),
        ("limit", "query"),
    ]
    assert operation_["parameters"][1]["schema"]["maximum"] == 10
    assert set(operation_["responses"]) == {"200", "400", "404", "413"}
    assert operation_["responses"]["200"]["description"] == "The renamed thing."
    error = schemas["Error400"]
    assert error["required"] == ["code", "message"]
    assert {"invalid_input", "bad_request"} <= set(error["properties"]["code"]["enum"])
    # Every 404 code of the errors imported so far is listed (an MCP connection adds its own).
    assert "not_found" in schemas["Error404"]["properties"]["code"]["enum"]
    assert operation_["security"] == []


def test_a_user_route_documents_the_sign_in_errors() -> None:
    route = Route(method="POST", path="/things/{thing_id}", auth="user", handler=rename)
    document = openapi_document([route], title="things", version="1")
    responses = document["paths"]["/things/{thing_id}"]["post"]["responses"]
    assert {"401", "503"} <= responses.keys()
    codes = document["components"]["schemas"]["Error401"]["properties"]["code"]["enum"]
    assert {"missing_token", "invalid_claims", "token_expired"} <= set(codes)
    assert "auth_unavailable" in document["components"]["schemas"]["Error503"]["properties"]["code"]["enum"]
