"""bastion, full stack: token verification, claim, stream, save, and the tool operation through its claim.

The route is the reference assistant's chat turn (`bastion.assistant.app.AssistantApp.chat`) on the
bench's script: the worker verifies the ES256 token, `start_agent_run` claims the turn and reconciles
the browser's messages with the stored conversation (one transaction, two round trips), `lookup` runs
through `run.execute_tool` (claimed before it runs, one round trip), and `run.finish` saves the
response message and releases the claim (one round trip) before the `finish` chunk.

New conversations are created in the request path, as the assistant does: a conversation's first
message creates it for the caller, then the turn is claimed. That first turn pays one more round trip
than a later one; both are in the timed part.

Postgres is reached as `bastion_app`, a login role without BYPASSRLS that is a member of
`authenticated` and `bastion_runtime`, so row-level security and the turn functions' own checks run as
in production. The server process migrates its database and creates that role at startup, as owner.

The load client sends the whole history every turn, as `useChat` does, with each assistant message
assembled from the stream the way the AI SDK client assembles it (bastion's assembler mirrors it), so
the store's reconciliation sees exactly what a browser would send back.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from bastion import Tool, define_agent, start_agent_run, tool
from bastion._ui_assembly import UIMessageAssembler
from bastion.auth import Principal, SupabaseEnv
from bastion.chat.stream_response import StreamStatus, create_agent_stream_response
from bastion.stores import (
    InvalidInputError,
    PostgresAgentPersistence,
    PostgresStore,
    StoreIdentity,
    TurnContext,
    apply_migrations,
)
from bastion.worker import RequestContext, Route, create_agent_worker
from bench.client import HttpRequest, HttpResponse
from bench.protocol import (
    CHAT_PATH,
    LOOKUP,
    ExpectedTool,
    VerifiedTurn,
    chat_request,
    sse_events,
    verify_turn,
)
from bench.script import lookup_result
from bench.systems import ClientConfig, ServerConfig
from bench.systems._pydantic_ai_model import scripted_model

ROLE = "subject"
NEEDS_POSTGRES = True
POOL_SIZE = 16
APP_ROLE = "bastion_app"
_CREATE_APP_ROLE = (
    "do $$ begin "
    f"if not exists (select 1 from pg_roles where rolname = '{APP_ROLE}') then "
    f"create role {APP_ROLE} login nobypassrls; "
    f"grant authenticated, bastion_runtime to {APP_ROLE}; "
    "end if; end $$"
)


def _tools(principal: Principal) -> list[Tool]:
    @tool
    async def lookup(key: str) -> dict[str, Any]:
        """Look a key up."""
        return lookup_result(key)

    return [lookup]


def bench_agent(*, max_steps: int | None = None) -> Any:
    """The agent every bastion variant runs: one tool, `lookup`."""
    if max_steps is None:
        return define_agent(name="bench", instructions="Answer.", tools=_tools)
    return define_agent(name="bench", instructions="Answer.", tools=_tools, max_steps=max_steps)


async def prepare_database(admin_url: str) -> str:
    """Migrate `admin_url`'s database and make sure the application role exists; its connection URL."""
    await apply_migrations(admin_url)
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as connection:
        await connection.execute(_CREATE_APP_ROLE)
    return make_conninfo(admin_url, user=APP_ROLE)


@dataclass
class ChatTurns:
    """The chat route's state: the store (as the application role), its persistence, agent and model."""

    store: PostgresStore
    persistence: PostgresAgentPersistence
    agent: Any
    model: Any

    async def claim(self, principal: Principal, chat_id: str, messages: list[Any], trigger: str) -> Any:
        """Claim the turn; a conversation's first message creates it first (the assistant's path), so
        that turn costs one insert more."""
        identity = StoreIdentity.from_principal(principal)
        turn = TurnContext(identity=identity, conversation_id=chat_id, request_id=str(uuid.uuid4()))
        if len(messages) == 1:
            with suppress(InvalidInputError):
                await self.store.create_conversation(identity, conversation_id=chat_id)
        return await start_agent_run(
            persistence=self.persistence, context=turn, messages=messages, trigger=trigger
        )

    async def chat(self, request: Request, context: RequestContext) -> Response:
        assert context.principal is not None
        body = json.loads(await request.body())
        chat_id = str(uuid.UUID(body["id"]))
        run = await self.claim(
            context.principal, chat_id, body["messages"], body.get("trigger", "submit-message")
        )
        session = None
        try:
            session = await self.agent.prepare(
                context=context.principal, cancel=context.cancel, execute_tool=run.execute_tool
            )
            result = await session.stream(model=self.model, messages=run.messages)
        except BaseException:
            if session is not None:
                await session.close()
            await run.finish(status="failed")
            raise

        async def on_finish(*, response_message: dict[str, Any], status: StreamStatus) -> None:
            await run.finish(response_message=response_message, status=status)

        async def on_settled(*, status: StreamStatus) -> None:
            try:
                await run.finish(status=status)
            finally:
                await session.close()

        return create_agent_stream_response(
            result, original_messages=run.messages, on_finish=on_finish, on_settled=on_settled
        )


async def open_turns(admin_url: str, *, pool_size: int = POOL_SIZE) -> ChatTurns:
    """Prepare the database and open the store as the application role."""
    app_url = await prepare_database(admin_url)
    store = await PostgresStore.open(app_url, min_size=pool_size, max_size=pool_size)
    return ChatTurns(
        store=store, persistence=store.persistence(), agent=bench_agent(), model=scripted_model()
    )


def create_app(config: ServerConfig) -> Starlette:
    assert config.database_url is not None, "bastion needs a database"
    admin_url = config.database_url
    opened: list[ChatTurns] = []

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        opened.append(await open_turns(admin_url))
        try:
            yield
        finally:
            await opened[0].store.close()

    async def chat(request: Request, context: RequestContext) -> Response:
        return await opened[0].chat(request, context)

    env = SupabaseEnv(url=config.supabase_url, jwks=config.jwks)
    return create_agent_worker(
        env=env,
        routes=[Route(method="POST", path=CHAT_PATH, auth="user", handler=chat)],
        lifespan=lifespan,
    )


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    return chat_request(chat_id, messages, headers={"authorization": f"Bearer {client.bearer_token}"})


def verify_stream(response: HttpResponse, *, words: int, tool: ExpectedTool = LOOKUP) -> VerifiedTurn:
    """The shared verification, then the assistant message as the AI SDK client assembles it."""
    verified = verify_turn(response, words=words, tool=tool)
    return VerifiedTurn(message=assembled_message(response.body), deltas=verified.deltas)


def assembled_message(body: bytes) -> dict[str, Any]:
    """The assistant message `useChat` holds after reading this (already verified) event stream,
    with the metadata the `start` and `finish` chunks carry merged in, as the client merges it."""
    chunks = [json.loads(event) for event in sse_events(body)[:-1]]
    assembler = UIMessageAssembler({"id": chunks[0]["messageId"], "role": "assistant", "parts": []})
    assembler.apply_metadata(chunks[0].get("messageMetadata"))
    for chunk in chunks[1:]:
        if chunk["type"] == "finish":
            assembler.apply_metadata(chunk.get("messageMetadata"))
        elif chunk["type"] not in ("abort", "error"):
            assembler.apply(chunk)
    return assembler.assembled_message()
