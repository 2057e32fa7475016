"""The assistant's OpenAPI document, generated from its routes so that the two cannot disagree."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import Any

from bastion import __version__
from bastion.worker import Route

__all__ = ["openapi_document"]

_PARAMETER = re.compile(r"\{([a-z_]+)\}")

_ERROR = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
}


def openapi_document(routes: Sequence[Route]) -> dict[str, Any]:
    """An OpenAPI 3.1 document with one operation per route; user routes require a bearer token."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "operationId": route.handler.__name__,
            "summary": _summary(route),
            "responses": _responses(route),
        }
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAMETER.findall(route.path)
        ]
        if parameters:
            operation["parameters"] = parameters
        if route.auth == "user":
            operation["security"] = [{"bearerAuth": []}]
        else:
            operation["security"] = []
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "bastion assistant", "version": __version__},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "schemas": {"Error": _ERROR},
        },
    }


def _summary(route: Route) -> str:
    doc = inspect.getdoc(route.handler)
    return doc.split("\n", 1)[0] if doc else route.handler.__name__.replace("_", " ").capitalize()


def _responses(route: Route) -> dict[str, Any]:
    error = {
        "description": "Error",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    responses: dict[str, Any] = {"default": error}
    if route.path == "/api/chat":
        responses["200"] = {
            "description": "The AI SDK UI message stream",
            "content": {"text/event-stream": {}},
        }
    elif route.method == "DELETE":
        responses["204"] = {"description": "Deleted"}
    elif route.method == "POST":
        responses["201" if "conversations" in route.path else "200"] = {"description": "Created or done"}
    else:
        responses["200"] = {"description": "OK"}
    if route.auth == "user":
        responses["401"] = error
    return responses
