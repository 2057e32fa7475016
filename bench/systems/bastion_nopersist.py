"""bastion without persistence: token verification, `define_agent`, `session.stream` and the UI stream.

It verifies the caller's token and runs the turn through bastion's loop and stream encoder, but claims,
saves and stores nothing; the row beside `bastion` (the full stack, `bench.systems.bastion`) shows what
persistence costs.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from bastion import Tool, define_agent, tool
from bastion.auth import Principal, SupabaseEnv
from bastion.chat.stream_response import create_agent_stream_response
from bastion.worker import RequestContext, Route, create_agent_worker
from bench.client import HttpRequest
from bench.protocol import CHAT_PATH, chat_request, verify_turn
from bench.script import lookup_result
from bench.systems import ClientConfig, ServerConfig
from bench.systems._pydantic_ai_model import scripted_model

ROLE = "subject"
NEEDS_POSTGRES = False


def _tools(principal: Principal) -> list[Tool]:
    @tool
    async def lookup(key: str) -> dict[str, Any]:
        """Look a key up."""
        return lookup_result(key)

    return [lookup]


def create_app(config: ServerConfig) -> Starlette:
    agent = define_agent(name="bench", instructions="Answer.", tools=_tools)
    model = scripted_model()

    async def chat(request: Request, context: RequestContext) -> Response:
        assert context.principal is not None
        messages = json.loads(await request.body())["messages"]
        session = await agent.prepare(context=context.principal, cancel=context.cancel)
        result = await session.stream(model=model, messages=messages)

        async def settled(*, status: str) -> None:
            await session.close()

        return create_agent_stream_response(result, original_messages=messages, on_settled=settled)

    env = SupabaseEnv(url=config.supabase_url, jwks=config.jwks)
    return create_agent_worker(
        env=env, routes=[Route(method="POST", path=CHAT_PATH, auth="user", handler=chat)]
    )


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    return chat_request(chat_id, messages, headers={"authorization": f"Bearer {client.bearer_token}"})


verify_stream = verify_turn
