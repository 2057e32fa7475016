"""Request ids in every log line of a request, an access log that can be turned on, and JSON logs.

`create_agent_worker` wraps every request in `RequestLogMiddleware`: the request gets an id (the
caller's `X-Request-Id` when it is a short token, a fresh one otherwise), answered in the
`X-Request-Id` response header and readable with `request_id()` while the request runs.
`RequestIdFilter` puts it on each log record as `request_id`; `JsonFormatter` writes one JSON object
per line with it. The access log (logger `bastion.access`, INFO, one line per request: method, path
without the query string, status, duration, request id; never headers or bodies) is on with
`access_log=True` or the environment variable `BASTION_ACCESS_LOG=1`.
`configure_logging()` sets all of this up for a process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import sys
import time
from contextvars import ContextVar
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "ACCESS_LOG_ENV",
    "REQUEST_ID_HEADER",
    "JsonFormatter",
    "RequestIdFilter",
    "RequestLogMiddleware",
    "access_log_enabled",
    "configure_logging",
    "request_id",
]

REQUEST_ID_HEADER: Final = "x-request-id"
ACCESS_LOG_ENV: Final = "BASTION_ACCESS_LOG"
access_logger: Final = logging.getLogger("bastion.access")

_current: ContextVar[str | None] = ContextVar("bastion_request_id", default=None)
# An incoming id is kept only when it cannot forge a log line or smuggle anything into one.
_ACCEPTED_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_STANDARD_RECORD_KEYS: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def request_id() -> str | None:
    """The id of the request being served in this task, or None outside a request."""
    return _current.get()


def access_log_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether `BASTION_ACCESS_LOG` asks for the access log (`1`, `true`, `yes` or `on`)."""
    value = (os.environ if environ is None else environ).get(ACCESS_LOG_ENV, "")
    return value.strip().lower() in {"1", "true", "yes", "on"}


class RequestLogMiddleware:
    """ASGI middleware: gives each HTTP request an id and, when asked, writes its access log line."""

    def __init__(self, app: ASGIApp, *, access_log: bool = False) -> None:
        self.app = app
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = _header(scope, REQUEST_ID_HEADER.encode())
        rid = incoming if incoming is not None and _ACCEPTED_ID.fullmatch(incoming) else secrets.token_hex(8)
        token = _current.set(rid)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access_log:
                duration_ms = round((time.perf_counter() - started) * 1000, 1)
                access_logger.info(
                    "%s %s %s %.1f ms",
                    scope["method"],
                    scope["path"],
                    status,
                    duration_ms,
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": duration_ms,
                    },
                )
            _current.reset(token)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (or `-` outside a request) to every record passing through a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = getattr(record, "request_id", None) or _current.get() or "-"
        record.request_id = rid
        record.request_tag = "" if rid == "-" else f" [{rid}]"
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, request id, extra fields, error type.

    A traceback is kept for operators (`exc_info`), as text, since logs are the place for internals.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": _stamped(record) or _current.get(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_RECORD_KEYS and key not in entry and key != "request_tag":
                entry[key] = (
                    value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)
                )
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def _stamped(record: logging.LogRecord) -> str | None:
    rid = getattr(record, "request_id", None)
    return rid if isinstance(rid, str) and rid != "-" else None


def configure_logging(
    *, level: int = logging.WARNING, json_lines: bool = False, access_log: bool | None = None
) -> None:
    """Log to stderr with request ids (`json_lines` for JSON), and the access log when it is on.

    `access_log=None` follows `BASTION_ACCESS_LOG`. Replaces the root logger's handlers.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(
        JsonFormatter()
        if json_lines
        else logging.Formatter("%(levelname)s %(name)s%(request_tag)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    if access_log_enabled() if access_log is None else access_log:
        access_logger.setLevel(logging.INFO)
