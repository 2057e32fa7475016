"""MCP connections against real MCP servers (streamable HTTP and SSE) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ToolReturnPart

from bastion import AgentCancelledError, AgentTools, ToolCall, ToolPolicy, compose_tools, define_agent, tool
from bastion.credentials import (
    CredentialForbiddenError,
    CredentialRef,
    InMemoryCredentialProvider,
    credential_auth,
)
from bastion.mcp import (
    McpConnectionDefinition,
    McpConnectionError,
    McpConnections,
    McpTransport,
    create_mcp_connections,
)
from bastion.policies import DEFAULT_DENIED_OUTPUT
from bastion.tools import Tool
from tests.mcp_servers import (
    SECRET_BODY,
    SECRET_PATH,
    SERVER_INSTRUCTIONS,
    Behavior,
    RunningServer,
    serve_mcp,
)
from tests.scripted import Call, ScriptedModel, collect, everything_the_model_saw, user

TOKENS = {"alice": "alice-token-0c1f", "bob": "bob-token-7a2e"}
TRANSPORTS = ["http", "sse"]


@dataclass(frozen=True)
class Ctx:
    user_id: str | None = "alice"


@pytest.fixture(scope="module", params=TRANSPORTS)
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    with serve_mcp(request.param) as running:
        yield running


@pytest.fixture(scope="module", params=TRANSPORTS)
def token_server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    with serve_mcp(request.param, Behavior(tokens=frozenset(TOKENS.values()))) as running:
        yield running


@pytest.fixture
def fresh_http_server() -> Iterator[RunningServer]:
    with serve_mcp("http") as running:
        yield running


def define(server: RunningServer, name: str = "docs", **options: Any) -> McpConnectionDefinition[Ctx]:
    return McpConnectionDefinition(
        name=name, transport=McpTransport(type=server.transport, url=server.url), **options
    )


def unreachable(name: str = "gone", kind: str = "http", **options: Any) -> McpConnectionDefinition[Ctx]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    transport = McpTransport(type=kind, url=f"http://127.0.0.1:{port}/mcp")  # type: ignore[arg-type]
    return McpConnectionDefinition(name=name, transport=transport, **options)


async def connect(*definitions: McpConnectionDefinition[Ctx], **options: Any) -> McpConnections:
    return await create_mcp_connections(list(definitions), context=options.pop("context", Ctx()), **options)


def named(connections: McpConnections) -> dict[str, Tool]:
    return {item.name: item for item in connections.tools}


async def run(item: Tool, arguments: dict[str, Any]) -> Any:
    assert item.execute is not None
    return await item.execute(ToolCall(tool_name=item.name, input=arguments, tool_call_id="call-1"))


async def until(condition: Callable[[], bool]) -> None:
    """Wait for something another thread or task does; fail after a generous deadline."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("The condition never held.")


async def wait_for_delete(server: RunningServer) -> bool:
    return await asyncio.to_thread(server.log.deletes.acquire, True, 10)


def identity(error: McpConnectionError) -> tuple[str, str, str | None, str | None]:
    """Everything an error names: a report that loses its connection or tool is a different report."""
    return (error.code, error.reason, error.connection, error.tool)


def assert_reveals_nothing(error: McpConnectionError, *secrets: str) -> None:
    shown = [str(error), repr(error), *(str(arg) for arg in error.args)]
    shown += [repr(value) for value in vars(error).values()]
    for secret in (SECRET_BODY, SECRET_PATH, "127.0.0.1", *TOKENS.values(), *secrets):
        assert not any(secret in text for text in shown), secret
    assert error.__cause__ is None


# Configuration (each rule: tests/test_mcp_definitions.py)


async def test_a_set_cancel_signal_stops_before_anything_connects(server: RunningServer) -> None:
    cancel = asyncio.Event()
    cancel.set()
    before = len(server.log.requests)
    with pytest.raises(AgentCancelledError):
        await connect(define(server), cancel=cancel)
    assert len(server.log.requests) == before


# Discovery and names


async def test_tools_are_exposed_by_alias_or_as_connection_name_and_remote_name(
    server: RunningServer,
) -> None:
    connections = await connect(
        define(server, allowlist=["search", "read"], aliases={"search": "search_documents"})
    )
    try:
        assert sorted(named(connections)) == ["docs__read", "search_documents"]
    finally:
        await connections.close()


async def test_a_namespace_replaces_the_connection_name_in_tool_names(server: RunningServer) -> None:
    connections = await connect(define(server, namespace="kb", allowlist=["read"]))
    try:
        assert list(named(connections)) == ["kb__read"]
    finally:
        await connections.close()


