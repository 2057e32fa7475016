"""Typed HTTP operations: a handler declares its body, query and responses as pydantic types, which both
validate its requests and write its part of the OpenAPI document, so the two cannot disagree.

`@operation(body=Rename, responses={200: ConversationOut})` wraps a handler: the body is read as one
JSON object (no deeper than `MAX_JSON_DEPTH`), validated strictly (no `"5"` for 5) and passed as
`body=`; the query string likewise as `query=` (its values are text, so numbers are read from it).
A refusal is `InvalidRequestError` (400 `invalid_input`) with `field` naming the value (`title`,
`messages[0].role`) and a message saying the rule (`title: String should have at most 500
characters.`). `openapi_document(routes)` describes every route, its security, parameters, bodies,
responses and the error body (`code`, `message`, `field`) of each status it can answer, with the
codes that status carries.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeAlias, get_args

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bastion.auth import AuthenticationErrorCode, KeySetUnavailableError
from bastion.errors import BastionError
from bastion.versioning import API_VERSION_HEADER, DEFAULT_VERSIONING, ApiVersioning
from bastion.worker import Route, status_error_code

__all__ = [
    "MAX_JSON_DEPTH",
    "UUID_PATTERN",
    "EventStream",
    "InvalidRequestError",
    "OperationSpec",
    "PlainBody",
    "StrictModel",
    "json_body",
    "json_response",
    "openapi_document",
    "operation",
]

MAX_JSON_DEPTH: Final = 64
_PARAMETER = re.compile(r"\{([a-z_]+)\}")


UUID_PATTERN: Final = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
"""A UUID's text form, for the ids routes take (an error says "must be a UUID", not this)."""


class InvalidRequestError(BastionError):
    """The request body or query is not what the route takes; `field` names the value at fault."""

    code: ClassVar[str] = "invalid_input"
    status: ClassVar[int] = 400


class StrictModel(BaseModel):
    """A request or response shape: JSON values taken as they are (`"5"` is not 5), unknown keys ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


@dataclass(frozen=True, slots=True)
class EventStream:
    """A streamed response (`text/event-stream`), such as the AI SDK UI message stream: each event's
    `data` is JSON of the schema `data`, or the text `terminator` that ends the stream."""

    description: str
    data: Mapping[str, Any] = field(default_factory=dict)
    terminator: str | None = None


@dataclass(frozen=True, slots=True)
class PlainBody:
    """A response that is not JSON: the media types it may have."""

    description: str
    media_types: tuple[str, ...]


ResponseShape: TypeAlias = type[BaseModel] | EventStream | PlainBody | None


@dataclass(frozen=True, slots=True, kw_only=True)
class OperationSpec:
    """What `@operation` declared: read by the wrapper to validate and by `openapi_document` to describe."""

    body: type[BaseModel] | None = None
    body_required: bool = True
    query: type[BaseModel] | None = None
    responses: Mapping[int, ResponseShape] = field(default_factory=dict)
    errors: Mapping[int, tuple[str, ...]] = field(default_factory=dict)


Handler = Callable[..., Awaitable[Response]]


def operation(
    *,
    body: type[BaseModel] | None = None,
    body_required: bool = True,
    query: type[BaseModel] | None = None,
    responses: Mapping[int, ResponseShape],
    errors: Mapping[int, Iterable[str]] | Iterable[int] = (),
) -> Callable[[Handler], Handler]:
    """Declare a handler's types; the wrapped handler is called with `body=` and `query=` when declared.

    `errors` lists the error statuses the handler itself answers (the worker's 401, 413 and 503 are
    added by `openapi_document`), optionally with the codes each carries beside those of the errors
    bastion knows for that status.
    """
    declared = (
        {status: tuple(codes) for status, codes in errors.items()}
        if isinstance(errors, Mapping)
        else {status: () for status in errors}
    )
    if body is not None or query is not None:
        declared.setdefault(400, ())
    spec = OperationSpec(
        body=body, body_required=body_required, query=query, responses=dict(responses), errors=declared
    )

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def validated(*args: Any) -> Response:
            request = args[-2]
            parsed: dict[str, Any] = {}
            if body is not None:
                raw = await json_body(request, optional=not body_required)
                parsed["body"] = _validated(body, raw)
            if query is not None:
                parsed["query"] = _validated(query, dict(request.query_params), strict=False)
            return await handler(*args, **parsed)

        validated.__bastion_operation__ = spec  # type: ignore[attr-defined]
        return validated

    return decorate


def json_response(value: BaseModel, *, status_code: int = 200) -> JSONResponse:
    """A response from the declared response type, in its JSON form."""
    return JSONResponse(value.model_dump(mode="json"), status_code=status_code)


async def json_body(request: Request, *, optional: bool = False) -> dict[str, Any]:
    """The request's JSON object, or `InvalidRequestError` saying what is wrong with it."""
    raw = await request.body()
    if not raw and optional:
        return {}
    try:
        body = json.loads(raw)
    except RecursionError:  # deeper than the parser goes
        raise _too_deep() from None
    except ValueError as error:
        detail = f" ({error.msg} at character {error.pos})" if isinstance(error, json.JSONDecodeError) else ""
        raise InvalidRequestError(f"The body is not valid JSON{detail}.", field="body") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("The body must be a JSON object.", field="body")
    if _deeper_than(body, MAX_JSON_DEPTH):
        raise _too_deep()
    return body


