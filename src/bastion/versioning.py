"""Where the HTTP API is served: under a version prefix, with the paths routes declare kept as aliases.

Routes declare their paths under `/api` (`/api/conversations`, `/api/chat`, …). The worker serves each
such route under the version prefix instead (`/v1/conversations`, `/v1/chat`), which the OpenAPI
document describes, and by default also at its declared path, an undocumented alias, so a page or a
client written before the prefix keeps working. A route that a client library finds by its declared
path (the AI SDK's `useChat` posts to `/api/chat`) says `keep_declared_path`: it is served and
documented at both, whatever the aliases. Routes outside `/api` (the page, `/health`, the Auth API) stay
where they are declared. Every response says which API version answered, in `X-Bastion-Api-Version`.

A breaking change gets a new prefix (`/v2`) beside the old one; additions (new routes, new optional
fields, new error codes) do not change the version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["API_VERSION_HEADER", "DEFAULT_VERSIONING", "ApiVersionHeader", "ApiVersioning", "ServedPath"]

API_VERSION_HEADER: Final = "X-Bastion-Api-Version"


@dataclass(frozen=True, slots=True)
class ServedPath:
    """One path a route answers at; `documented` paths are the ones the OpenAPI document lists."""

    path: str
    documented: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiVersioning:
    """How the worker maps declared paths to served ones (see the module docstring).

    `version` is the API's version (`"1"`), `prefix` where it is served (`"/v1"`), `declared` the
    prefix routes declare (`"/api"`), and `aliases` whether the declared paths keep answering.
    """

    version: str = "1"
    prefix: str = "/v1"
    declared: str = "/api"
    aliases: bool = True

    def __post_init__(self) -> None:
        for name, value in (("prefix", self.prefix), ("declared", self.declared)):
            if not value.startswith("/") or value.endswith("/") or len(value) < 2:
                raise ValueError(f"ApiVersioning.{name} must start with '/' and not end with one: {value!r}.")
        if self.prefix == self.declared:
            raise ValueError("ApiVersioning.prefix must differ from the declared prefix.")
        if not self.version or not self.version.isascii() or not self.version.isprintable():
            raise ValueError("ApiVersioning.version must be printable ASCII text.")

    def versioned(self, path: str) -> str | None:
        """The versioned path of a declared one, or None for a path outside the API."""
        if path == self.declared or path.startswith(self.declared + "/"):
            return self.prefix + path[len(self.declared) :]
        return None

    def served_paths(self, path: str, *, keep_declared_path: bool = False) -> tuple[ServedPath, ...]:
        """Every path a route declared at `path` answers at, the versioned one first."""
        versioned = self.versioned(path)
        if versioned is None:
            return (ServedPath(path, documented=True),)
        if keep_declared_path:
            return ServedPath(versioned, documented=True), ServedPath(path, documented=True)
        if self.aliases:
            return ServedPath(versioned, documented=True), ServedPath(path, documented=False)
        return (ServedPath(versioned, documented=True),)

    def description(self, kept: list[str]) -> str:
        """What the OpenAPI document says about versions; `kept` are the documented declared paths."""
        text = (
            f"Version {self.version} of the HTTP API, served under `{self.prefix}`. Every response "
            f"carries `{API_VERSION_HEADER}: {self.version}`. A breaking change will come under a new "
            f"prefix beside this one; new routes, optional fields and error codes do not change it."
        )
        if kept:
            paths = ", ".join(f"`{path}`" for path in kept)
            text += (
                f" Also served where client libraries expect them: {paths}, the same operations as "
                f"under `{self.prefix}`. A streamed reply is the AI SDK UI message stream, protocol "
                "version `v1`, named by its `x-vercel-ai-ui-message-stream` response header."
            )
        if self.aliases:
            text += (
                f" The unversioned `{self.declared}/...` path of every other `{self.prefix}/...` "
                "operation answers too, as an alias kept for clients written before the prefix."
            )
        return text


DEFAULT_VERSIONING: Final = ApiVersioning()
"""Version 1 under `/v1`, the `/api` paths kept as aliases."""


class ApiVersionHeader:
    """ASGI middleware: adds `X-Bastion-Api-Version` to every HTTP response."""

    def __init__(self, app: ASGIApp, *, version: str) -> None:
        self.app = app
        self.header = (API_VERSION_HEADER.lower().encode(), version.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_version)