async def test_without_an_allowlist_every_remote_tool_is_exposed(server: RunningServer) -> None:
    connections = await connect(define(server))
    try:
        assert {"docs__search", "docs__read", "docs__whoami", "docs__broken"} <= set(named(connections))
    finally:
        await connections.close()


async def test_remote_tools_are_dynamic_with_the_servers_description_and_schema(
    server: RunningServer,
) -> None:
    connections = await connect(define(server, allowlist=["search"]))
    try:
        search = named(connections)["docs__search"]
        assert search.dynamic is True
        assert search.description == "Search the documents."
        assert search.input_schema["required"] == ["query"]
    finally:
        await connections.close()


async def test_remote_tool_input_is_validated_against_the_servers_schema(server: RunningServer) -> None:
    connections = await connect(define(server, allowlist=["search"]))
    try:
        with pytest.raises(ValueError, match="query"):
            named(connections)["docs__search"].check_input({"q": 1})
    finally:
        await connections.close()


async def test_a_name_collision_found_at_discovery_closes_every_client_and_publishes_nothing(
    fresh_http_server: RunningServer,
) -> None:
    first = define(fresh_http_server, name="one", namespace="kb")
    second = define(fresh_http_server, name="two", namespace="kb")
    with pytest.raises(McpConnectionError) as raised:
        await connect(first, second)
    assert (raised.value.code, raised.value.reason) == ("configuration_error", "duplicate_tool_name")
    assert fresh_http_server.log.count("DELETE") == 2


async def test_the_transport_is_resolved_from_the_context_at_every_open(server: RunningServer) -> None:
    seen: list[Ctx] = []

    async def transport(context: Ctx) -> McpTransport:
        seen.append(context)
        return McpTransport(type=server.transport, url=server.url)

    definition = McpConnectionDefinition(name="docs", transport=transport, allowlist=["read"])
    for who in ("alice", "bob"):
        connections = await connect(definition, context=Ctx(who))
        await connections.close()
    assert seen == [Ctx("alice"), Ctx("bob")]


async def test_tools_the_server_adds_after_discovery_are_not_exposed_with_an_allowlist(
    fresh_http_server: RunningServer,
) -> None:
    definition = define(fresh_http_server, allowlist=["search", "unlock"])
    connections = await connect(definition)
    try:
        assert await run(named(connections)["docs__unlock"], {}) == {"result": "unlocked"}
        assert sorted(named(connections)) == ["docs__search", "docs__unlock"]
    finally:
        await connections.close()
    later = await connect(definition)
    try:
        assert sorted(named(later)) == ["docs__search", "docs__unlock"]
    finally:
        await later.close()


async def test_without_an_allowlist_a_later_turn_discovers_tools_the_server_added(
    fresh_http_server: RunningServer,
) -> None:
    connections = await connect(define(fresh_http_server))
    try:
        assert "docs__added_later" not in named(connections)
        await run(named(connections)["docs__unlock"], {})
    finally:
        await connections.close()
    later = await connect(define(fresh_http_server))
    try:
        assert "docs__added_later" in named(later)
    finally:
        await later.close()


# Optional and required connections


async def test_an_optional_connection_that_cannot_connect_is_left_out_and_reported(
    server: RunningServer,
) -> None:
    reported: list[McpConnectionError] = []
    connections = await connect(
        define(server, allowlist=["read"]), unreachable(failure="optional", on_error=reported.append)
    )
    try:
        assert list(named(connections)) == ["docs__read"]
        assert [(error.code, error.reason, error.connection) for error in reported] == [
            ("discovery_failed", "connection_failed", "gone")
        ]
    finally:
        await connections.close()


