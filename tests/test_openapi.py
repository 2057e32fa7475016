"""The assistant's OpenAPI document, and schemathesis against the live assistant: real HTTP through
uvicorn, Postgres, a signed-in user and real conversation and message ids, bounded examples per route.

Every response must be documented (its status, its content type, its body's schema, an error's code),
no response is a server error, and a request the document says is invalid is refused.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.pg import PostgresCluster
from tests.test_assistant import serve_assistant, user_message

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# Examples per operation and generation mode: bounded so the whole run stays well under a minute. The
# chat turn is documented twice, under /v1 and where the AI SDK expects it: one handler, fewer each.
CHAT_PATHS = ("/v1/chat", "/api/chat")
EXAMPLES = {"POST /v1/chat": 14, "POST /api/chat": 8}
DEFAULT_EXAMPLES = 6


@dataclass(frozen=True)
class LiveAssistant:
    url: str
    headers: dict[str, str]
    document: dict[str, Any]
    conversation: str
    foreign_conversation: str
    message_ids: tuple[str, ...]


@pytest.fixture(scope="module")
def live(pg_cluster: PostgresCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveAssistant]:
    """The assistant served in its own thread and event loop, so a blocking client can drive it."""
    started = threading.Event()
    state: dict[str, Any] = {}

    async def serve() -> None:
        async with serve_assistant(pg_cluster, tmp_path_factory.mktemp("openapi")) as served:
            state["url"], state["loop"], state["stop"] = (
                served.url,
                asyncio.get_running_loop(),
                asyncio.Event(),
            )
            started.set()
            await state["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert started.wait(60), "the assistant did not start"
    url = state["url"]
    try:
        with requests.Session() as http:
            ada, bob = (_sign_in(http, url, user) for user in ("ada", "bob"))
            conversation, foreign = str(uuid.uuid4()), str(uuid.uuid4())
            for headers, conversation_id in ((ada, conversation), (bob, foreign)):
                body = {
                    "id": conversation_id,
                    "messages": [user_message("hello")],
                    "trigger": "submit-message",
                }
                assert http.post(f"{url}/v1/chat", json=body, headers=headers).status_code == 200
            messages = http.get(f"{url}/v1/conversations/{conversation}/messages", headers=ada).json()
            document = http.get(f"{url}/v1/openapi.json").json()
        yield LiveAssistant(
            url=url,
            headers=ada,
            document=document,
            conversation=conversation,
            foreign_conversation=foreign,
            message_ids=tuple(message["id"] for message in messages["messages"]),
        )
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)


def _sign_in(http: requests.Session, url: str, user: str) -> dict[str, str]:
    token = http.post(f"{url}/auth/dev/token", json={"user": user}).json()["access_token"]
    return {"Authorization": f"Bearer {token}"}


def test_every_route_is_documented_with_its_bodies_queries_and_errors(live: LiveAssistant) -> None:
    paths = live.document["paths"]
    schemas = live.document["components"]["schemas"]
    for path in CHAT_PATHS:
        chat = paths[path]["post"]
        assert chat["requestBody"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ChatRequest"
        }
        assert {"200", "400", "401", "404", "409", "413", "503"} <= chat["responses"].keys()
        assert "text/event-stream" in chat["responses"]["200"]["content"]
    assert schemas["ChatRequest"]["required"] == ["id", "messages"]
    events = paths["/v1/conversations/{conversation_id}/events"]["get"]
    query = {
        parameter["name"]: parameter["schema"]
        for parameter in events["parameters"]
        if parameter["in"] == "query"
    }
    assert query["after"]["minimum"] == 0 and query["limit"]["maximum"] == 100
    assert schemas["NewConversation"]["properties"]["title"]["anyOf"][0]["maxLength"] == 500
    assert "invalid_input" in schemas["Error400"]["properties"]["code"]["enum"]
    assert "invalid_claims" in schemas["Error401"]["properties"]["code"]["enum"]
    assert {"history_conflict", "turn_conflict"} <= set(schemas["Error409"]["properties"]["code"]["enum"])
    for path, methods in paths.items():
        for method, operation in methods.items():
            assert (
                "200" in operation["responses"]
                or "201" in operation["responses"]
                or "204" in operation["responses"]
            ), (method, path)
            if operation["security"]:
                assert "401" in operation["responses"], (method, path)
            for response in operation["responses"].values():
                assert response["headers"]["X-Bastion-Api-Version"]["schema"] == {
                    "type": "string",
                    "const": "1",
                }
            assert not path.startswith("/api/") or path.startswith("/api/chat"), path


def test_schemathesis_finds_no_server_error_and_no_response_outside_the_document(live: LiveAssistant) -> None:
    # Unknown query parameters are ignored, not refused, and the token is the fixture's own: neither is
    # generated, so a request the document calls invalid is one whose declared parts are invalid.
    config = schemathesis.Config.from_dict(
        {"generation": {"allow-extra-parameters": False, "with-security-parameters": False}}
    )
    schema = schemathesis.openapi.from_dict(live.document, config=config)
    operations = sorted(
        (result.ok() for result in schema.get_all_operations()),
        key=lambda operation: (
            operation.method.upper() == "DELETE"
        ),  # deleting the fixture's conversation last
    )
    ids = [live.conversation, live.foreign_conversation, str(uuid.uuid4()), "not-a-uuid"]
    failures: list[str] = []
    with requests.Session() as session:
        for operation in operations:
            label = f"{operation.method.upper()} {operation.path}"
            for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
                strategy = _cases(operation, mode, ids, live)

                @hypothesis.settings(
                    max_examples=EXAMPLES.get(label, DEFAULT_EXAMPLES),
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(hypothesis.HealthCheck),
                    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                )
                @hypothesis.given(case=strategy)
                def exercise(case: schemathesis.Case) -> None:
                    case.call_and_validate(
                        base_url=live.url, session=session, headers=live.headers, checks=CHECKS
                    )

                try:
                    exercise()
                except hypothesis.errors.Unsatisfiable:
                    assert mode == schemathesis.GenerationMode.NEGATIVE  # nothing to get wrong: no input
                except Exception as error:  # one report for every operation, not just the first failing
                    failures.append(f"{label} ({mode.value}): {error}")
    assert not failures, "\n\n".join(failures)


def _cases(operation: Any, mode: Any, ids: list[str], live: LiveAssistant) -> Any:
    """Generated cases, on real conversation ids where the path takes one, feedback on real messages and
    turns that can run: a new user message in a new conversation or the fixture's."""
    positive = mode == schemathesis.GenerationMode.POSITIVE
    if operation.path in CHAT_PATHS and positive:
        turn = st.fixed_dictionaries(
            {
                "id": st.sampled_from([live.conversation, str(uuid.uuid4())]),
                "trigger": st.just("submit-message"),
                "messages": st.tuples(
                    st.fixed_dictionaries(
                        {
                            "id": st.uuids().map(str),
                            "role": st.just("user"),
                            "parts": st.lists(
                                st.fixed_dictionaries(
                                    {"type": st.just("text"), "text": st.text(max_size=30)}
                                ),
                                min_size=1,
                                max_size=2,
                            ),
                        }
                    )
                ).map(list),
            }
        ).flatmap(lambda body: operation.as_strategy(generation_mode=mode, body=body))
        return st.one_of(operation.as_strategy(generation_mode=mode), turn)
    if "{conversation_id}" not in operation.path:
        return operation.as_strategy(generation_mode=mode)
    cases = st.sampled_from(ids).flatmap(
        lambda conversation: operation.as_strategy(
            generation_mode=mode, path_parameters={"conversation_id": conversation}
        )
    )
    if operation.path.endswith("/feedback") and positive:
        rated = st.fixed_dictionaries(
            {"message_id": st.sampled_from(live.message_ids), "rating": st.sampled_from(["up", "down"])},
            optional={"comment": st.one_of(st.none(), st.text(max_size=20))},
        ).flatmap(
            lambda body: operation.as_strategy(
                generation_mode=mode, path_parameters={"conversation_id": live.conversation}, body=body
            )
        )
        cases = st.one_of(cases, rated)
    return cases