def _too_deep() -> InvalidRequestError:
    return InvalidRequestError(
        f"The body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels.", field="body"
    )


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests containers deeper than `limit`: one level at a time, no recursion."""
    level = [value]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [
            child
            for item in level
            for child in (item.values() if type(item) is dict else item)
            if type(child) is dict or type(child) is list
        ]
    return False


def _validated(model: type[BaseModel], value: Any, *, strict: bool | None = None) -> BaseModel:
    try:
        return model.model_validate(value, strict=strict)
    except ValidationError as error:
        first = error.errors(include_url=False, include_input=False)[0]
        name = _field_name(first["loc"]) or "body"
        rule = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
        if first["type"] == "string_pattern_mismatch":  # a regular expression says nothing to a person
            uuid = first["ctx"]["pattern"] == UUID_PATTERN
            rule = "must be a UUID" if uuid else "is not in the expected form"
        raise InvalidRequestError(f"{name}: {rule}.", field=name) from None


def _field_name(location: Sequence[int | str]) -> str:
    """`("messages", 0, "role")` as `messages[0].role`."""
    name = ""
    for part in location:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


# The document


def openapi_document(
    routes: Sequence[Route],
    *,
    title: str,
    version: str,
    versioning: ApiVersioning | None = DEFAULT_VERSIONING,
    description: str | None = None,
) -> dict[str, Any]:
    """An OpenAPI 3.1 document with one operation per route at each path the worker documents for it
    under `versioning` (give both the same); user routes require a bearer token. `version` is the
    application's; `info.description` says how the API is versioned, after `description`."""
    generator = _Document(versioning)
    paths: dict[str, dict[str, Any]] = {}
    kept: list[str] = []
    for route in routes:
        served = (
            versioning.served_paths(route.path, keep_declared_path=route.keep_declared_path)
            if versioning is not None
            else ()
        )
        documented = [entry.path for entry in served if entry.documented] or [route.path]
        for index, path in enumerate(documented):
            suffix = "" if index == 0 else "_unversioned"
            paths.setdefault(path, {})[route.method.lower()] = generator.operation(route, path, suffix)
            if index and path not in kept:
                kept.append(path)
    info: dict[str, Any] = {"title": title, "version": version}
    notes = [description] if description else []
    if versioning is not None:
        notes.append(versioning.description(kept))
        info["x-bastion-api-version"] = versioning.version
    if notes:
        info["description"] = "\n\n".join(notes)
    return {
        "openapi": "3.1.0",
        "info": info,
        "paths": paths,
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
            "schemas": generator.schemas,
        },
    }