async def test_a_required_connection_that_cannot_connect_fails_and_closes_the_others(
    fresh_http_server: RunningServer,
) -> None:
    async def after_the_other_connected(context: Ctx) -> McpTransport:
        await until(lambda: fresh_http_server.log.count_rpc("tools/list") == 1)
        return unreachable().transport  # type: ignore[return-value]

    failing = McpConnectionDefinition(name="gone", transport=after_the_other_connected)
    with pytest.raises(McpConnectionError) as raised:
        await connect(define(fresh_http_server), failing)
    assert (raised.value.code, raised.value.reason, raised.value.connection) == (
        "discovery_failed",
        "connection_failed",
        "gone",
    )
    assert fresh_http_server.log.count("DELETE") == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_server_that_refuses_the_connection_fails_discovery_at_once_as_connection_failed(
    transport: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Over SSE the transport fails to open, over HTTP its first request does: neither waits for the bound."""
    with caplog.at_level(logging.WARNING, "bastion.mcp"), pytest.raises(McpConnectionError) as raised:
        await connect(unreachable(kind=transport, request_timeout_ms=10_000))
    assert identity(raised.value) == ("discovery_failed", "connection_failed", "gone", None)
    assert not any("was lost" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_required_connection_whose_discovery_is_too_slow_times_out(transport: str) -> None:
    with (
        serve_mcp(transport, Behavior(slow_discovery=True)) as slow,
        pytest.raises(McpConnectionError) as raised,
    ):
        await connect(define(slow, request_timeout_ms=300))
    assert (raised.value.code, raised.value.reason) == ("discovery_failed", "timeout")


async def test_an_optional_connection_whose_discovery_is_too_slow_is_left_out_and_reported() -> None:
    reported: list[McpConnectionError] = []
    with serve_mcp("http", Behavior(slow_discovery=True)) as slow:
        connections = await connect(
            define(slow, request_timeout_ms=300, failure="optional", on_error=reported.append)
        )
        await connections.close()
    assert connections.tools == []
    assert [(error.code, error.reason) for error in reported] == [("discovery_failed", "timeout")]


# Authorization


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_refused_credential_at_discovery_fails_even_an_optional_connection(
    transport: str, status: int
) -> None:
    behavior = Behavior(tokens=frozenset({"right"}), token_status=status)
    with serve_mcp(transport, behavior) as guarded:
        definition = McpConnectionDefinition[Ctx](
            name="docs",
            transport=McpTransport(
                type=guarded.transport, url=guarded.url, headers={"Authorization": "Bearer x"}
            ),
            failure="optional",
        )
        with pytest.raises(McpConnectionError) as raised:
            await connect(definition)
    assert (raised.value.code, raised.value.reason, raised.value.connection) == (
        "authorization_required",
        "unauthorized",
        "docs",
    )


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_refused_credential_during_a_call_is_authorization_required_and_reported(
    transport: str, status: int
) -> None:
    reported: list[McpConnectionError] = []
    with serve_mcp(transport, Behavior(reject_calls_with=status)) as guarded:
        connections = await connect(define(guarded, allowlist=["search"], on_error=reported.append))
        try:
            with pytest.raises(McpConnectionError) as raised:
                await run(named(connections)["docs__search"], {"query": "q"})
        finally:
            await connections.close()
    assert identity(raised.value) == ("authorization_required", "unauthorized", "docs", "docs__search")
    assert [identity(error) for error in reported] == [identity(raised.value)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_errors_reveal_no_url_credential_or_response_body(transport: str) -> None:
    secret_header = {"Authorization": "Bearer wrong-SECRET-TOKEN"}
    with serve_mcp(transport, Behavior(tokens=frozenset({"right"}))) as guarded:
        definition = McpConnectionDefinition[Ctx](
            name="docs",
            transport=McpTransport(type=guarded.transport, url=guarded.url, headers=secret_header),
        )
        with pytest.raises(McpConnectionError) as at_discovery:
            await connect(definition)
    assert_reveals_nothing(at_discovery.value, "SECRET-TOKEN")
    with serve_mcp(transport, Behavior(reject_calls_with=401)) as guarded:
        connections = await connect(define(guarded, allowlist=["search"]))
        try:
            with pytest.raises(McpConnectionError) as during_call:
                await run(named(connections)["docs__search"], {"query": "q"})
        finally:
            await connections.close()
    assert_reveals_nothing(during_call.value)


async def test_credential_auth_sends_the_users_own_token(token_server: RunningServer) -> None:
    provider = InMemoryCredentialProvider()
    ref = CredentialRef(provider="memory", secret="docs", scope="user")
    await provider.put(ref, TOKENS["alice"], owner_id="alice")
    definition = define(
        token_server,
        allowlist=["whoami"],
        auth=credential_auth(provider=provider, ref=ref, owner="user", connection="Documents"),
    )
    connections = await connect(definition, context=Ctx("alice"))
    try:
        assert await run(named(connections)["docs__whoami"], {"user": "alice-via-auth"}) == {
            "result": "alice-via-auth"
        }
    finally:
        await connections.close()
    [call] = token_server.log.tool_calls("whoami")[-1:]
    assert call.authorization == f"Bearer {TOKENS['alice']}"


async def test_a_user_without_a_stored_credential_needs_authorization_before_anything_connects(
    server: RunningServer,
) -> None:
    provider = InMemoryCredentialProvider()
    ref = CredentialRef(provider="memory", secret="docs", scope="user")
    before = len(server.log.requests)
    definition = define(
        server,
        failure="optional",
        auth=credential_auth(provider=provider, ref=ref, owner="user", connection="Docs"),
    )
    with pytest.raises(McpConnectionError) as raised:
        await connect(definition, context=Ctx("carol"))
    assert (raised.value.code, raised.value.reason, raised.value.connection) == (
        "authorization_required",
        "credential_missing",
        "docs",
    )
    assert len(server.log.requests) == before


async def test_a_turn_without_a_user_needs_authorization_for_a_user_owned_connection(
    server: RunningServer,
) -> None:
    provider = InMemoryCredentialProvider()
    ref = CredentialRef(provider="memory", secret="docs", scope="user")
    definition = define(
        server, auth=credential_auth(provider=provider, ref=ref, owner="user", connection="Docs")
    )
    with pytest.raises(McpConnectionError) as raised:
        await connect(definition, context=Ctx(None))
    assert (raised.value.code, raised.value.reason) == ("authorization_required", "credential_missing")


class RefusingProvider(InMemoryCredentialProvider):
    async def get(self, ref: CredentialRef, *, owner_id: str | None = None) -> str | None:
        raise CredentialForbiddenError()


class BrokenProvider(InMemoryCredentialProvider):
    async def get(self, ref: CredentialRef, *, owner_id: str | None = None) -> str | None:
        raise OSError("the credential store is down")


async def test_a_refused_credential_fails_even_an_optional_connection_as_authorization_required(
    server: RunningServer,
) -> None:
    ref = CredentialRef(provider="memory", secret="docs", scope="app")
    auth = credential_auth(provider=RefusingProvider(), ref=ref, owner="app", connection="Docs")
    with pytest.raises(McpConnectionError) as raised:
        await connect(define(server, failure="optional", auth=auth))
    assert (raised.value.code, raised.value.reason) == ("authorization_required", "credential_refused")


async def test_an_optional_connection_whose_credential_store_fails_is_left_out_and_reported(
    server: RunningServer,
) -> None:
    reported: list[McpConnectionError] = []
    ref = CredentialRef(provider="memory", secret="docs", scope="app")
    auth = credential_auth(provider=BrokenProvider(), ref=ref, owner="app", connection="Docs")
    connections = await connect(define(server, failure="optional", auth=auth, on_error=reported.append))
    await connections.close()
    assert connections.tools == []
    assert [(error.code, error.reason) for error in reported] == [("discovery_failed", "connection_failed")]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_concurrent_turns_of_two_users_each_send_only_their_own_credentials(transport: str) -> None:
    with serve_mcp(transport, Behavior(tokens=frozenset(TOKENS.values()))) as guarded:

        async def resolve(context: Ctx) -> McpTransport:
            assert context.user_id is not None
            token = TOKENS[context.user_id]
            return McpTransport(
                type=guarded.transport, url=guarded.url, headers={"Authorization": f"Bearer {token}"}
            )

        definition = McpConnectionDefinition(name="docs", transport=resolve, allowlist=["whoami"])

        async def turn(who: str) -> list[Any]:
            connections = await connect(definition, context=Ctx(who))
            try:
                whoami = named(connections)["docs__whoami"]
                return list(await asyncio.gather(*(run(whoami, {"user": who}) for _ in range(8))))
            finally:
                await connections.close()

        results = await asyncio.gather(turn("alice"), turn("bob"), turn("alice"), turn("bob"))
        calls = guarded.log.tool_calls("whoami")
    assert [len(result) for result in results] == [8, 8, 8, 8]
    assert len(calls) == 32
    assert all(call.authorization == f"Bearer {TOKENS[call.arguments['user']]}" for call in calls)


# Results and call failures


async def test_structured_content_is_the_calls_output(server: RunningServer) -> None:
    connections = await connect(define(server, allowlist=["search"]))
    try:
        assert await run(named(connections)["docs__search"], {"query": "q"}) == {
            "hits": ["doc-q"],
            "query": "q",
        }
    finally:
        await connections.close()


async def test_unstructured_results_are_their_content_items(server: RunningServer) -> None:
    connections = await connect(define(server, allowlist=["read"]))
    try:
        output = await run(named(connections)["docs__read"], {"id": "7"})
    finally:
        await connections.close()
    assert output == {"content": [{"type": "text", "text": "Contents of 7."}]}


async def test_an_is_error_result_stays_a_result_and_is_reported(server: RunningServer) -> None:
    reported: list[McpConnectionError] = []
    connections = await connect(define(server, allowlist=["broken"], on_error=reported.append))
    try:
        output = await run(named(connections)["docs__broken"], {})
    finally:
        await connections.close()
    assert output == {
        "content": [{"type": "text", "text": "Error executing tool broken: The document store is offline."}],
        "isError": True,
    }
    assert [identity(error) for error in reported] == [
        ("execution_failed", "tool_error", "docs", "docs__broken")
    ]
    assert str(reported[0]) == "The tool docs__broken on the docs connection reported an error."


async def test_an_is_error_result_keeps_the_structured_content_the_server_sent(server: RunningServer) -> None:
    reported: list[McpConnectionError] = []
    connections = await connect(define(server, allowlist=["flagged"], on_error=reported.append))
    try:
        output = await run(named(connections)["docs__flagged"], {})
    finally:
        await connections.close()
    assert output == {
        "content": [{"type": "text", "text": "Quota exceeded."}],
        "isError": True,
        "structuredContent": {"retry_after": 30},
    }
    assert [identity(error) for error in reported] == [
        ("execution_failed", "tool_error", "docs", "docs__flagged")
    ]


async def test_a_call_the_server_does_not_answer_in_time_times_out_and_is_reported(
    server: RunningServer,
) -> None:
    reported: list[McpConnectionError] = []
    connections = await connect(
        define(server, allowlist=["slow"], request_timeout_ms=300, on_error=reported.append)
    )
    try:
        with pytest.raises(McpConnectionError) as raised:
            await run(named(connections)["docs__slow"], {})
    finally:
        await connections.close()
    assert identity(raised.value) == ("execution_failed", "timeout", "docs", "docs__slow")
    assert [identity(error) for error in reported] == [identity(raised.value)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_dropped_connection_fails_the_call_as_connection_failed(transport: str) -> None:
    with serve_mcp(transport) as dropping:
        connections = await connect(define(dropping, allowlist=["disconnect"]))
        try:
            with pytest.raises(McpConnectionError) as raised:
                await run(named(connections)["docs__disconnect"], {})
        finally:
            await connections.close()
    assert identity(raised.value) == ("execution_failed", "connection_failed", "docs", "docs__disconnect")


async def test_a_protocol_error_from_the_server_is_execution_failed_and_reveals_nothing(
    fresh_http_server: RunningServer,
) -> None:
    reported: list[McpConnectionError] = []
    connections = await connect(define(fresh_http_server, allowlist=["explode"], on_error=reported.append))
    try:
        with pytest.raises(McpConnectionError) as raised:
            await run(named(connections)["docs__explode"], {})
    finally:
        await connections.close()
    assert identity(raised.value) == ("execution_failed", "request_failed", "docs", "docs__explode")
    assert_reveals_nothing(raised.value)
    assert [identity(error) for error in reported] == [identity(raised.value)]


async def test_a_failed_call_is_not_retried() -> None:
    with serve_mcp("http") as dropping:
        connections = await connect(define(dropping, allowlist=["disconnect"]))
        try:
            with pytest.raises(McpConnectionError):
                await run(named(connections)["docs__disconnect"], {})
        finally:
            await connections.close()
        assert len(dropping.log.tool_calls("disconnect")) == 1


async def test_a_failing_on_error_hook_does_not_change_the_outcome(server: RunningServer) -> None:
    def explode(error: McpConnectionError) -> None:
        raise RuntimeError("hook failed")

    connections = await connect(define(server, allowlist=["broken"], on_error=explode))
    try:
        assert (await run(named(connections)["docs__broken"], {}))["isError"] is True
    finally:
        await connections.close()


async def test_arguments_that_are_not_an_object_fail_the_call_before_it_is_sent(
    server: RunningServer,
) -> None:
    reported: list[McpConnectionError] = []
    connections = await connect(define(server, allowlist=["read"], on_error=reported.append))
    sent_before = len(server.log.tool_calls("read"))
    try:
        item = named(connections)["docs__read"]
        assert item.execute is not None
        with pytest.raises(McpConnectionError) as raised:
            await item.execute(ToolCall(tool_name=item.name, input=["7"], tool_call_id="call-1"))
    finally:
        await connections.close()
    assert identity(raised.value) == ("execution_failed", "invalid_arguments", "docs", "docs__read")
    assert [identity(error) for error in reported] == [identity(raised.value)]
    assert len(server.log.tool_calls("read")) == sent_before


async def test_an_async_on_error_hook_is_awaited(server: RunningServer) -> None:
    reported: list[McpConnectionError] = []

    async def report(error: McpConnectionError) -> None:
        await asyncio.sleep(0)
        reported.append(error)

    connections = await connect(define(server, allowlist=["broken"], on_error=report))
    try:
        await run(named(connections)["docs__broken"], {})
    finally:
        await connections.close()
    assert [identity(error) for error in reported] == [
        ("execution_failed", "tool_error", "docs", "docs__broken")
    ]


async def test_a_failing_on_error_hook_is_logged_with_its_connection_and_traceback(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(error: McpConnectionError) -> None:
        raise RuntimeError("hook failed")

    connections = await connect(define(server, allowlist=["broken"], on_error=explode))
    try:
        with caplog.at_level("WARNING", logger="bastion.mcp"):
            await run(named(connections)["docs__broken"], {})
    finally:
        await connections.close()
    [record] = [r for r in caplog.records if "on_error" in r.getMessage()]
    assert record.getMessage() == "The on_error hook of the docs connection failed."
    assert record.exc_info is not None and str(record.exc_info[1]) == "hook failed"


# Lifecycle


async def test_close_closes_each_client_exactly_once(fresh_http_server: RunningServer) -> None:
    connections = await connect(define(fresh_http_server, allowlist=["read"]))
    await asyncio.gather(connections.close(), connections.close())
    await connections.close()
    assert connections.closed
    assert fresh_http_server.log.count("DELETE") == 1


async def test_a_client_that_does_not_let_go_is_cut_off_and_reported_as_cleanup_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reported: list[McpConnectionError] = []
    before = asyncio.all_tasks()
    with serve_mcp("http", Behavior(hold_deletes=True)) as holding:
        connections = await connect(
            define(holding, allowlist=["read"], request_timeout_ms=300, on_error=reported.append)
        )
        with caplog.at_level(logging.WARNING, "bastion.mcp"):
            await connections.close()
        assert asyncio.all_tasks() - before == set()  # the owner task was cut off and waited for
        assert [record.getMessage() for record in caplog.records] == [
            "The docs connection did not close in time; it was cut off."
        ]
        assert connections.closed
        assert holding.log.count("DELETE") == 1
    assert [(error.code, error.reason, error.connection) for error in reported] == [
        ("cleanup_failed", "timeout", "docs")
    ]


async def test_a_clean_close_reports_and_logs_nothing(
    fresh_http_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    reported: list[McpConnectionError] = []
    connections = await connect(define(fresh_http_server, allowlist=["read"], on_error=reported.append))
    with caplog.at_level(logging.WARNING, "bastion.mcp"):
        await connections.close()
    assert fresh_http_server.log.count("DELETE") == 1
    assert (reported, caplog.records) == ([], [])


async def test_the_cancel_signal_closes_the_clients(fresh_http_server: RunningServer) -> None:
    cancel = asyncio.Event()
    connections = await connect(define(fresh_http_server, allowlist=["read"]), cancel=cancel)
    cancel.set()
    assert await wait_for_delete(fresh_http_server)
    await connections.close()
    assert fresh_http_server.log.count("DELETE") == 1


async def test_cancelling_during_setup_closes_what_was_opened() -> None:
    cancel = asyncio.Event()
    with serve_mcp("http", Behavior(slow_discovery=True)) as slow:
        setup = asyncio.ensure_future(connect(define(slow), cancel=cancel))
        await until(lambda: slow.log.count_rpc("tools/list") == 1)
        cancel.set()
        with pytest.raises(AgentCancelledError):
            await setup
        assert slow.log.count("DELETE") == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_connection_left_idle_longer_than_the_request_bound_still_answers(transport: str) -> None:
    """The bound is per request: an event stream may stay silent far longer (SSE dies without this)."""
    with serve_mcp(transport) as idle:
        # A bound a loaded machine still answers within, and an idle stretch well past it.
        connections = await connect(define(idle, allowlist=["search"], request_timeout_ms=1_500))
        try:
            await asyncio.sleep(3)
            assert await run(named(connections)["docs__search"], {"query": "q"}) == {
                "hits": ["doc-q"],
                "query": "q",
            }
        finally:
            await connections.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_call_in_flight_when_the_connections_close_fails_as_connection_failed(transport: str) -> None:
    reported: list[McpConnectionError] = []
    with serve_mcp(transport) as waiting:
        connections = await connect(
            define(waiting, allowlist=["slow"], request_timeout_ms=20_000, on_error=reported.append)
        )
        call = asyncio.ensure_future(run(named(connections)["docs__slow"], {}))
        await until(lambda: len(waiting.log.tool_calls("slow")) == 1)
        await connections.close()
        with pytest.raises(McpConnectionError) as raised:
            await call
    assert identity(raised.value) == ("execution_failed", "connection_failed", "docs", "docs__slow")
    assert [identity(error) for error in reported] == [identity(raised.value)]


async def test_a_call_after_close_fails_as_closed_and_is_reported(server: RunningServer) -> None:
    reported: list[McpConnectionError] = []
    connections = await connect(define(server, allowlist=["read"], on_error=reported.append))
    await connections.close()
    with pytest.raises(McpConnectionError) as raised:
        await run(named(connections)["docs__read"], {"id": "1"})
    assert identity(raised.value) == ("execution_failed", "closed", "docs", "docs__read")
    assert str(raised.value) == "The docs connection is closed."
    assert [identity(error) for error in reported] == [identity(raised.value)]


# Server instructions


async def test_server_instructions_are_left_out_unless_the_definition_asks(server: RunningServer) -> None:
    connections = await connect(define(server, allowlist=["read"]))
    await connections.close()
    assert connections.instructions is None


async def test_server_instructions_are_offered_when_the_definition_asks(server: RunningServer) -> None:
    connections = await connect(define(server, allowlist=["read"], include_instructions=True))
    await connections.close()
    assert connections.instructions is not None
    assert SERVER_INSTRUCTIONS in connections.instructions


async def test_the_instructions_of_several_connections_are_each_introduced_and_separated(
    server: RunningServer,
) -> None:
    connections = await connect(
        define(server, name="one", allowlist=["read"], include_instructions=True),
        define(server, name="two", allowlist=["search"]),
        define(server, name="three", allowlist=["cite"], include_instructions=True),
    )
    await connections.close()
    assert connections.instructions == (
        f"Instructions from the one connection:\n{SERVER_INSTRUCTIONS}\n\n"
        f"Instructions from the three connection:\n{SERVER_INSTRUCTIONS}"
    )


# End to end through the agent loop


def documents_agent(server: RunningServer, **definition: Any) -> Any:
    @tool
    def note(text: str) -> str:
        """Write a note."""
        return f"noted: {text}"

    mcp_definitions = [
        define(
            server,
            allowlist=["search", "read", "whoami", "broken"],
            aliases={"search": "search_documents"},
            **definition,
        )
    ]

    async def tools(context: Ctx) -> AgentTools:
        connections = await create_mcp_connections(mcp_definitions, context=context)
        try:
            return AgentTools(tools=compose_tools([note], connections.tools), close=connections.close)
        except BaseException:
            await connections.close()
            raise

    return define_agent(
        name="documents",
        instructions="Help with documents.",
        tools=tools,
        permissions={
            "note": ToolPolicy(),
            "search_documents": ToolPolicy(
                model_output=lambda output, context, call: {"hit_count": len(output["hits"])}
            ),
            "docs__read": ToolPolicy(visible=lambda context: False),
            "docs__whoami": ToolPolicy(can_execute=lambda context, call: False),
            "docs__broken": ToolPolicy(needs_approval=True),
        },
    )


def chunk_for(chunks: list[dict[str, Any]], kind: str, call_id: str) -> dict[str, Any]:
    return next(chunk for chunk in chunks if chunk["type"] == kind and chunk.get("toolCallId") == call_id)


async def test_mcp_tools_run_with_local_tools_under_the_agents_permission_map(
    fresh_http_server: RunningServer,
) -> None:
    agent = documents_agent(fresh_http_server)
    model = ScriptedModel(
        [
            Call("search_documents", {"query": "q1"}),
            Call("docs__whoami", {"user": "mallory"}),
            Call("note", {"text": "hi"}),
        ],
        [Call("docs__broken", {})],
    )
    session = await agent.prepare(context=Ctx())
    chunks = await collect(await session.stream(model=model, messages=[user("find q1")]))
    await session.close()

    offered = {definition.name for definition in model.requests[0].info.function_tools}
    assert offered == {"note", "search_documents", "docs__whoami", "docs__broken"}
    assert chunk_for(chunks, "tool-input-available", "call-1-0")["dynamic"] is True
    assert chunk_for(chunks, "tool-output-available", "call-1-0")["output"] == {
        "hits": ["doc-q1"],
        "query": "q1",
    }
    assert chunk_for(chunks, "tool-output-available", "call-1-2")["output"] == "noted: hi"
    returns = {
        part.tool_call_id: part
        for message in model.requests[1].messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    assert returns["call-1-0"].content == {"hit_count": 1}
    assert returns["call-1-1"].content == dict(DEFAULT_DENIED_OUTPUT)
    assert chunks[-2]["type"] == "tool-approval-request"
    assert chunks[-2]["toolCallId"] == "call-2-0"
    assert [call.tool for call in fresh_http_server.log.tool_calls()] == ["search"]
    assert SERVER_INSTRUCTIONS not in everything_the_model_saw(model)
    assert fresh_http_server.log.count("DELETE") == 1


async def test_a_refused_credential_during_a_turn_is_a_tool_error_that_reveals_nothing() -> None:
    reported: list[McpConnectionError] = []
    with serve_mcp("http", Behavior(reject_calls_with=401)) as guarded:
        agent = documents_agent(guarded, on_error=reported.append)
        model = ScriptedModel([Call("search_documents", {"query": "q"})], ["Please reconnect."])
        session = await agent.prepare(context=Ctx())
        chunks = await collect(await session.stream(model=model, messages=[user("find q")]))
        await session.close()
    error_text = chunk_for(chunks, "tool-output-error", "call-1-0")["errorText"]
    assert error_text == "The docs connection needs authorization. Reconnect it and try again."
    assert [(error.code, error.reason) for error in reported] == [("authorization_required", "unauthorized")]


# Listings and results in detail


async def test_a_collision_at_discovery_names_both_connections_and_the_tool() -> None:
    with serve_mcp("http") as running:
        first = define(running, name="one", namespace="kb", allowlist=["search"])
        second = define(running, name="two", namespace="kb")
        with pytest.raises(McpConnectionError) as raised:
            await connect(
                second, McpConnectionDefinition(name="one", transport=first.transport, namespace="kb")
            )
    assert identity(raised.value) == ("configuration_error", "duplicate_tool_name", "one", "kb__search")
    assert str(raised.value) == (
        "MCP configuration error: the tool name 'kb__search' is offered by 'two' and 'one'."
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_listing_in_pages_is_read_to_its_end(transport: str) -> None:
    with serve_mcp(transport, Behavior(paged_tools="one_per_page")) as running:
        connections = await connect(define(running))
        try:
            exposed = set(named(connections))
        finally:
            await connections.close()
        pages = running.log.count_rpc("tools/list")
    assert {"docs__search", "docs__read", "docs__broken", "docs__unlock"} <= exposed
    assert pages == len(exposed) + 1  # one page per tool, and the unusable one is skipped


async def test_a_listing_that_never_ends_stops_after_a_bound_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        serve_mcp("http", Behavior(paged_tools="endless")) as running,
        caplog.at_level(logging.WARNING, "bastion.mcp"),
    ):
        connections = await connect(define(running))
        try:
            assert connections.tools == []
        finally:
            await connections.close()
        pages = running.log.count_rpc("tools/list")
    assert pages == 100
    assert [record.getMessage() for record in caplog.records] == [
        "The docs connection lists too many pages of tools; using the first ones."
    ]


@pytest.mark.parametrize("method", ["initialize", "tools/list"])
async def test_a_server_answering_discovery_with_an_error_fails_it_as_connection_failed(method: str) -> None:
    with (
        serve_mcp("http", Behavior(refuse_rpc=method)) as running,
        pytest.raises(McpConnectionError) as raised,
    ):
        await connect(define(running))
    assert identity(raised.value) == ("discovery_failed", "connection_failed", "docs", None)
    assert_reveals_nothing(raised.value)


async def test_content_items_are_json_in_the_protocols_own_field_names(server: RunningServer) -> None:
    connections = await connect(define(server, allowlist=["cite"]))
    try:
        output = await run(named(connections)["docs__cite"], {"id": "7"})
    finally:
        await connections.close()
    assert output == {
        "content": [
            {"type": "resource_link", "uri": "file:///docs/7", "name": "doc-7", "mimeType": "text/plain"}
        ]
    }


async def test_a_tool_without_a_description_is_described_by_its_title_or_not_at_all(
    server: RunningServer,
) -> None:
    connections = await connect(define(server, allowlist=["titled", "undescribed"]))
    try:
        described = {name: item.description for name, item in named(connections).items()}
    finally:
        await connections.close()
    assert described == {"docs__titled": "Titled, not described", "docs__undescribed": ""}


async def test_a_remote_tool_whose_name_cannot_be_exposed_is_skipped_with_a_warning(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "bastion.mcp"):
        connections = await connect(define(server))
    try:
        assert "docs__search" in named(connections)
        assert not any("has.dot" in name for name in named(connections))
    finally:
        await connections.close()
    [skipped] = [r for r in caplog.records if r.getMessage().startswith("Skipping")]
    assert (
        skipped.getMessage()
        == "Skipping a tool of the docs connection: its name or input schema is unusable."
    )
    assert skipped.exc_info and isinstance(skipped.exc_info[1], Exception)


async def test_closing_leaves_no_task_of_the_connections_running(server: RunningServer) -> None:
    before = asyncio.all_tasks()
    with_signal = await connect(define(server, allowlist=["search"]), cancel=asyncio.Event())
    await with_signal.close()
    without_signal = await connect(define(server, allowlist=["search"]))
    await without_signal.close()
    await asyncio.sleep(0)
    assert {task for task in asyncio.all_tasks() - before if not task.done()} == set()
