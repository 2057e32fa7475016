"""Request ids on every log line of a request, the access log (off unless asked), and JSON log lines."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx2
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from bastion.auth import SupabaseEnv
from bastion.request_log import (
    JsonFormatter,
    RequestIdFilter,
    access_log_enabled,
    configure_logging,
    request_id,
)
from bastion.worker import RequestContext, Route, create_agent_worker

ENV = SupabaseEnv(url="https://project-ref.supabase.co", jwks={"keys": []}, jwt_secret="x" * 32)
handler_log = logging.getLogger("bastion.tests.handler")


async def hello(request: Request, context: RequestContext) -> Response:
    handler_log.warning("handling hello")
    return JSONResponse({"request_id": request_id()})


async def crash(request: Request, context: RequestContext) -> Response:
    raise RuntimeError("internal detail")


def worker(**options: object) -> httpx2.AsyncClient:
    app = create_agent_worker(
        env=ENV,
        routes=[
            Route(method="GET", path="/hello", auth="none", handler=hello),
            Route(method="GET", path="/crash", auth="none", handler=crash),
        ],
        **options,  # type: ignore[arg-type]
    )
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")


class Records:
    """The records captured during the test itself (pytest swaps the list between phases)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog

    def named(self, name: str) -> list[logging.LogRecord]:
        return [record for record in self._caplog.records if record.name == name]


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Iterator[Records]:
    caplog.set_level(logging.INFO)
    stamp = RequestIdFilter()
    caplog.handler.addFilter(stamp)
    yield Records(caplog)
    caplog.handler.removeFilter(stamp)


async def test_each_request_gets_an_id_in_its_logs_and_response(records: Records) -> None:
    async with worker() as client:
        first = await client.get("/hello")
        second = await client.get("/hello")
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert ids[0] != ids[1] and all(len(rid) == 16 for rid in ids)
    assert [first.json()["request_id"], second.json()["request_id"]] == ids
    logged = records.named("bastion.tests.handler")
    assert [getattr(r, "request_id", None) for r in logged] == ids
    assert request_id() is None


@pytest.mark.parametrize(
    ("sent", "kept"),
    [("edge-7f3a.1", True), ("x" * 65, False), ("two words", False), ("line\\nbreak", False)],
)
async def test_a_callers_request_id_is_kept_only_when_it_is_a_short_token(sent: str, kept: bool) -> None:
    async with worker() as client:
        response = await client.get("/hello", headers={"X-Request-Id": sent})
    assert (response.headers["x-request-id"] == sent) is kept
    assert response.json()["request_id"] == response.headers["x-request-id"]


async def test_the_access_log_is_off_unless_asked(records: Records, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BASTION_ACCESS_LOG", raising=False)
    async with worker() as client:
        await client.get("/hello")
    assert records.named("bastion.access") == []


@pytest.mark.parametrize("how", ["argument", "environment"])
async def test_the_access_log_has_one_line_per_request_with_its_status(
    records: Records, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "environment":
        monkeypatch.setenv("BASTION_ACCESS_LOG", "1")
    options = {"access_log": True} if how == "argument" else {}
    async with worker(**options) as client:
        ok = await client.get("/hello?token=secret")
        failed = await client.get("/crash")
    access = records.named("bastion.access")
    assert [(r.method, r.path, r.status) for r in access] == [  # type: ignore[attr-defined]
        ("GET", "/hello", 200),
        ("GET", "/crash", 500),
    ]
    assert [getattr(r, "request_id", None) for r in access] == [
        ok.headers["x-request-id"],
        failed.headers["x-request-id"],
    ]
    assert all("secret" not in r.getMessage() for r in access)
    assert all(isinstance(r.duration_ms, float) for r in access)  # type: ignore[attr-defined]


def test_the_environment_switch_reads_common_spellings() -> None:
    assert [access_log_enabled({"BASTION_ACCESS_LOG": v}) for v in ("1", "true", "ON", "0", "")] == [
        True,
        True,
        True,
        False,
        False,
    ]


async def test_json_lines_carry_the_request_id_and_the_extra_fields(records: Records) -> None:
    async with worker(access_log=True) as client:
        response = await client.get("/hello")
    [access] = records.named("bastion.access")
    line = json.loads(JsonFormatter().format(access))
    assert line["request_id"] == response.headers["x-request-id"]
    assert (line["logger"], line["level"], line["method"], line["status"]) == (
        "bastion.access",
        "INFO",
        "GET",
        200,
    )
    assert line["message"].startswith("GET /hello 200 ")


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root, access = logging.getLogger(), logging.getLogger("bastion.access")
    saved = (root.handlers[:], root.level, access.level)
    yield
    root.handlers[:], _, _ = saved
    root.setLevel(saved[1])
    access.setLevel(saved[2])


def test_configure_logging_tags_lines_with_the_request_and_turns_on_the_access_log(
    restored_logging: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BASTION_ACCESS_LOG", "yes")
    configure_logging()
    assert logging.getLogger("bastion.access").getEffectiveLevel() == logging.INFO
    handler_log.warning("outside a request")
    configure_logging(json_lines=True, access_log=False)
    handler_log.warning("as json")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "WARNING bastion.tests.handler: outside a request"
    assert json.loads(lines[1])["message"] == "as json"
    assert json.loads(lines[1])["request_id"] is None


async def test_text_lines_inside_a_request_carry_its_id(
    restored_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging()
    async with worker() as client:
        response = await client.get("/hello")
    assert f"WARNING bastion.tests.handler [{response.headers['x-request-id']}]: handling hello" in (
        capsys.readouterr().err
    )
