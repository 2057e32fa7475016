"""The chat tables' SQL conversion (`bastion.canonical_parts`, `bastion.chat_id_of`, migration 0003)
gives what the Python one (`bastion.hooks.canonical_parts`, `chat_id_of`) gives: on every branch and
edge of a generated corpus, on generated parts, and on many conversation ids."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import hypothesis
import psycopg
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from bastion.hooks import canonical_parts, chat_id_of
from tests.hooks_db import HooksDatabase
from tests.test_hooks_sessions import UI_MESSAGE

# The messages whose SQL conversion differs from Python's: each with both conversions. jsonb
# compares content (not key order) and tells `true` from `1` and a JSON null from a missing key.
_DIFFERENCES = """
select m.ord, bastion.canonical_parts(m.pair -> 0), m.pair -> 1
  from jsonb_array_elements(%s) with ordinality as m (pair, ord)
 where bastion.canonical_parts(m.pair -> 0) is distinct from m.pair -> 1
"""

_METADATA: list[dict[str, Any]] = [
    {},
    {"providerMetadata": {"p": {"cache": 1}}},
    {"providerMetadata": None},
    {"providerMetadata": "not an object"},
    {"providerMetadata": [1]},
    {"callProviderMetadata": {"c": {"id": "x"}}},
    {"callProviderMetadata": "no"},
    {"providerMetadata": None, "callProviderMetadata": {"c": 1}},
    {"providerMetadata": {"p": 1}, "callProviderMetadata": {"c": 1}},
]
_ODD_VALUES: list[Any] = [None, 1, 0, True, False, "", [], {}, ["a"], {"k": "v"}, 1.5]


def corpus() -> Iterator[Any]:
    """Parts taking every branch of the conversion, with each field present, missing, null or of
    another type."""
    yield from _ODD_VALUES  # parts that are no object
    for kind in (None, 1, True, ["text"], {"t": 1}):
        yield {"type": kind, "text": "x"}
    yield {"text": "no type"}
    for kind, text, state, extra in itertools.product(
        ("text", "reasoning"),
        ("hello", "", None, 3),
        ("streaming", "done", "other", None, 1, "MISSING"),
        _METADATA,
    ):
        part: dict[str, Any] = {"type": kind, **extra}
        if text is not None:
            part["text"] = text
        if state != "MISSING":
            part["state"] = state
        yield part
    for url, media, filename, extra in itertools.product(
        ("data:x", None, 1), ("image/png", None), ("a.png", None, 2, "MISSING"), _METADATA[:6]
    ):
        part = {"type": "file", **extra}
        if url is not None:
            part["url"] = url
        if media is not None:
            part["mediaType"] = media
        if filename != "MISSING":
            part["filename"] = filename
        yield part
    fields = ("url", "title", "mediaType")
    for kind, source_id, present, extra in itertools.product(
        ("source-url", "source-document"), ("s1", None, 7), range(8), _METADATA[:6]
    ):
        part = {"type": kind, **extra}
        if source_id is not None:
            part["sourceId"] = source_id
        for index, key in enumerate(fields):
            if present & (1 << index):
                part[key] = f"{key}-value" if index != 1 or present < 6 else 5
        yield part
    yield {"type": "step-start"}
    yield {"type": "step-start", "providerMetadata": {"p": 1}, "extra": [1]}
    yield from tool_parts()
    for kind, ident, data in itertools.product(
        ("data-weather", "data-x-y", "data-"), ("w1", None, 3, "MISSING"), ({"t": 20}, None, [1], "MISSING")
    ):
        part = {"type": kind}
        if ident != "MISSING":
            part["id"] = ident
        if data != "MISSING":
            part["data"] = data
        yield part
    for kind in (
        "something-new",
        "",
        "data",
        "tool",
        "dynamic",
        "source-url-x",
        "step-end",
        "Text",
        "tëxt-ü",
    ):
        yield {"type": kind, "value": 1, "providerMetadata": {"p": 1}}


def tool_parts() -> Iterator[dict[str, Any]]:
    """Tool parts (`tool-…` and `dynamic-tool`) with and without each of their fields."""
    approvals: list[Any] = [
        "MISSING",
        None,
        "yes",
        {"approved": True},
        {"id": 1, "approved": True},
        {"id": "ap"},
        {"id": "ap", "approved": None},
        {"id": "ap", "approved": True, "reason": "fine"},
        {"id": "ap", "approved": False, "reason": "no"},
        {"id": "ap", "approved": "yes", "reason": 3},
        {"id": "ap", "approved": 1},
        {"id": "ap", "approved": 0},
    ]
    names: list[tuple[str, Any]] = [
        ("tool-search", "MISSING"),
        ("tool-", "MISSING"),
        ("tool-日本", "ignored"),
        ("dynamic-tool", "mcp_x"),
        ("dynamic-tool", "MISSING"),
        ("dynamic-tool", 4),
        ("dynamic-tool", ""),
    ]
    states: list[Any] = [
        "output-available",
        "output-error",
        "output-denied",
        "input-available",
        None,
        1,
        "MISSING",
    ]
    calls: list[Any] = ["c1", None, 2, "MISSING"]
    inputs: list[Any] = [{"q": "a"}, None, "MISSING"]
    executed: list[Any] = [True, False, "true", 1, "MISSING"]
    for (kind, name), call, state in itertools.product(names, calls, states):
        part: dict[str, Any] = {"type": kind, "output": {"hits": 1}, "errorText": "refused"}
        if name != "MISSING":
            part["toolName"] = name
        if call != "MISSING":
            part["toolCallId"] = call
        if state != "MISSING":
            part["state"] = state
        yield part | {"input": {"q": 1}}
        yield part
    for approval, given, provider, extra in itertools.product(approvals, inputs, executed, _METADATA[:6]):
        part = {"type": "tool-delete", "toolCallId": "c3", "state": "output-denied", **extra}
        if approval != "MISSING":
            part["approval"] = approval
        if given != "MISSING":
            part["input"] = given
        if provider != "MISSING":
            part["providerExecuted"] = provider
        yield part
    yield {"type": "tool-x", "toolCallId": "c", "state": "output-available"}  # no output: null
    yield {"type": "tool-x", "toolCallId": "c", "state": "output-error"}  # no errorText: null
    yield {"type": "tool-x", "toolCallId": "c", "state": "output-error", "errorText": {"e": 1}}


def messages() -> Iterator[dict[str, Any]]:
    """The corpus, a part per message and all of it in one; messages whose parts are no list; the
    message of the part-by-part test."""
    parts = list(corpus())
    for part in parts:
        yield {"id": "m", "role": "assistant", "parts": [part]}
    yield {"id": "m", "role": "assistant", "parts": parts}
    for parts_value in (None, "parts", {"type": "text"}, 3, []):
        yield {"id": "m", "parts": parts_value}
    yield {"id": "m"}
    yield UI_MESSAGE


def differences(database: HooksDatabase, tried: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The messages of `tried` whose SQL conversion differs from the Python one."""
    return database.rows(_DIFFERENCES, Jsonb([[message, canonical_parts(message)] for message in tried]))