class _Document:
    def __init__(self, versioning: ApiVersioning | None) -> None:
        self.schemas: dict[str, Any] = {}
        self._headers: dict[str, Any] = {}
        self._operation_ids: set[str] = set()
        if versioning is not None:
            self._headers[API_VERSION_HEADER] = {
                "description": "The version of the HTTP API that answered.",
                "required": True,
                "schema": {"type": "string", "const": versioning.version},
            }

    def operation(self, route: Route, path: str, suffix: str = "") -> dict[str, Any]:
        spec: OperationSpec = getattr(route.handler, "__bastion_operation__", None) or OperationSpec(
            responses={200: PlainBody("OK", ("application/json",))}
        )
        result: dict[str, Any] = {
            "operationId": self._operation_id(route.handler.__name__ + suffix),
            "summary": _summary(route.handler),
        }
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAMETER.findall(path)
        ]
        if spec.query is not None:
            parameters.extend(self._query_parameters(spec.query))
        if parameters:
            result["parameters"] = parameters
        if spec.body is not None:
            result["requestBody"] = {
                "required": spec.body_required,
                "content": {"application/json": {"schema": self.schema(spec.body)}},
            }
        result["security"] = [{"bearerAuth": []}] if route.auth == "user" else []
        responses = {str(status): self._response(shape) for status, shape in spec.responses.items()}
        errors = dict(spec.errors)
        if route.auth == "user":
            errors.setdefault(401, ())
            errors.setdefault(503, ())
        if spec.body is not None:
            errors.setdefault(413, ())
        for status, codes in sorted(errors.items()):
            responses[str(status)] = self._error(status, codes)
        if self._headers:
            for response in responses.values():
                response["headers"] = {**response.get("headers", {}), **self._headers}
        result["responses"] = responses
        return result

    def _operation_id(self, name: str) -> str:
        """`name`, numbered when another operation has it (one handler served at two paths)."""
        unique, number = name, 1
        while unique in self._operation_ids:
            number += 1
            unique = f"{name}_{number}"
        self._operation_ids.add(unique)
        return unique

    def schema(self, model: type[BaseModel]) -> dict[str, Any]:
        """A `$ref` to the model's schema, its definitions lifted into `components.schemas`."""
        document = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, definition in document.pop("$defs", {}).items():
            self.schemas[name] = definition
        self.schemas[model.__name__] = document
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    def _query_parameters(self, model: type[BaseModel]) -> list[dict[str, Any]]:
        document = model.model_json_schema()
        required = set(document.get("required", ()))
        return [
            {"name": name, "in": "query", "required": name in required, "schema": schema}
            for name, schema in document["properties"].items()
        ]

    def _response(self, shape: ResponseShape) -> dict[str, Any]:
        if shape is None:
            return {"description": "No content"}
        if isinstance(shape, EventStream):
            return {
                "description": shape.description,
                "content": {"text/event-stream": {"schema": _event(shape)}},
            }
        if isinstance(shape, PlainBody):
            return {"description": shape.description, "content": {media: {} for media in shape.media_types}}
        description = inspect.getdoc(shape) or shape.__name__
        return {
            "description": description.split("\n", 1)[0],
            "content": {"application/json": {"schema": self.schema(shape)}},
        }

    def _error(self, status: int, codes: tuple[str, ...]) -> dict[str, Any]:
        known = sorted({*_error_codes(status), *codes})
        name = f"Error{status}"
        self.schemas[name] = {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "enum": known},
                "message": {"type": "string"},
                "field": {
                    "type": "string",
                    "description": "The request value at fault, such as messages[0].role.",
                },
            },
        }
        return {
            "description": f"Error ({', '.join(known)})",
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }


def _event(stream: EventStream) -> dict[str, Any]:
    """The schema of one server-sent event (`data`, `event`, `id`), its data JSON or the terminator."""
    json_data = {"type": "string", "contentMediaType": "application/json", "contentSchema": dict(stream.data)}
    data: list[dict[str, Any]] = [{"properties": {"data": json_data}}]
    if stream.terminator is not None:
        data.insert(0, {"properties": {"data": {"const": stream.terminator}}})
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
        "anyOf": data,
    }


def _error_codes(status: int) -> set[str]:
    """Every code bastion can answer with `status`: its errors, the worker's and the sign-in's."""
    codes = {status_error_code(status)}
    pending: list[type[BastionError]] = [BastionError]
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        if kind.status == status and kind is not BastionError:
            codes.add(kind.code)
    if status == 401:
        codes.update(get_args(AuthenticationErrorCode))
    if status == 503:
        codes.add(KeySetUnavailableError.code)
    return codes


def _summary(handler: Any) -> str:
    doc = inspect.getdoc(handler)
    return doc.split("\n", 1)[0] if doc else handler.__name__.replace("_", " ").capitalize()
