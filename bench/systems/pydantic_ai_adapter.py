"""pydantic-ai's own route: `VercelAIAdapter.dispatch_request` over an `Agent`. No auth, no persistence."""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent
from pydantic_ai.ui.vercel_ai import VercelAIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.client import HttpRequest
from bench.protocol import CHAT_PATH, chat_request, verify_turn
from bench.script import lookup_result
from bench.systems import ClientConfig, ServerConfig
from bench.systems._pydantic_ai_model import scripted_model

ROLE = "peer"
NEEDS_POSTGRES = False


def create_app(config: ServerConfig) -> Starlette:
    agent = Agent(scripted_model(), instructions="Answer.")

    @agent.tool_plain
    async def lookup(key: str) -> dict[str, Any]:
        """Look a key up."""
        return lookup_result(key)

    async def chat(request: Request) -> Response:
        return await VercelAIAdapter.dispatch_request(request, agent=agent, sdk_version=6)

    return Starlette(routes=[Route(CHAT_PATH, chat, methods=["POST"])])


def build_request(chat_id: str, messages: list[dict[str, Any]], client: ClientConfig) -> HttpRequest:
    return chat_request(chat_id, messages)


verify_stream = verify_turn