def test_the_sql_conversion_gives_the_python_one_on_every_branch_and_edge(
    hooks_database: HooksDatabase,
) -> None:
    tried = list(messages())
    assert len(tried) > 1000
    assert differences(hooks_database, tried) == []


def test_the_sql_conversion_gives_the_python_one_on_the_part_by_part_example(
    hooks_database: HooksDatabase,
) -> None:
    assert differences(hooks_database, [UI_MESSAGE]) == []


_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=8)
_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False, allow_infinity=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)
_KINDS = (
    "text",
    "reasoning",
    "file",
    "source-url",
    "source-document",
    "step-start",
    "dynamic-tool",
    "tool-",
    "tool-search",
    "data-",
    "data-x",
    "other",
)
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "text": _text | _json,
    "state": st.sampled_from(["streaming", "done", "output-available", "output-error", "output-denied"])
    | _json,
    "providerMetadata": st.dictionaries(_text, _json, max_size=2) | _json,
    "callProviderMetadata": st.dictionaries(_text, _json, max_size=2) | _json,
    "url": _text | _json,
    "mediaType": _text | _json,
    "filename": _text | _json,
    "sourceId": _text | _json,
    "title": _text | _json,
    "toolName": _text | _json,
    "toolCallId": _text | _json,
    "input": _json,
    "output": _json,
    "errorText": _text | _json,
    "providerExecuted": st.booleans() | _json,
    "approval": st.fixed_dictionaries(
        {},
        optional={
            "id": _text | _json,
            "approved": st.sampled_from([True, False, None, "yes"]),
            "reason": _text | _json,
        },
    )
    | _json,
    "id": _text | _json,
    "data": _json,
}
_part = (
    st.builds(
        lambda kind, fields: {"type": kind, **fields},
        st.sampled_from(_KINDS) | _text | _json,
        st.fixed_dictionaries({}, optional=_FIELDS),
    )
    | _json
)


@hypothesis.settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow],
)
@hypothesis.given(batch=st.lists(st.lists(_part, max_size=6), min_size=1, max_size=25))
def test_the_sql_conversion_gives_the_python_one_on_generated_parts(
    hooks_database: HooksDatabase, batch: list[list[Any]]
) -> None:
    tried = [{"id": "m", "role": "assistant", "parts": parts} for parts in batch]
    assert differences(hooks_database, tried) == []


def test_the_sql_chat_id_is_the_python_one(hooks_database: HooksDatabase) -> None:
    conversations = [str(uuid.uuid4()) for _ in range(500)] + [
        str(uuid.UUID(int=0)),
        str(uuid.UUID(int=2**128 - 1)),
    ]
    with psycopg.connect(hooks_database.admin_dsn) as conn:
        rows = conn.execute(
            "select c::text, bastion.chat_id_of(c)::text from unnest(%s::uuid[]) c", (conversations,)
        ).fetchall()
    assert rows == [(conversation, chat_id_of(conversation)) for conversation in conversations]
