"""The rules an MCP definition must follow, the transport resolved from the context, errors and results.

Everything here is decided before (or without) a server: no MCP server runs, so each rule has its own
quick test with the exact stable code, reason and message an application sees.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from mcp import types as mcp_types
from mcp.shared.exceptions import MCPError

from bastion import ToolCall
from bastion.credentials import ConnectionAuthorizationFailedError, ConnectionAuthorizationRequiredError
from bastion.mcp import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    McpConnectionDefinition,
    McpConnectionError,
    McpConnections,
    McpTransport,
    create_mcp_connections,
)
from bastion.mcp._client import McpClient
from bastion.mcp._discovery import Discovered, build_tools
from bastion.mcp._output import tool_output
from bastion.mcp._resolve import resolve_transport

HTTP = McpTransport(type="http", url="http://127.0.0.1:9/mcp")
NAME_RULE = "1–64 letters, digits, underscores or hyphens"
TOOL_RULE = "1–128 letters, digits, underscores or hyphens"


@dataclass(frozen=True)
class Ctx:
    user_id: str = "alice"


def identity(error: McpConnectionError) -> tuple[str, str, str | None, str | None, str]:
    """Everything an error says: its code, reason, connection, tool and message."""
    return (error.code, error.reason, error.connection, error.tool, str(error))


async def refusal(*definitions: Any) -> McpConnectionError:
    with pytest.raises(McpConnectionError) as raised:
        await create_mcp_connections(list(definitions), context=Ctx())
    assert raised.value.__cause__ is None
    return raised.value


def docs(**options: Any) -> McpConnectionDefinition[Ctx]:
    return McpConnectionDefinition[Ctx](**{"name": "docs", "transport": HTTP, **options})


def misconfigured(reason: str, text: str, connection: str | None = "docs", tool: str | None = None) -> tuple:
    shown = repr(connection)
    return (
        "configuration_error",
        reason,
        connection,
        tool,
        f"MCP configuration error: connection {shown}: {text}",
    )


# The list of definitions


@pytest.mark.parametrize("definitions", ["docs", b"docs", {"name": "docs"}, 5, None])
async def test_definitions_that_are_not_a_list_are_refused(definitions: Any) -> None:
    with pytest.raises(McpConnectionError) as raised:
        await create_mcp_connections(definitions, context=Ctx())
    assert identity(raised.value) == (
        "configuration_error",
        "invalid_definitions",
        None,
        None,
        "MCP configuration error: definitions must be a list of McpConnectionDefinition.",
    )


@pytest.mark.parametrize("item", [object(), {"name": "docs"}, "docs"])
async def test_a_list_item_that_is_not_a_definition_is_refused(item: Any) -> None:
    error = await refusal(docs(), item)
    assert identity(error) == (
        "configuration_error",
        "invalid_definitions",
        None,
        None,
        "MCP configuration error: each definition must be an McpConnectionDefinition.",
    )


async def test_no_definitions_open_nothing_and_offer_no_tools() -> None:
    connections = await create_mcp_connections([], context=Ctx())
    assert isinstance(connections, McpConnections)
    assert (connections.tools, connections.instructions) == ([], None)
    await connections.close()
    assert connections.closed


async def test_two_connections_with_one_name_are_refused() -> None:
    error = await refusal(docs(), docs(namespace="other"))
    assert identity(error) == misconfigured("duplicate_name", "the connection name is used twice.")


async def test_a_repeated_name_reports_the_later_definitions_own_problem_first() -> None:
    error = await refusal(docs(), docs(namespace="has space"))
    assert error.reason == "invalid_namespace"


async def test_two_connections_predicting_one_tool_name_are_refused_naming_both() -> None:
    first = McpConnectionDefinition[Ctx](name="a", transport=HTTP, allowlist=["search"])
    second = McpConnectionDefinition[Ctx](name="b", transport=HTTP, aliases={"find": "a__search"})
    error = await refusal(first, second)
    assert identity(error) == (
        "configuration_error",
        "duplicate_tool_name",
        "b",
        "a__search",
        "MCP configuration error: the tool name 'a__search' is offered by 'a' and 'b'.",
    )


async def test_connections_with_distinct_names_and_tools_pass_every_check() -> None:
    opened: list[str] = []

    async def transport(context: Ctx) -> McpTransport:
        opened.append("b")
        raise OSError("no network in this test")

    first = McpConnectionDefinition[Ctx](
        name="a", transport=HTTP, allowlist=["search"], failure="optional", request_timeout_ms=1
    )
    second = McpConnectionDefinition[Ctx](
        name="b", transport=transport, allowlist=["search"], aliases={"search": "find"}, failure="optional"
    )
    connections = await create_mcp_connections([first, second], context=Ctx())
    assert (connections.tools, opened) == ([], ["b"])
    await connections.close()


# Each rule of one definition


@pytest.mark.parametrize("name", ["", "has space", "dots.not.allowed", "x" * 65, "docs\n", "é", 5, None])
async def test_an_unusable_connection_name_is_refused_without_echoing_it(name: Any) -> None:
    error = await refusal(McpConnectionDefinition[Ctx](name=name, transport=HTTP))
    assert identity(error) == misconfigured("invalid_name", f"the name must be {NAME_RULE}.", None)


@pytest.mark.parametrize("name", ["x", "x" * 64, "Docs-2_b"])
async def test_connection_names_of_letters_digits_underscores_and_hyphens_are_accepted(name: str) -> None:
    error = await refusal(McpConnectionDefinition[Ctx](name=name, transport=HTTP, request_timeout_ms=1))
    assert (error.code, error.connection) in {("discovery_failed", name)}


@pytest.mark.parametrize("namespace", ["", "has space", "kb\n", "x" * 65, 5])
async def test_an_unusable_namespace_is_refused(namespace: Any) -> None:
    error = await refusal(docs(namespace=namespace))
    assert identity(error) == misconfigured("invalid_namespace", f"the namespace must be {NAME_RULE}.")


TRANSPORT_RULES = [
    ("http://127.0.0.1:9/mcp", "the transport must be an McpTransport or an async function of the context."),
    (None, "the transport must be an McpTransport or an async function of the context."),
    (McpTransport(type="ws", url="http://127.0.0.1:9/mcp"), "the transport type must be 'http' or 'sse'."),  # type: ignore[arg-type]
    (McpTransport(type="http", url="http:///no-host"), "the transport URL must be an http or https URL."),
    (McpTransport(type="http", url="file:///etc"), "the transport URL must be an http or https URL."),
    (McpTransport(type="sse", url="ftp://host/x"), "the transport URL must be an http or https URL."),
    (McpTransport(type="http", url="http://[::1/mcp"), "the transport URL must be an http or https URL."),
    (McpTransport(type="http", url=5), "the transport URL must be an http or https URL."),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("transport", "text"), TRANSPORT_RULES)
async def test_an_unusable_transport_is_refused(transport: Any, text: str) -> None:
    error = await refusal(docs(transport=transport))
    assert identity(error) == misconfigured("invalid_transport", text)


HEADER_RULES = [[("X", "y")], {5: "y"}, {"X": 5}, {"X": "a\nB: c"}, {"X": "a\rB: c"}, "X: y"]


@pytest.mark.parametrize("headers", HEADER_RULES)
async def test_headers_that_are_not_a_mapping_of_single_line_strings_are_refused(headers: Any) -> None:
    error = await refusal(
        docs(transport=McpTransport(type="http", url="http://127.0.0.1:9", headers=headers))
    )
    assert identity(error) == misconfigured("invalid_headers", "headers must be a mapping of strings.")


@pytest.mark.parametrize(
    ("options", "reason", "text"),
    [
        ({"auth": "Bearer x"}, "invalid_auth", "auth must be an async function of the context."),
        ({"failure": "sometimes"}, "invalid_failure", "failure must be 'required' or 'optional'."),
        ({"failure": None}, "invalid_failure", "failure must be 'required' or 'optional'."),
        ({"on_error": "log"}, "invalid_on_error", "on_error must be a function."),
        (
            {"include_instructions": 1},
            "invalid_include_instructions",
            "include_instructions must be True or False.",
        ),
        (
            {"include_instructions": None},
            "invalid_include_instructions",
            "include_instructions must be True or False.",
        ),
    ],
)
async def test_each_option_of_the_wrong_kind_is_refused(
    options: dict[str, Any], reason: str, text: str
) -> None:
    assert identity(await refusal(docs(**options))) == misconfigured(reason, text)


@pytest.mark.parametrize("timeout", [0, -5, 1.5, math.nan, math.inf, -math.inf, True, "30000", None])
async def test_a_request_timeout_that_is_not_a_positive_whole_number_is_refused(timeout: Any) -> None:
    error = await refusal(docs(request_timeout_ms=timeout))
    text = "request_timeout_ms must be a positive whole number of milliseconds."
    assert identity(error) == misconfigured("invalid_timeout", text)


@pytest.mark.parametrize("timeout", [1, 2000.0])
async def test_a_positive_whole_request_timeout_is_accepted_even_as_a_float(timeout: Any) -> None:
    error = await refusal(
        docs(request_timeout_ms=timeout, transport=McpTransport(type="http", url="http://127.0.0.1:9"))
    )
    assert (error.code, error.connection) == ("discovery_failed", "docs")


@pytest.mark.parametrize(
    ("options", "reason", "text"),
    [
        ({"allowlist": "search"}, "invalid_allowlist", "allowlist must be a list of tool names."),
        ({"allowlist": ["search", ""]}, "invalid_allowlist", "allowlist must be a list of tool names."),
        ({"allowlist": ["search", 5]}, "invalid_allowlist", "allowlist must be a list of tool names."),
        ({"allowlist": ["search", "search"]}, "invalid_allowlist", "allowlist names a tool twice."),
        (
            {"aliases": [("search", "find")]},
            "invalid_alias",
            "aliases must map remote tool names to exposed names.",
        ),
        ({"aliases": {"search": "has space"}}, "invalid_alias", f"each alias must be {TOOL_RULE}."),
        ({"aliases": {"search": "find\n"}}, "invalid_alias", f"each alias must be {TOOL_RULE}."),
        ({"aliases": {"search": ""}}, "invalid_alias", f"each alias must be {TOOL_RULE}."),
        ({"aliases": {"search": "x" * 129}}, "invalid_alias", f"each alias must be {TOOL_RULE}."),
        ({"aliases": {"search": 5}}, "invalid_alias", f"each alias must be {TOOL_RULE}."),
        ({"aliases": {5: "find"}}, "invalid_alias", f"each alias must be {TOOL_RULE}."),
        (
            {"allowlist": ["read"], "aliases": {"search": "find"}},
            "alias_outside_allowlist",
            "the alias for 'search' names a tool outside the allowlist.",
        ),
        (
            {"aliases": {"search": "find", "read": "find"}},
            "duplicate_alias",
            "two remote tools share one alias.",
        ),
        (
            {"allowlist": ["has space"]},
            "invalid_tool_name",
            f"the exposed tool name 'docs__has space' is not {TOOL_RULE}.",
        ),
        (
            {"allowlist": ["x" * 123]},
            "invalid_tool_name",
            f"the exposed tool name {'docs__' + 'x' * 123!r} is not {TOOL_RULE}.",
        ),
        (
            {"namespace": "kb", "allowlist": ["x" * 125]},
            "invalid_tool_name",
            f"the exposed tool name {'kb__' + 'x' * 125!r} is not {TOOL_RULE}.",
        ),
    ],
)
async def test_each_unusable_tool_name_rule_is_refused(
    options: dict[str, Any], reason: str, text: str
) -> None:
    assert identity(await refusal(docs(**options))) == misconfigured(reason, text)


@pytest.mark.parametrize(
    "options",
    [
        {"allowlist": []},
        {"allowlist": ("search", "read")},
        {"allowlist": ["x" * 122]},
        {"namespace": "kb", "allowlist": ["x" * 124]},
        {"allowlist": ["search"], "aliases": {"search": "x" * 128}},
        {"aliases": {"search": "find", "read": "open"}},
        {"namespace": "kb", "auth": lambda context: None, "on_error": print, "include_instructions": True},
        {"failure": "optional"},
    ],
)
async def test_definitions_keeping_every_rule_pass_to_discovery(options: dict[str, Any]) -> None:
    """Reaching discovery (a closed port) is how a valid definition shows it passed every check."""
    definition = docs(transport=McpTransport(type="http", url="http://127.0.0.1:9/mcp"), **options)
    if definition.failure == "optional":
        connections = await create_mcp_connections([definition], context=Ctx())
        assert connections.tools == []
        return
    error = await refusal(definition)
    assert (error.code, error.reason) == ("discovery_failed", "connection_failed")


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"failure": "sometimes"}, "invalid_failure"),
        ({"transport": McpTransport(type="http", url="file:///etc")}, "invalid_transport"),
        ({"transport": McpTransport(type="http", url="http://h", headers={"X": "a\nb"})}, "invalid_headers"),
    ],
)
async def test_every_definition_is_checked_before_any_connection_resolves_or_opens(
    bad: dict[str, Any], reason: str
) -> None:
    opened: list[str] = []

    async def transport(context: Ctx) -> McpTransport:
        opened.append("good")
        return HTTP

    good = McpConnectionDefinition[Ctx](name="good", transport=transport)
    error = await refusal(good, docs(**bad))
    assert (error.reason, opened) == (reason, [])


async def test_a_set_cancel_signal_stops_before_anything_resolves() -> None:
    from bastion import AgentCancelledError

    opened: list[str] = []

    async def transport(context: Ctx) -> McpTransport:
        opened.append("docs")
        return HTTP

    cancel = asyncio.Event()
    cancel.set()
    with pytest.raises(AgentCancelledError):
        await create_mcp_connections([docs(transport=transport)], context=Ctx(), cancel=cancel)
    assert opened == []


# Names the definition exposes


def test_a_tool_is_exposed_by_its_alias_or_under_the_namespace_or_connection_name() -> None:
    definition = docs(aliases={"search": "find"})
    assert (definition.exposed_name("search"), definition.exposed_name("read")) == ("find", "docs__read")
    assert docs(namespace="kb").exposed_name("read") == "kb__read"
    assert (docs().prefix, docs(namespace="kb").prefix) == ("docs", "kb")


def test_a_definition_has_safe_defaults_and_hides_its_transport_in_a_repr() -> None:
    definition = docs()
    assert (definition.failure, definition.request_timeout_ms, definition.include_instructions) == (
        "required",
        DEFAULT_REQUEST_TIMEOUT_MS,
        False,
    )
    assert DEFAULT_REQUEST_TIMEOUT_MS == 30_000
    assert (definition.auth, definition.allowlist, dict(definition.aliases), definition.namespace) == (
        None,
        None,
        {},
        None,
    )
    secret = McpTransport(type="http", url="https://host/secret-path", headers={"Authorization": "Bearer s3"})
    assert "secret-path" not in repr(secret) and "s3" not in repr(secret)
    assert secret.headers == {"Authorization": "Bearer s3"} and HTTP.headers == {}


# The transport resolved from the context at each open


async def test_the_transport_and_auth_are_resolved_from_the_context_and_their_headers_merged() -> None:
    seen: list[Ctx] = []

    async def transport(context: Ctx) -> McpTransport:
        seen.append(context)
        return McpTransport(type="sse", url="https://host/mcp", headers={"A": "1", "X": "transport"})

    async def auth(context: Ctx) -> dict[str, str]:
        seen.append(context)
        return {"X": f"user {context.user_id}", "B": "2"}

    context = Ctx(user_id="bob")
    resolved = await resolve_transport(docs(transport=transport, auth=auth), context)
    assert (resolved.type, resolved.url, dict(resolved.headers)) == (
        "sse",
        "https://host/mcp",
        {"A": "1", "X": "user bob", "B": "2"},
    )
    assert seen == [context, context]
    plain = await resolve_transport(
        docs(transport=McpTransport(type="http", url="http://h", headers={"A": "1"})), context
    )
    assert (plain.type, plain.url, dict(plain.headers)) == ("http", "http://h", {"A": "1"})


@pytest.mark.parametrize(
    ("resolved", "reason", "text"),
    [
        ("http://127.0.0.1:9/mcp", "invalid_transport", "the transport must be an McpTransport."),
        (
            McpTransport(type="ws", url="http://h"),
            "invalid_transport",
            "the transport type must be 'http' or 'sse'.",
        ),  # type: ignore[arg-type]
        (
            McpTransport(type="http", url="mailto:x"),
            "invalid_transport",
            "the transport URL must be an http or https URL.",
        ),
        (
            McpTransport(type="http", url="http://h", headers={"X": "a\nb"}),
            "invalid_headers",
            "headers must be a mapping of strings.",
        ),
    ],
)
async def test_an_unusable_resolved_transport_fails_even_an_optional_connection(
    resolved: Any, reason: str, text: str
) -> None:
    async def transport(context: Ctx) -> Any:
        return resolved

    error = await refusal(docs(transport=transport, failure="optional"))
    assert identity(error) == misconfigured(reason, text)


@pytest.mark.parametrize("headers", [None, [("X", "y")], {"X": "a\rb"}, {"X": 1}])
async def test_unusable_auth_headers_fail_even_an_optional_connection(headers: Any) -> None:
    async def auth(context: Ctx) -> Any:
        return headers

    error = await refusal(docs(auth=auth, failure="optional"))
    assert identity(error) == misconfigured("invalid_headers", "headers must be a mapping of strings.")


@pytest.mark.parametrize(
    ("raised", "reason", "message"),
    [
        (
            ConnectionAuthorizationRequiredError("docs"),
            "credential_missing",
            "The docs connection needs authorization. Reconnect it and try again.",
        ),
        (
            ConnectionAuthorizationFailedError("docs"),
            "credential_refused",
            "The credentials for the docs connection were refused. Reconnect it and try again.",
        ),
    ],
)
@pytest.mark.parametrize("where", ["transport", "auth"])
async def test_a_missing_or_refused_credential_needs_authorization_even_for_an_optional_connection(
    raised: Exception, reason: str, message: str, where: str
) -> None:
    async def failing(context: Ctx) -> Any:
        raise raised

    error = await refusal(docs(failure="optional", **{where: failing}))
    assert identity(error) == ("authorization_required", reason, "docs", None, message)
    assert error.__suppress_context__


async def test_a_failing_resolver_is_discovery_failed_logged_and_reveals_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def transport(context: Ctx) -> McpTransport:
        raise OSError("vault at 10.0.0.7 is down")

    with caplog.at_level(logging.WARNING, "bastion.mcp"):
        error = await refusal(docs(transport=transport))
    assert identity(error) == (
        "discovery_failed",
        "connection_failed",
        "docs",
        None,
        "The docs connection is unavailable.",
    )
    assert error.__suppress_context__ and "10.0.0.7" not in repr(error)
    [record] = [item for item in caplog.records if item.name == "bastion.mcp"]
    assert record.getMessage() == "Resolving the transport of the docs connection failed."
    assert record.exc_info is not None and isinstance(record.exc_info[1], OSError)


# What an optional connection that fails tells on_error


async def test_an_optional_connection_that_fails_is_left_out_and_reported_to_a_plain_function() -> None:
    reports: list[McpConnectionError] = []

    async def transport(context: Ctx) -> McpTransport:
        raise OSError("down")

    connections = await create_mcp_connections(
        [docs(transport=transport, failure="optional", on_error=reports.append)], context=Ctx()
    )
    assert (connections.tools, connections.instructions) == ([], None)
    assert [identity(item) for item in reports] == [
        ("discovery_failed", "connection_failed", "docs", None, "The docs connection is unavailable.")
    ]


async def test_an_async_on_error_is_awaited_and_a_failing_one_is_logged_without_changing_the_outcome(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[str] = []

    async def transport(context: Ctx) -> McpTransport:
        raise OSError("down")

    async def listening(error: McpConnectionError) -> None:
        await asyncio.sleep(0)
        heard.append(error.reason)

    def broken(error: McpConnectionError) -> None:
        raise RuntimeError("the reporter is broken")

    one = McpConnectionDefinition[Ctx](
        name="one", transport=transport, failure="optional", on_error=listening
    )
    two = McpConnectionDefinition[Ctx](name="two", transport=transport, failure="optional", on_error=broken)
    with caplog.at_level(logging.WARNING, "bastion.mcp"):
        connections = await create_mcp_connections([one, two], context=Ctx())
    assert (connections.tools, heard) == ([], ["connection_failed"])
    [record] = [item for item in caplog.records if "on_error" in item.getMessage()]
    assert record.getMessage() == "The on_error hook of the two connection failed."
    assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)


# Messages


@pytest.mark.parametrize(
    ("code", "reason", "connection", "tool", "message"),
    [
        ("configuration_error", "invalid_name", None, None, "An MCP connection is misconfigured."),
        ("configuration_error", "invalid_name", "docs", None, "The docs connection is misconfigured."),
        (
            "authorization_required",
            "credential_refused",
            "docs",
            None,
            "The credentials for the docs connection were refused. Reconnect it and try again.",
        ),
        (
            "authorization_required",
            "credential_refused",
            None,
            None,
            "The credentials for an MCP connection were refused. Reconnect it and try again.",
        ),
        (
            "authorization_required",
            "unauthorized",
            None,
            None,
            "An MCP connection needs authorization. Reconnect it and try again.",
        ),
        ("cleanup_failed", "timeout", "docs", None, "The docs connection did not close cleanly."),
        (
            "execution_failed",
            "tool_error",
            "docs",
            "docs__x",
            "The tool docs__x on the docs connection reported an error.",
        ),
        ("execution_failed", "closed", "docs", "docs__x", "The docs connection is closed."),
        (
            "execution_failed",
            "timeout",
            "docs",
            "docs__x",
            "The tool docs__x on the docs connection did not answer in time.",
        ),
        (
            "execution_failed",
            "request_failed",
            "docs",
            "docs__x",
            "The tool docs__x failed on the docs connection.",
        ),
        ("discovery_failed", "timeout", None, None, "An MCP connection did not answer in time."),
        ("discovery_failed", "timeout", "docs", None, "The docs connection did not answer in time."),
        ("discovery_failed", "connection_failed", "docs", None, "The docs connection is unavailable."),
        ("discovery_failed", "connection_failed", "GitHub", None, "The GitHub connection is unavailable."),
        ("discovery_failed", "connection_failed", "", None, "An MCP connection is unavailable."),
    ],
)
def test_each_error_says_what_failed_in_names_the_application_chose(
    code: Any, reason: Any, connection: str | None, tool: str | None, message: str
) -> None:
    error = McpConnectionError(code, reason=reason, connection=connection, tool=tool)
    assert identity(error) == (code, reason, connection, tool, message)
    assert repr(error) == (
        f"McpConnectionError(code={code!r}, reason={reason!r}, connection={connection!r}, tool={tool!r})"
    )


def test_a_configuration_error_with_a_detail_says_what_to_fix() -> None:
    error = McpConnectionError(
        "configuration_error", reason="invalid_name", connection=None, detail="the name is empty."
    )
    assert str(error) == "MCP configuration error: the name is empty."
    assert str(McpConnectionError("discovery_failed", reason="timeout", connection="docs", detail="x")) == (
        "The docs connection did not answer in time."
    )


# Results


def test_structured_content_is_the_output_of_a_successful_call() -> None:
    result = mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text="ignored")], structured_content={"hits": [1]}
    )
    assert tool_output(result) == {"hits": [1]}


def test_without_structured_content_the_output_is_the_content_items_as_protocol_json() -> None:
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(type="text", text="hello", meta={"k": "v"}),
            mcp_types.ImageContent(type="image", data="aGk=", mime_type="image/png"),
        ]
    )
    assert tool_output(result) == {
        "content": [
            {"type": "text", "text": "hello", "_meta": {"k": "v"}},
            {"type": "image", "data": "aGk=", "mimeType": "image/png"},
        ]
    }


def test_an_is_error_result_keeps_its_content_says_so_and_keeps_structured_content() -> None:
    text = mcp_types.TextContent(type="text", text="offline")
    assert tool_output(mcp_types.CallToolResult(content=[text], is_error=True)) == {
        "content": [{"type": "text", "text": "offline"}],
        "isError": True,
    }
    flagged = mcp_types.CallToolResult(content=[text], is_error=True, structured_content={"why": "down"})
    assert tool_output(flagged) == {
        "content": [{"type": "text", "text": "offline"}],
        "isError": True,
        "structuredContent": {"why": "down"},
    }


# Tools built from a listing, and the client's request path without a server


def remote(name: str, **fields: Any) -> mcp_types.Tool:
    return mcp_types.Tool(name=name, input_schema={"type": "object", "properties": {}}, **fields)


def listing(definition: McpConnectionDefinition[Ctx], *tools: mcp_types.Tool) -> Discovered:
    return Discovered(client=McpClient(definition), remote_tools=list(tools), instructions=None)


def test_listed_tools_are_exposed_under_their_names_with_their_description_and_schema() -> None:
    definition = docs(aliases={"search": "find"})
    tools = build_tools(
        [
            listing(
                definition,
                remote("search", description="Search the docs.", title="Search"),
                remote("read", title="Read a page"),
                remote("plain"),
            )
        ]
    )
    shown = [(item.name, item.description, item.input_schema, item.dynamic) for item in tools]
    schema = {"type": "object", "properties": {}}
    assert shown == [
        ("find", "Search the docs.", schema, True),
        ("docs__read", "Read a page", schema, True),
        ("docs__plain", "", schema, True),
    ]


def test_an_allowlist_exposes_only_the_tools_it_names() -> None:
    tools = build_tools([listing(docs(allowlist=["read"]), remote("search"), remote("read"))])
    assert [item.name for item in tools] == ["docs__read"]
    everything = build_tools([listing(docs(), remote("search"), remote("read"))])
    assert [item.name for item in everything] == ["docs__search", "docs__read"]


def test_a_name_offered_twice_at_discovery_is_refused_naming_both_connections() -> None:
    first = McpConnectionDefinition[Ctx](name="two", transport=HTTP, namespace="kb")
    second = McpConnectionDefinition[Ctx](name="one", transport=HTTP, namespace="kb")
    with pytest.raises(McpConnectionError) as raised:
        build_tools([listing(first, remote("search")), listing(second, remote("search"))])
    assert identity(raised.value) == (
        "configuration_error",
        "duplicate_tool_name",
        "one",
        "kb__search",
        "MCP configuration error: the tool name 'kb__search' is offered by 'two' and 'one'.",
    )


async def test_a_tool_of_a_client_that_never_connected_fails_as_closed_and_is_reported() -> None:
    reports: list[McpConnectionError] = []
    [item] = build_tools([listing(docs(on_error=reports.append), remote("search"))])
    assert item.execute is not None
    with pytest.raises(McpConnectionError) as raised:
        await item.execute(ToolCall(tool_name=item.name, input={}, tool_call_id="call-1"))
    closed = ("execution_failed", "closed", "docs", "docs__search", "The docs connection is closed.")
    assert identity(raised.value) == closed
    assert [identity(error) for error in reports] == [closed]


async def answer(value: Any) -> Any:
    await asyncio.sleep(0)
    return value


async def fail(error: BaseException) -> Any:
    await asyncio.sleep(0)
    raise error


@pytest.mark.parametrize(
    ("error", "stage", "expected"),
    [
        (RuntimeError("boom"), "call", ("execution_failed", "request_failed")),
        (RuntimeError("boom"), "connect", ("discovery_failed", "connection_failed")),
        (httpx2.ReadTimeout("slow"), "call", ("execution_failed", "timeout")),
        (httpx2.ReadTimeout("slow"), "connect", ("discovery_failed", "timeout")),
        (httpx2.ConnectError("refused"), "call", ("execution_failed", "connection_failed")),
        (MCPError(mcp_types.CONNECTION_CLOSED, "closed"), "call", ("execution_failed", "connection_failed")),
        (MCPError(mcp_types.INTERNAL_ERROR, "bad"), "call", ("execution_failed", "request_failed")),
        (asyncio.CancelledError(), "call", ("execution_failed", "connection_failed")),
    ],
)
async def test_a_failed_request_is_classified_logged_and_raised_without_its_cause(
    error: BaseException, stage: Any, expected: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    client = McpClient(docs())
    with caplog.at_level(logging.WARNING, "bastion.mcp"), pytest.raises(McpConnectionError) as raised:
        await client.request(fail(error), stage=stage, tool="docs__x" if stage == "call" else None)
    assert (raised.value.code, raised.value.reason, raised.value.connection) == (*expected, "docs")
    assert raised.value.tool == ("docs__x" if stage == "call" else None)
    assert raised.value.__cause__ is None
    if not isinstance(error, asyncio.CancelledError):
        assert raised.value.__suppress_context__
        [record] = caplog.records
        assert record.getMessage() == "A request to the docs connection failed."
        assert record.exc_info is not None and record.exc_info[1] is error


async def test_an_answered_request_returns_its_result() -> None:
    assert await McpClient(docs()).request(answer({"ok": 1}), stage="call") == {"ok": 1}


@pytest.mark.parametrize("stage", ["connect", "call"])
async def test_a_request_past_its_bound_is_cancelled_and_fails_as_timeout(stage: Any) -> None:
    stopped = asyncio.Event()

    async def hang() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    client = McpClient(docs(request_timeout_ms=20))
    with pytest.raises(McpConnectionError) as raised:
        await client.request(hang(), stage=stage, tool="docs__x")
    code = "discovery_failed" if stage == "connect" else "execution_failed"
    assert (raised.value.code, raised.value.reason, raised.value.tool) == (code, "timeout", "docs__x")
    assert stopped.is_set()


async def test_closing_a_client_that_never_connected_reports_nothing() -> None:
    reports: list[McpConnectionError] = []
    client = McpClient(docs(on_error=reports.append))
    await client.close()
    await client.close()
    assert reports == []


def test_a_listed_tool_whose_name_cannot_be_exposed_is_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "bastion.mcp"):
        tools = build_tools([listing(docs(), remote("has.dot"), remote("search"))])
    assert [item.name for item in tools] == ["docs__search"]
    [record] = caplog.records
    assert (
        record.getMessage() == "Skipping a tool of the docs connection: its name or input schema is unusable."
    )
    assert record.exc_info and isinstance(record.exc_info[1], Exception)


async def test_connections_without_a_cancel_signal_start_no_task() -> None:
    before = asyncio.all_tasks()
    connections = await create_mcp_connections([], context=Ctx())
    assert asyncio.all_tasks() == before
    await connections.close()


# The request path's decisions, each outcome produced by a request that plays it


@pytest.mark.parametrize("stage", ["connect", "call"])
async def test_a_request_the_transports_end_interrupts_fails_as_connection_failed(stage: Any) -> None:
    client = McpClient(docs())

    async def transport_ends() -> None:
        client._ended.set()  # what the owner task does when the transport exits
        await asyncio.Event().wait()

    with pytest.raises(McpConnectionError) as raised:
        await client.request(transport_ends(), stage=stage)
    code = "discovery_failed" if stage == "connect" else "execution_failed"
    assert (raised.value.code, raised.value.reason) == (code, "connection_failed")


@pytest.mark.parametrize("stage", ["connect", "call"])
@pytest.mark.parametrize("then", ["hangs", "fails"])
async def test_a_credential_refused_during_a_request_needs_authorization(stage: Any, then: str) -> None:
    client = McpClient(docs())

    async def refused() -> None:
        flow = client._recorder.async_auth_flow(httpx2.Request("POST", "http://h/mcp"))
        await flow.__anext__()
        with pytest.raises(StopAsyncIteration):
            await flow.asend(httpx2.Response(401))
        if then == "fails":
            raise RuntimeError("the SDK's generic error for a 401")
        await asyncio.Event().wait()

    with pytest.raises(McpConnectionError) as raised:
        await client.request(refused(), stage=stage, tool="docs__x")
    assert identity(raised.value)[:4] == ("authorization_required", "unauthorized", "docs", "docs__x")


@pytest.mark.parametrize("status", [200, 404, 500])
async def test_other_statuses_are_not_a_refused_credential(status: int) -> None:
    client = McpClient(docs())

    async def answered() -> str:
        flow = client._recorder.async_auth_flow(httpx2.Request("POST", "http://h/mcp"))
        await flow.__anext__()
        with pytest.raises(StopAsyncIteration):
            await flow.asend(httpx2.Response(status))
        return "answered"

    assert await client.request(answered(), stage="call") == "answered"


@pytest.mark.parametrize("stage", ["connect", "call"])
async def test_after_a_refused_credential_no_further_request_is_sent(stage: Any) -> None:
    client = McpClient(docs())

    async def refuse() -> None:
        flow = client._recorder.async_auth_flow(httpx2.Request("POST", "http://h/mcp"))
        await flow.__anext__()
        with pytest.raises(StopAsyncIteration):
            await flow.asend(httpx2.Response(403))

    await client.request(refuse(), stage="call")
    sent: list[str] = []

    async def second() -> None:
        sent.append("second")

    work = second()
    with pytest.raises(McpConnectionError) as raised:
        await client.request(work, stage=stage, tool="docs__x")
    assert identity(raised.value)[:4] == ("authorization_required", "unauthorized", "docs", "docs__x")
    assert sent == []
    assert work.cr_frame is None  # closed, never started
