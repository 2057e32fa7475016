"""The assistant's answers for a browser that the API's JSON would not serve: a "not found" page for a
wrong address, and the policy of the pages it serves.

An API client (a path under /api, /v1 or /auth, or a request that does not ask for HTML) keeps the
JSON error every route answers with.
"""

from __future__ import annotations

from html import escape

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from bastion.worker import RequestFailure

__all__ = ["error_response", "page_policy"]

_API_PREFIXES = ("/api/", "/v1/", "/auth/", "/openapi.json", "/health")

_NOT_FOUND = """<!doctype html>
<html lang="en">
  <head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1">
    <meta name="color-scheme" content="light dark">
    <title>Not found · bastion assistant</title>
    <link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
    <link rel="stylesheet" href="/static/shared.css">
  </head>
  <body>
    <main class="sign-in" id="not-found">
      <div class="sign-in-card">
        <h1><img src="/static/favicon.svg" alt="" width="28" height="28"> Nothing here</h1>
        <p>There is no page at <code>{path}</code>. The address may be mistyped, or the page has moved.</p>
        <p><a href="/">Go to the assistant</a> · <a href="/docs">API reference</a></p>
      </div>
    </main>
  </body>
</html>
"""


def page_policy(*, connect: str = "") -> str:
    """The content-security policy of the assistant's pages: their own files only, nothing inline."""
    return (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        f"connect-src 'self'{connect}; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    )


def error_response(request: Request, failure: RequestFailure) -> Response:
    """A page for a browser asking for an address that does not exist; the JSON error otherwise."""
    if failure.status == 404 and _wants_a_page(request):
        return HTMLResponse(
            _NOT_FOUND.replace("{path}", escape(request.url.path[:200])),
            status_code=404,
            headers={"content-security-policy": page_policy(), "x-frame-options": "DENY"},
        )
    body = {"code": failure.code, "message": failure.message}
    if failure.field is not None:
        body["field"] = failure.field
    return JSONResponse(body, status_code=failure.status, headers=dict(failure.headers))


def _wants_a_page(request: Request) -> bool:
    path = request.url.path
    if request.method != "GET" or path.startswith(_API_PREFIXES) or path.startswith("/static/"):
        return False
    return "text/html" in request.headers.get("accept", "")
